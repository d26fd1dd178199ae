// Liveness table and fencing: how the survivors get past a rank that is alive but stuck.
//
// Open MPI 5.0.x reports a process only once it is dead; a rank that hangs (endless loop, deadlock,
// SIGSTOP) is never reported, and MPIX_Comm_shrink waits for it forever. So ftcomm turns "stuck"
// into "dead": every rank publishes its pid and a heartbeat in a small shared-memory table
// (a file in FTCOMM_RUN_DIR, which ftcomm-run creates, one 64-byte slot per MPI_COMM_WORLD rank).
// The heartbeat is refreshed whenever the rank is inside an ftcomm wait (each poll of a request or
// an agreement, and by the watchdog thread while a non-interruptible MPI call runs). A rank that
// waits on a communicator SIGKILLs every member on its own host whose heartbeat is older than the
// fence timeout (CoreSettings::fence_timeout_s: FTCOMM_FENCE_TIMEOUT, else FTCOMM_TIMEOUT, else
// 60 s). ULFM then reports an ordinary process failure and recovery proceeds. The killed rank cannot come back with stale
// state: it is dead. See docs/DESIGN.md, "Hangs and fencing".
#pragma once

#include <vector>

namespace ftcomm {
namespace liveness {

// Publishes this process's slot (pid, start time, host, heartbeat). Idempotent; a no-op without
// a run directory (CoreSettings::run_dir, from FTCOMM_RUN_DIR). Needs MPI initialised (reads the MPI_COMM_WORLD rank and size).
void Register();

// Refreshes this rank's heartbeat (a relaxed store into shared memory; cheap enough to call on
// every poll).
void Beat();

// Marks this rank as finishing (clean shutdown): nobody fences it any more.
void MarkExiting();

// Seconds of silence after which a waiting peer fences a rank (CoreSettings::fence_timeout_s).
double FenceTimeout();

// SIGKILLs every rank of `world_ranks` (MPI_COMM_WORLD numbering) that runs on this host, is not
// this process, has registered, is not finishing, and whose heartbeat is older than
// FenceTimeout(). Returns the world ranks it killed (each is killed once per process).
std::vector<int> FenceStale(const std::vector<int>& world_ranks);

// As FenceStale, with the silence limit given in seconds (used at the end of a job, for idle
// spares that did not take their release: a live spare beats every few milliseconds).
std::vector<int> FenceSilent(const std::vector<int>& world_ranks, double max_silence_s);

// True when `world_rank` marked itself exiting, was fenced, is gone, or is not in the table (or
// runs on another host): nothing more to wait for on this host.
bool Finished(int world_rank);

// The longest silence (seconds) among the live, registered ranks of `world_ranks` on this host,
// other than this one; 0 if none. A wait whose deadline passes while some peer has been silent
// for a while keeps waiting until that peer is fenced or speaks: otherwise a rank that hung just
// after its peers started waiting would make them time out (a local outcome) a moment before it
// could be fenced (a uniform ProcFailedError).
double LongestSilence(const std::vector<int>& world_ranks);

// Paces FenceStale inside a polling loop: call Poll() on every iteration; it checks at most every
// 200 ms. fenced() tells whether a member of the communicator was fenced (by this rank or another) (the caller then grants ULFM a grace
// period to report the death before giving up on its deadline).
class FenceTimer {
 public:
  explicit FenceTimer(const std::vector<int>& world_ranks) : world_ranks_(world_ranks) {}
  void Poll(bool force = false);
  bool fenced() const { return fenced_; }

 private:
  const std::vector<int>& world_ranks_;
  double next_check_ = 0.0;
  bool fenced_ = false;
};

// Seconds a wait that fenced a peer keeps waiting past its deadline for ULFM to report the death.
constexpr double kFenceGraceSeconds = 5.0;

}  // namespace liveness
}  // namespace ftcomm
