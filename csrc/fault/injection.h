// Fault injection: kills, exits or hangs the calling rank at a named point of the protocol, so
// tests can fail a rank exactly where they mean to. Points are named in docs/FAULTS.md; the
// Python side parses FTCOMM_FAULT and calls Add.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ftcomm {
namespace fault {

enum class Kind : int {
  kKill = 0,  // SIGKILL: the process vanishes, as on an OOM kill or a node reboot
  kExit = 1,  // exit(1): the process ends with an error status, without MPI_Finalize
  kHang = 2,  // sleeps forever: alive but making no progress
  kStop = 3,  // SIGSTOP: frozen by the kernel, as under a debugger or swap storm
  kBitflip = 4,  // flips one bit of the data at the point, once (silent data corruption)
};

struct Spec {
  std::string point;      // e.g. "before", "reduce_scatter", "allgather", "commit"
  int world_rank = -1;    // MPI_COMM_WORLD rank that fails; -1 = every rank
  int64_t step = -1;      // collective step id; -1 = any
  int ring_step = -1;     // ring step within the phase; -1 = any
  int chunk = -1;         // chunk within the ring step; -1 = any
  Kind kind = Kind::kKill;
};

void Add(const Spec& spec);
void Clear();
bool Any();

// Fails this process if a spec matches; otherwise returns at once. Cheap when no spec is set.
// Bitflip specs are not acted on here: see Flip.
void Point(const char* point, int world_rank, int64_t step, int ring_step = -1, int chunk = -1);

// Flips one bit of `data` (`bytes` long; the middle byte's bit 4) if a bitflip spec matches, and
// disarms that spec (a transient flip: the redone step runs clean). Returns whether it flipped.
bool Flip(const char* point, int world_rank, int64_t step, int ring_step, int chunk, void* data, size_t bytes);

}  // namespace fault
}  // namespace ftcomm
