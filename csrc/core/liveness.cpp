#include "core/liveness.h"

#include "core/mpi_compat.h"
#include "core/settings.h"

#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace ftcomm {
namespace liveness {
namespace {

// One slot per world rank. Written only by its owner (and `state` by a fencer); read by peers on
// the same host. Fields are atomics so that concurrent readers never see torn values. Times are
// CLOCK_MONOTONIC nanoseconds (one clock per host).
struct alignas(64) Slot {
  std::atomic<int64_t> pid;          // 0: not registered
  std::atomic<int64_t> start_time;   // /proc/<pid>/stat field 22: tells a reused pid apart
  std::atomic<uint64_t> host;        // hash of the host name: fence only on this host
  std::atomic<int64_t> beat_ns;      // process heartbeat (the heartbeat thread)
  std::atomic<int64_t> progress_ns;  // last poll inside an ftcomm wait
  std::atomic<int64_t> since_ns;     // when the current activity began (or the last one ended)
  std::atomic<int64_t> step;         // the step of the current (or last) activity, -1 if none
  std::atomic<int32_t> state;        // kRunning, kExiting, kFenced
  std::atomic<int32_t> activity;     // Activity, | kEnded once that call returned
};
static_assert(sizeof(Slot) == 64, "one cache line per rank");
constexpr int32_t kRunning = 1, kExiting = 2, kFenced = 3;
constexpr int32_t kEnded = 0x100;  // activity bit: the call has returned, the rank is outside ftcomm

std::mutex g_mu;
Slot* g_table = nullptr;  // mapped table, nullptr when fencing is off
int g_world_size = 0;
int g_world_rank = -1;
std::set<int> g_killed;  // world ranks this process has fenced
thread_local int g_scope_depth = 0;  // ActivityScope nesting on this thread

double NowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

uint64_t HostHash() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return h | 1;  // never 0, so a zeroed slot matches no host
}

// Start time of a process in clock ticks since boot (field 22 of /proc/<pid>/stat), -1 if the
// process does not exist. Together with the pid it names one process for the life of the host.
int64_t StartTime(int64_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may contain spaces
  if (p == nullptr) return -1;
  long long value = -1;
  // after ")": state(3) ppid(4) ... starttime(22): skip 19 fields
  p += 2;
  for (int field = 3; field < 22 && p != nullptr; ++field) {
    p = std::strchr(p, ' ');
    if (p != nullptr) ++p;
  }
  if (p == nullptr || std::sscanf(p, "%lld", &value) != 1) return -1;
  return value;
}

// The process heartbeat: a thread of its own, so that the heartbeat says only "this process is
// alive and scheduled", whatever its main thread is doing. Started once, never joined (it must
// beat through MPI_Finalize at interpreter exit).
void HeartbeatLoop(Slot* me) {
  const auto period = std::chrono::duration<double>(kHeartbeatSeconds);
  for (;;) {
    me->beat_ns.store(NowNs(), std::memory_order_relaxed);
    std::this_thread::sleep_for(period);
  }
}

Slot* Mine() {
  Slot* table = g_table;
  return table == nullptr ? nullptr : &table[g_world_rank];
}

// A member this process may look at and fence: registered, running, on this host, not itself.
Slot* Peer(int w, uint64_t host) {
  Slot* table = g_table;
  if (table == nullptr || w < 0 || w >= g_world_size || w == g_world_rank) return nullptr;
  Slot& s = table[w];
  if (s.pid.load() <= 0 || s.host.load() != host || s.state.load() != kRunning) return nullptr;
  if (StartTime(s.pid.load()) != s.start_time.load()) return nullptr;  // gone (ULFM sees that itself)
  return &s;
}

// Kills a peer found by Peer; `why` goes to stderr and stays with the slot's state.
bool Fence(int w, Slot& s, const std::string& why) {
  if (g_killed.count(w)) return false;
  g_killed.insert(w);
  s.state.store(kFenced);
  std::fprintf(stderr, "ftcomm: fencing world rank %d (pid %lld): %s; SIGKILL so that ULFM reports it as failed\n",
               w, static_cast<long long>(s.pid.load()), why.c_str());
  std::fflush(stderr);
  kill(static_cast<pid_t>(s.pid.load()), SIGKILL);
  return true;
}

std::string Seconds(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", ns * 1e-9);
  return buf;
}

std::string CallName(int32_t activity, int64_t step) {
  std::string name = ActivityName(static_cast<Activity>(activity & ~kEnded));
  if (step >= 0) name += " step " + std::to_string(step);
  return name;
}

// What a slot says the rank is doing, in words ("outside ftcomm for 3.2 s, last in allreduce
// step 6"; "in barrier for 0.4 s, not polling for 0.3 s").
std::string Doing(const Slot& s, int64_t now) {
  const int32_t activity = s.activity.load();
  const int64_t step = s.step.load();
  const int64_t since = now - s.since_ns.load();
  if (activity == static_cast<int32_t>(Activity::kOutside)) return "outside ftcomm for " + Seconds(since) + ", no ftcomm call yet";
  if (activity & kEnded) return "outside ftcomm for " + Seconds(since) + ", last in " + CallName(activity, step);
  std::string out = "in " + CallName(activity, step) + " for " + Seconds(since);
  const int64_t idle = now - s.progress_ns.load();
  if (idle > static_cast<int64_t>(kStoppedSeconds * 1e9)) out += ", not polling for " + Seconds(idle);
  return out;
}

}  // namespace

