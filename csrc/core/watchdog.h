// Watchdog: turns an overrun of a call that MPI gives us no way to interrupt (MPIX_Comm_shrink,
// MPI_Comm_dup, MPI_Finalize) into the death of this rank. A dead rank is something ULFM can
// report and the survivors can shrink past; a rank stuck forever is not (Open MPI 5.0.x has no
// heartbeat detector for live but stuck processes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ftcomm {
namespace watchdog {

enum class Action {
  kKillSelf,   // SIGKILL this process: the survivors see a process failure
  kExitClean,  // _exit(0): used for MPI_Finalize, after all work is done
};

// Arms the watchdog for `seconds`; returns a token for Disarm. Thread safe. While armed, the
// watchdog thread keeps this rank's heartbeat fresh (it is blocked in MPI, not stuck) and, every
// 200 ms, fences the ranks of `fence_members` (MPI_COMM_WORLD numbering) that stopped answering
// (core/liveness.h). If it fenced somebody, an overrun is forgiven once for a grace period, so
// that ULFM can report the death and the call return.
uint64_t Arm(double seconds, const std::string& what, Action action,
             const std::vector<int>& fence_members = {});
void Disarm(uint64_t token);

// RAII guard around one non-interruptible call.
class Guard {
 public:
  Guard(double seconds, const std::string& what, Action action = Action::kKillSelf,
        const std::vector<int>& fence_members = {})
      : token_(Arm(seconds, what, action, fence_members)) {}
  ~Guard() { Disarm(token_); }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  uint64_t token_;
};

}  // namespace watchdog
}  // namespace ftcomm
