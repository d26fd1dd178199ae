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
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace ftcomm {
namespace liveness {
namespace {

// One slot per world rank. Written only by its owner (and `state` by a fencer); read by peers on
// the same host. Fields are atomics so that concurrent readers never see torn values.
struct alignas(64) Slot {
  std::atomic<int64_t> pid;         // 0: not registered
  std::atomic<int64_t> start_time;  // /proc/<pid>/stat field 22: tells a reused pid apart
  std::atomic<uint64_t> host;       // hash of the host name: fence only on this host
  std::atomic<int64_t> beat_ns;     // CLOCK_MONOTONIC (one clock per host) at the last sign of life
  std::atomic<int64_t> state;       // kRunning, kExiting, kFenced
};
static_assert(sizeof(Slot) == 64, "one cache line per rank");
constexpr int64_t kRunning = 1, kExiting = 2, kFenced = 3;

std::mutex g_mu;
Slot* g_table = nullptr;  // mapped table, nullptr when fencing is off
int g_world_size = 0;
int g_world_rank = -1;
std::set<int> g_killed;  // world ranks this process has fenced

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

}  // namespace

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
  me.beat_ns.store(NowNs());
  me.host.store(HostHash());
  me.start_time.store(StartTime(getpid()));
  me.state.store(kRunning);
  me.pid.store(getpid());  // last: a peer reads the other fields only once pid is set
}

void Beat() {
  Slot* table = g_table;
  if (table != nullptr) table[g_world_rank].beat_ns.store(NowNs(), std::memory_order_relaxed);
}

void MarkExiting() {
  Slot* table = g_table;
  if (table != nullptr) table[g_world_rank].state.store(kExiting);
}

std::vector<int> FenceStale(const std::vector<int>& world_ranks) {
  return FenceSilent(world_ranks, FenceTimeout());
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
  Slot* table = g_table;
  if (table == nullptr) return killed;
  const uint64_t host = HostHash();
  const int64_t now = NowNs();
  const int64_t limit = static_cast<int64_t>(max_silence_s * 1e9);
  std::lock_guard<std::mutex> lock(g_mu);
  for (int w : world_ranks) {
    if (w < 0 || w >= g_world_size || w == g_world_rank || g_killed.count(w)) continue;
    Slot& s = table[w];
    const int64_t pid = s.pid.load();
    if (pid <= 0 || s.host.load() != host || s.state.load() != kRunning) continue;
    const int64_t silent = now - s.beat_ns.load();
    if (silent <= limit) continue;
    if (StartTime(pid) != s.start_time.load()) continue;  // gone already (ULFM sees that itself)
    g_killed.insert(w);
    s.state.store(kFenced);
    std::fprintf(stderr,
                 "ftcomm: fencing world rank %d (pid %lld): no sign of life for %.1f s "
                 "(limit %.1f s); SIGKILL so that ULFM reports it as failed\n",
                 w, static_cast<long long>(pid), silent * 1e-9, max_silence_s);
    std::fflush(stderr);
    kill(static_cast<pid_t>(pid), SIGKILL);
    killed.push_back(w);
  }
  return killed;
}

double LongestSilence(const std::vector<int>& world_ranks) {
  Slot* table = g_table;
  if (table == nullptr) return 0.0;
  const uint64_t host = HostHash();
  const int64_t now = NowNs();
  double longest = 0.0;
  for (int w : world_ranks) {
    if (w < 0 || w >= g_world_size || w == g_world_rank) continue;
    Slot& s = table[w];
    const int64_t pid = s.pid.load();
    if (pid <= 0 || s.host.load() != host || s.state.load() != kRunning) continue;
    const double silent = (now - s.beat_ns.load()) * 1e-9;
    if (silent > longest && StartTime(pid) == s.start_time.load()) longest = silent;
  }
  return longest;
}

void FenceTimer::Poll(bool force) {
  const double now = NowSeconds();
  if (!force && now < next_check_) return;
  next_check_ = now + 0.2;
  Beat();
  if (!FenceStale(world_ranks_).empty()) fenced_ = true;
  // A member fenced by another rank counts too: this wait must also stay for ULFM's report,
  // or the ranks would leave the collective at different points.
  Slot* table = g_table;
  for (int w : world_ranks_) {
    if (table != nullptr && w >= 0 && w < g_world_size && table[w].state.load() == kFenced) fenced_ = true;
  }
}

}  // namespace liveness
}  // namespace ftcomm