const char* ActivityName(Activity activity) {
  switch (activity) {
    case Activity::kOutside: return "no call";
    case Activity::kAllreduce: return "allreduce";
    case Activity::kAgree: return "agree";
    case Activity::kBarrier: return "barrier";
    case Activity::kExchange: return "exchange";
    case Activity::kShrink: return "shrink";
    case Activity::kSplit: return "split";
    case Activity::kDup: return "communicator creation";
    case Activity::kSignal: return "signal";
    case Activity::kValidate: return "input validation";
    case Activity::kFinalize: return "MPI_Finalize";
    case Activity::kAllgather: return "allgather";
  }
  return "an ftcomm call";
}

double FenceTimeout() { return CurrentSettings().fence_timeout_s; }

// A C-level exit (exit(), or returning from main) while MPI is initialised and not finalised
// leaves the job without telling MPI, and Open MPI 5.0.11 does not report such a process as
// failed: its peers would wait for it forever. ftcomm's shutdown finalises MPI before the C exit
// handlers run, so reaching this handler with MPI still up means the rank is leaving mid-job:
// turn that into a death, which ULFM does report.
static void ExitHook() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized || !FtEnabled()) return;
  std::fprintf(stderr, "ftcomm: rank exiting without MPI_Finalize (pid %d); SIGKILL so that the "
               "survivors see a process failure\n", static_cast<int>(getpid()));
  std::fflush(stderr);
  kill(getpid(), SIGKILL);
}

void Register() {
  std::lock_guard<std::mutex> lock(g_mu);
  static bool hooked = (std::atexit(ExitHook), true);
  (void)hooked;
  if (g_table != nullptr) return;
  const std::string dir = CurrentSettings().run_dir;
  if (dir.empty()) return;  // not under ftcomm-run: no fencing
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  mkdir(dir.c_str(), 0700);  // on another node the launcher's temporary directory does not exist
  const std::string path = dir + "/liveness.tbl";
  int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return;
  const size_t bytes = static_cast<size_t>(size) * sizeof(Slot);
  struct stat st;
  if (fstat(fd, &st) != 0 || (static_cast<size_t>(st.st_size) < bytes && ftruncate(fd, bytes) != 0)) {
    close(fd);
    return;
  }
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED) return;
  g_table = static_cast<Slot*>(mem);
  g_world_size = size;
  g_world_rank = rank;
  Slot& me = g_table[rank];
  const int64_t now = NowNs();
  me.beat_ns.store(now);
  me.progress_ns.store(now);
  me.since_ns.store(now);
  me.step.store(-1);
  me.activity.store(static_cast<int32_t>(Activity::kOutside));
  me.host.store(HostHash());
  me.start_time.store(StartTime(getpid()));
  me.state.store(kRunning);
  me.pid.store(getpid());  // last: a peer reads the other fields only once pid is set
  std::thread(HeartbeatLoop, &me).detach();
}

void Beat() {
  Slot* me = Mine();
  if (me != nullptr) me->progress_ns.store(NowNs(), std::memory_order_relaxed);
}

void MarkExiting() {
  Slot* me = Mine();
  if (me != nullptr) me->state.store(kExiting);
}

ActivityScope::ActivityScope(Activity activity, int64_t step) : outermost_(g_scope_depth++ == 0) {
  Slot* me = Mine();
  if (me == nullptr || !outermost_) return;
  const int64_t now = NowNs();
  me->progress_ns.store(now, std::memory_order_relaxed);
  me->since_ns.store(now, std::memory_order_relaxed);
  me->step.store(step, std::memory_order_relaxed);
  me->activity.store(static_cast<int32_t>(activity));
}

ActivityScope::~ActivityScope() {
  --g_scope_depth;
  Slot* me = Mine();
  if (me == nullptr || !outermost_) return;
  me->since_ns.store(NowNs(), std::memory_order_relaxed);
  me->activity.store(me->activity.load() | kEnded);
}

bool Finished(int world_rank) {
  Slot* table = g_table;
  if (table == nullptr || world_rank < 0 || world_rank >= g_world_size) return true;  // unknown
  Slot& s = table[world_rank];
  const int64_t pid = s.pid.load();
  if (pid <= 0 || s.host.load() != HostHash()) return true;  // not registered, or elsewhere
  return s.state.load() != kRunning || StartTime(pid) != s.start_time.load();
}

