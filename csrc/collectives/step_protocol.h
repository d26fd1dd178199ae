// The commit protocol every committed collective step shares (allreduce, reduce-scatter):
//   1. validate: a small round checks that every rank passes the same step id, op, buffer
//      count, lengths and dtypes, and that no rank rejected its own input. A mismatch is a
//      uniform kInvalidInput error on every rank, before any byte of a buffer is touched.
//   2. run: the collective's communication (StepBody::run); what it wrote into user buffers
//      must be undoable (StepBody::undo), or it writes only into scratch.
//   3. agree: one ULFM agreement (MPIX_Comm_agree, the ULFM chapter of the MPI 4 draft) on
//      "every rank completed its run" and, with fingerprints, on "every rank holds the same result"
//      (a 14-bit fingerprint of the result and its complement ride in the same flag).
//   4. commit (StepBody::commit publishes the results, the step id is recorded) or abort (undo,
//      then revoke and shrink so that all survivors report the same failed ranks; the shrunk
//      communicator waits in Communicator::TakeRecovered). A run that completed everywhere but
//      found corrupted data somewhere (kCorruption) is voided without a shrink: undo, and the
//      same kCorruption error on every rank, naming the ranks, the communicator still usable.
//      So is a run whose results differ between ranks (a flip in memory after the data arrived),
//      with kResultsDiffer; a rank singled out that way twice within 1000 steps fences itself.
// A step id equal to the last committed one is a replay: a no-op with no communication.
//
// An uncommitted step (StepOptions::commit false) is validated the same way but has no undo log
// and no agreement: its outcome is local. A rank that fails in the run revokes the communicator
// and returns its own error (another rank may have completed, a third may fail with kRevoked),
// the buffers hold no defined value, and the step id is not recorded. The caller makes the
// outcome uniform with one agreement of its own, over several such steps: a training step's
// gradient buckets commit together, before the optimizer step (ftcomm/torch/step_commit.py).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "collectives/dtype.h"
#include "collectives/minmax_round.h"
#include "collectives/ring_buffer.h"
#include "core/communicator.h"
#include "core/deadline.h"
#include "core/status.h"

namespace ftcomm {

// Why a rank rejects its own input; carried in the validation round so that every rank can name
// the offending rank and reason. Exported to Python as ftcomm._C.InputProblem; the highest value
// any rank reports is the one every rank names.
enum class InputProblem : int {
  kNone = 0,
  kNotContiguous = 1,
  kReadOnly = 2,
  kUnsupportedDType = 3,
  kUnsupportedOp = 4,
  kNotABuffer = 5,
  kMixedDevices = 6,
  kStepNotAfterCommitted = 7,  // found by the validation itself, not passed in
  kOutputShape = 8,            // reduce-scatter: output is not 1/N of the input, or another dtype
  kBadChunkBytes = 9,          // chunk_bytes is not a positive integer
  kUncommittedDevice = 10,     // an uncommitted step was given device buffers
};

// What `problem` means, in words ("a buffer is not contiguous").
const char* InputProblemText(InputProblem problem);

struct StepOptions {
  ReduceOp op = ReduceOp::kSum;
  int64_t step = 0;
  double timeout_s = 60.0;
  size_t chunk_bytes = 1 << 20;
  InputProblem local_problem = InputProblem::kNone;
  // The ring's transit guard (collectives/checksum.h): chunk checksums compared before the
  // commit; a mismatch voids the step on every rank with kCorruption. Must agree across ranks.
  bool checksums = false;
  // Result fingerprints: each rank hashes its whole result once more after the ring (a read pass
  // over the buffers) and the hashes are compared in the commit agreement, so that ranks whose
  // results differ (a flip in memory after the data arrived) cannot all commit: kResultsDiffer.
  // Must agree across ranks; the allreduce turns the checksums on with them.
  bool fingerprints = false;
  // False: an uncommitted step (above); the ranks must agree on it, and the corruption guard
  // (checksums, fingerprints), whose verdict needs the commit agreement, must be off.
  bool commit = true;
};

struct StepResult {
  bool replayed = false;  // the step had already committed: nothing was done
  // Seconds of each phase of this call (0 for a replay or an invalid input): the validation
  // round, the communication, the agreement (an abort's undo and shrink come after it, not counted;
  // 0 for an uncommitted step).
  double validate_s = 0, ring_s = 0, agree_s = 0;
};

// What differs between committed collectives; each may be empty.
struct StepBody {
  std::function<Status(const Deadline&)> run;  // the communication, after a valid validation
  std::function<void()> undo;                  // restores user buffers `run` wrote, on abort
  std::function<void()> commit;                // publishes results, once every rank agreed
  // A fingerprint of the results this rank would commit, for collectives whose results must be
  // equal on every rank (allreduce); compared in the commit agreement when fingerprints are on.
  std::function<uint64_t()> fingerprint;
};

// Runs one committed step of the collective `name` ("allreduce", "reduce-scatter"; it starts
// every error message), whose validation round is of `kind`. `validated` are the buffers whose
// lengths and dtypes must agree across ranks.
Status RunCommittedStep(Communicator& comm, RoundKind kind, const char* name,
                        const std::vector<RingBuffer>& validated, const StepOptions& opt, StepBody& body,
                        StepResult* result);

}  // namespace ftcomm
