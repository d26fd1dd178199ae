#include "core/watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

namespace ftcomm {
namespace watchdog {
namespace {

using Clock = std::chrono::steady_clock;

struct Entry {
  Clock::time_point deadline;
  std::string what;
  Action action;
};

// One thread for the whole process, started on first use and never joined: it must outlive
// any call it guards, including MPI_Finalize at interpreter exit.
class Watchdog {
 public:
  static Watchdog& Get() {
    static Watchdog* instance = new Watchdog();  // leaked on purpose, see above
    return *instance;
  }

  uint64_t Arm(double seconds, const std::string& what, Action action) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t token = next_token_++;
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds));
    entries_[token] = Entry{deadline, what, action};
    cv_.notify_all();
    return token;
  }

  void Disarm(uint64_t token) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.erase(token);
  }

 private:
  Watchdog() { std::thread([this] { Loop(); }).detach(); }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (entries_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second.deadline < first->second.deadline) first = it;
      }
      if (Clock::now() < first->second.deadline) {
        cv_.wait_until(lock, first->second.deadline);
        continue;
      }
      Fire(first->second);
    }
  }

  static void Fire(const Entry& entry) {
    if (entry.action == Action::kExitClean) {
      std::fprintf(stderr, "ftcomm: %s did not finish in time; exiting this rank\n",
                   entry.what.c_str());
      std::fflush(stderr);
      _exit(0);
    }
    std::fprintf(stderr,
                 "ftcomm: %s overran its deadline; killing this rank (pid %d) so that the "
                 "survivors can shrink past it\n",
                 entry.what.c_str(), static_cast<int>(getpid()));
    std::fflush(stderr);
    kill(getpid(), SIGKILL);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_token_ = 1;
};

}  // namespace

uint64_t Arm(double seconds, const std::string& what, Action action) {
  return Watchdog::Get().Arm(seconds, what, action);
}

void Disarm(uint64_t token) { Watchdog::Get().Disarm(token); }

}  // namespace watchdog
}  // namespace ftcomm