std::vector<int> FenceSilent(const std::vector<int>& world_ranks, double max_silence_s) {
  std::vector<int> killed;
  if (g_table == nullptr) return killed;
  const uint64_t host = HostHash();
  const int64_t limit = static_cast<int64_t>(max_silence_s * 1e9);
  std::lock_guard<std::mutex> lock(g_mu);
  for (int w : world_ranks) {
    Slot* s = Peer(w, host);
    if (s == nullptr) continue;
    const int64_t silent = NowNs() - s->beat_ns.load();
    if (silent <= limit) continue;
    char limit_text[32];
    std::snprintf(limit_text, sizeof(limit_text), "%.1f s", max_silence_s);
    if (Fence(w, *s, "no heartbeat for " + Seconds(silent) + " (limit " + limit_text + "): the process is stopped or frozen")) {
      killed.push_back(w);
    }
  }
  return killed;
}

std::string Describe(int world_rank) {
  std::string name = "world rank " + std::to_string(world_rank);
  Slot* table = g_table;
  if (table == nullptr || world_rank < 0 || world_rank >= g_world_size) return name;
  const Slot& s = table[world_rank];
  if (s.pid.load() <= 0) return name + " (not registered)";
  if (s.host.load() != HostHash()) return name + " (another host)";
  name += " (pid " + std::to_string(s.pid.load()) + ")";
  const std::string doing = Doing(s, NowNs());
  if (s.state.load() == kFenced) return name + ": fenced, was " + doing;
  if (s.state.load() == kExiting) return name + ": exiting";
  if (StartTime(s.pid.load()) != s.start_time.load()) return name + ": gone, was " + doing;
  return name + ": " + doing;
}

Verdict Judge(const std::vector<int>& world_ranks, bool late_rank_fence) {
  Verdict verdict;
  Slot* me = Mine();
  if (me == nullptr) return verdict;
  const uint64_t host = HostHash();
  const int32_t my_activity = me->activity.load();
  const int64_t my_step = me->step.load();
  const int64_t now = NowNs();
  const int64_t stopped = static_cast<int64_t>(kStoppedSeconds * 1e9);
  std::lock_guard<std::mutex> lock(g_mu);
  for (int w : world_ranks) {
    if (w >= 0 && w < g_world_size && w != g_world_rank && g_table[w].state.load() == kExiting &&
        g_table[w].host.load() == host) {
      verdict.why += (verdict.why.empty() ? "" : "; ") + std::string("world rank ") + std::to_string(w) +
                     " has ended its program (a collective that not every rank called?)";
      continue;
    }
    Slot* s = Peer(w, host);
    if (s == nullptr) continue;
    const int32_t activity = s->activity.load();
    const bool same_call = activity == my_activity && s->step.load() == my_step;
    const bool polling = now - s->progress_ns.load() <= stopped;
    if (same_call && polling) continue;  // waiting with us: not the one we wait for
    const std::string doing = Doing(*s, now);
    std::string clause = "world rank " + std::to_string(w) + " " + doing;
    if (now - s->beat_ns.load() > stopped) {  // no heartbeat: stopped or frozen
      if (Fence(w, *s, "no heartbeat for " + Seconds(now - s->beat_ns.load()) + " while peers waited for it")) {
        verdict.fenced.push_back(w);
      }
      clause += ", stopped (fenced)";
    } else if (!(activity & kEnded) && activity != 0 && !same_call && polling) {
      clause += ": waiting in another call, not in " + CallName(my_activity, my_step) +
                " (a collective that not every rank called?)";
    } else if ((activity & kEnded || activity == 0) && now - s->since_ns.load() <= stopped) {
      clause += " (just left its last call: on its way)";
    } else if (late_rank_fence) {  // outside ftcomm for a while, or inside this call but not polling
      if (Fence(w, *s, "did not arrive in " + CallName(my_activity, my_step) + " by its deadline: " + doing)) {
        verdict.fenced.push_back(w);
      }
      clause += " (fenced: late)";
    } else {
      clause += " (late)";
    }
    verdict.why += (verdict.why.empty() ? "" : "; ") + clause;
  }
  return verdict;
}

void FenceTimer::Poll(bool force) {
  const double now = NowSeconds();
  Beat();
  if (!force && now < next_check_) return;
  next_check_ = now + 0.2;
  if (!FenceSilent(world_ranks_, FenceTimeout()).empty()) fenced_ = true;
  // A member fenced by another rank counts too: this wait must also stay for ULFM's report,
  // or the ranks would leave the collective at different points.
  Slot* table = g_table;
  for (int w : world_ranks_) {
    if (table != nullptr && w >= 0 && w < g_world_size && table[w].state.load() == kFenced) fenced_ = true;
  }
}

}  // namespace liveness
}  // namespace ftcomm
