#include "fault/injection.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ftcomm {
namespace fault {
namespace {

std::mutex g_mu;
std::vector<Spec> g_specs;
std::atomic<bool> g_any{false};

bool Matches(const Spec& s, const char* point, int world_rank, int64_t step, int ring_step,
             int chunk) {
  return s.point == point && (s.world_rank < 0 || s.world_rank == world_rank) &&
         (s.step < 0 || s.step == step) && (s.ring_step < 0 || s.ring_step == ring_step) &&
         (s.chunk < 0 || s.chunk == chunk);
}

[[noreturn]] void Fail(const Spec& s, int world_rank, int64_t step) {
  static const char* kNames[] = {"kill", "exit", "hang", "stop", "bitflip"};
  // The wall-clock time lets a benchmark measure from the fault itself (MTTR = fault to the
  // first committed step after it), not from the start of the step it hit.
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  std::fprintf(stderr, "ftcomm: fault injection: %s rank %d at %s (step %lld), unix time %.6f\n",
               kNames[static_cast<int>(s.kind)], world_rank, s.point.c_str(),
               static_cast<long long>(step), now.tv_sec + now.tv_nsec * 1e-9);
  std::fflush(stderr);
  switch (s.kind) {
    case Kind::kKill: kill(getpid(), SIGKILL); break;
    // exit(), not _exit(): a process that ends without MPI_Finalize is not reported by Open MPI
    // 5.0.11's ULFM, so ftcomm's exit handler (core/liveness.cpp) turns it into a death. _exit
    // would skip that handler, and the survivors could only time out.
    case Kind::kExit: std::exit(1);
    case Kind::kStop: kill(getpid(), SIGSTOP); break;
    case Kind::kHang: break;
  }
  for (;;) pause();
}

}  // namespace

void Add(const Spec& spec) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_specs.push_back(spec);
  g_any = true;
}

void Clear() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_specs.clear();
  g_any = false;
}

bool Any() { return g_any; }

void Point(const char* point, int world_rank, int64_t step, int ring_step, int chunk) {
  if (!g_any) return;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Spec& s : g_specs) {
    if (s.kind != Kind::kBitflip && Matches(s, point, world_rank, step, ring_step, chunk)) Fail(s, world_rank, step);
  }
}

bool Flip(const char* point, int world_rank, int64_t step, int ring_step, int chunk, void* data, size_t bytes) {
  if (!g_any || bytes == 0) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_specs.begin(); it != g_specs.end(); ++it) {
    if (it->kind != Kind::kBitflip || !Matches(*it, point, world_rank, step, ring_step, chunk)) continue;
    static_cast<unsigned char*>(data)[bytes / 2] ^= 0x10;
    std::fprintf(stderr, "ftcomm: fault injection: bitflip rank %d at %s (step %lld, ring step %d, chunk %d)\n",
                 world_rank, point, static_cast<long long>(step), ring_step, chunk);
    std::fflush(stderr);
    g_specs.erase(it);
    g_any = !g_specs.empty();
    return true;
  }
  return false;
}

}  // namespace fault
}  // namespace ftcomm
