// Liveness and fencing: how the survivors get past a rank that is alive but stuck, without ever
// killing a rank for being busy.
//
// Open MPI 5.0.x reports a process only once it is dead; a rank that hangs (deadlock, SIGSTOP) is
// never reported, and MPIX_Comm_shrink waits for it forever. So ftcomm turns "stuck" into "dead":
// every rank publishes its pid and two signs of life in a small shared-memory table (a file in
// ftcomm-run's run directory, one 64-byte slot per MPI_COMM_WORLD rank):
//
//   * the process heartbeat, refreshed every 100 ms by a thread of its own, whatever the rank is
//     doing (Python code, a long evaluation, a checkpoint) and without the GIL: it says the
//     process exists and is scheduled. It stops only when the whole process stops (SIGSTOP, a
//     frozen or swapped-out process) or dies;
//   * the activity: which ftcomm call the rank is in (collective and step) or that it is outside
//     ftcomm, since when, and a progress beat refreshed while it waits inside that call.
//
// A rank that waits on a communicator looks at the other members on its own host:
//   1. a member whose process heartbeat is older than the fence timeout (CoreSettings::
//      fence_timeout_s) is stopped: it is SIGKILLed at once (fenced);
//   2. when the wait's deadline passes (the collective's timeout), each member that has not
//      arrived is judged (Judge): stopped (heartbeat silent for a second): fenced; late (outside
//      ftcomm) or hung (inside a call but not polling): fenced under the late-rank policy
//      "fence", named under "raise"; in another ftcomm call: named, never fenced (a collective
//      that not every rank called is a program error, and both sides are waiting).
// ULFM then reports an ordinary process failure and recovery proceeds; the killed rank cannot
// come back with stale state. See docs/DESIGN.md, "Hangs and fencing".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ftcomm {
namespace liveness {

// What a rank is doing, as published in its slot.
enum class Activity : int32_t {
  kOutside = 0,  // in its own code, between ftcomm calls
  kAllreduce = 1,
  kAgree = 2,
  kBarrier = 3,
  kExchange = 4,
  kShrink = 5,
  kSplit = 6,
  kDup = 7,
  kSignal = 8,
  kValidate = 9,  // the min/max round of allgather and broadcast
  kFinalize = 10,
  kAllgather = 11,  // an inner group's allgather (a data plane of the torch backend)
};
const char* ActivityName(Activity activity);

// Publishes this process's slot (pid, start time, host, heartbeat) and starts the heartbeat
// thread. Idempotent; a no-op without a run directory (CoreSettings::run_dir, FTCOMM_RUN_DIR).
// Needs MPI initialised (reads the MPI_COMM_WORLD rank and size).
void Register();

// Refreshes this rank's progress beat (a relaxed store; cheap enough for every poll of a wait).
void Beat();

// Marks this rank as finishing (clean shutdown): nobody fences it any more.
void MarkExiting();

// Seconds of process-heartbeat silence after which a waiting peer fences a rank.
double FenceTimeout();

// Publishes what this rank is doing for the life of the scope, then "outside ftcomm" again (the
// outermost scope wins: an agreement inside an allreduce stays "allreduce step N").
class ActivityScope {
 public:
  ActivityScope(Activity activity, int64_t step);
  ~ActivityScope();
  ActivityScope(const ActivityScope&) = delete;
  ActivityScope& operator=(const ActivityScope&) = delete;

 private:
  bool outermost_;
};

// SIGKILLs every rank of `world_ranks` (MPI_COMM_WORLD numbering) on this host, other than this
// process, registered, not finishing, whose process heartbeat is older than `max_silence_s`.
// Returns the world ranks it killed (each is killed once per process).
std::vector<int> FenceSilent(const std::vector<int>& world_ranks, double max_silence_s);

// True when `world_rank` marked itself exiting, was fenced, is gone, or is not in the table (or
// runs on another host): nothing more to wait for on this host.
bool Finished(int world_rank);

// One line naming a rank and what it is doing, for error messages: "world rank 2 (pid 4242,
// this host): outside ftcomm for 12.3 s, last in allreduce step 6". Ranks on other hosts or not
// registered are named by world rank only.
std::string Describe(int world_rank);

// What a wait whose deadline passed learns about the members that kept it waiting.
struct Verdict {
  std::vector<int> fenced;  // world ranks killed just now (stopped, or late or hung under "fence")
  std::string why;          // one clause per member that did not arrive, for the error message
};

// Looks at the members of `world_ranks` on this host that are not waiting in the same call as
// this rank (see the file comment), fences the ones the rules say to, and describes them all.
// `late_rank_fence`: the late-rank policy is "fence" (else "raise").
Verdict Judge(const std::vector<int>& world_ranks, bool late_rank_fence);

// Paces the fencing of stopped ranks inside a polling loop: call Poll() on every iteration; it
// refreshes this rank's progress beat and checks at most every 200 ms. fenced() tells whether a
// member of the communicator was fenced (by this rank or another): the caller then grants ULFM a
// grace period to report the death before giving up on its deadline.
class FenceTimer {
 public:
  explicit FenceTimer(const std::vector<int>& world_ranks) : world_ranks_(world_ranks) {}
  void Poll(bool force = false);
  bool fenced() const { return fenced_; }
  void note_fenced() { fenced_ = true; }

 private:
  const std::vector<int>& world_ranks_;
  double next_check_ = 0.0;
  bool fenced_ = false;
};

// Seconds a wait that fenced a peer keeps waiting past its deadline for ULFM to report the death.
constexpr double kFenceGraceSeconds = 1.5;

// Heartbeat period of the process heartbeat thread, and the silence after which a rank that
// keeps a waiting peer past its deadline counts as stopped.
constexpr double kHeartbeatSeconds = 0.1;
constexpr double kStoppedSeconds = 1.0;

}  // namespace liveness
}  // namespace ftcomm
