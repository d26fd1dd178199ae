#include "core/watchdog.h"

#include "core/liveness.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <algorithm>

namespace ftcomm {
namespace watchdog {
namespace {

using Clock = std::chrono::steady_clock;

struct Entry {
  Clock::time_point deadline;
  std::string what;
  Action action;
  std::vector<int> fence_members;  // world ranks to fence while this call blocks
  bool fenced = false;             // this call fenced somebody: one grace period on overrun
};

// How often the thread refreshes the heartbeat and looks for stuck peers while a call is guarded.
constexpr auto kTick = std::chrono::milliseconds(200);

// One thread for the whole process, started on first use and never joined: it must outlive
// any call it guards, including MPI_Finalize at interpreter exit.
class Watchdog {
 public:
  static Watchdog& Get() {
    static Watchdog* instance = new Watchdog();  // leaked on purpose, see above
    return *instance;
  }

  uint64_t Arm(double seconds, const std::string& what, Action action,
               const std::vector<int>& fence_members) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t token = next_token_++;
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds));
    entries_[token] = Entry{deadline, what, action, fence_members, false};
    liveness::Beat();
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
      // A guarded call is running: this rank is alive, and its peers may be stuck.
      liveness::Beat();
      for (auto& [token, entry] : entries_) {
        if (!entry.fence_members.empty() &&
            !liveness::FenceSilent(entry.fence_members, liveness::FenceTimeout()).empty()) {
          entry.fenced = true;
        }
      }
      if (Clock::now() < first->second.deadline) {
        cv_.wait_until(lock, std::min(first->second.deadline, Clock::now() + kTick));
        continue;
      }
      if (first->second.fenced) {  // give ULFM time to report the rank we killed
        first->second.fenced = false;
        first->second.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(liveness::kFenceGraceSeconds));
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

uint64_t Arm(double seconds, const std::string& what, Action action,
             const std::vector<int>& fence_members) {
  return Watchdog::Get().Arm(seconds, what, action, fence_members);
}

void Disarm(uint64_t token) { Watchdog::Get().Disarm(token); }

}  // namespace watchdog
}  // namespace ftcomm
