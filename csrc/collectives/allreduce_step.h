// One allreduce step under the commit protocol:
//   1. validate: a small allreduce checks that every rank passes the same step id, op, buffer
//      count, lengths and dtypes, and that no rank rejected its own input. A mismatch is a
//      uniform kInvalidInput error on every rank, before any byte of a buffer is touched.
//   2. ring: a RingAllreduce per buffer of the bucket, in place with an undo log.
//   3. agree: one ULFM agreement (MPIX_Comm_agree) on "every rank completed every ring".
//   4. commit (keep the results, record the step) or abort (undo every buffer, then revoke and
//      shrink so that all survivors report the same failed ranks; the shrunk communicator waits
//      in Communicator::TakeRecovered).
// A step id equal to the last committed one is a replay: a no-op with no communication.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/dtype.h"
#include "collectives/ring_allreduce.h"
#include "core/communicator.h"
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
};

// What `problem` means, in words ("a buffer is not contiguous").
const char* InputProblemText(InputProblem problem);

struct AllreduceStepOptions {
  ReduceOp op = ReduceOp::kSum;
  int64_t step = 0;
  double timeout_s = 60.0;
  size_t chunk_bytes = 1 << 20;
  InputProblem local_problem = InputProblem::kNone;
};

struct AllreduceStepResult {
  bool replayed = false;  // the step had already committed: nothing was done
  // Seconds of each phase of this call (0 for a replay or an invalid input): the validation
  // round, the rings, the agreement (an abort's undo and shrink come after it, not counted).
  double validate_s = 0, ring_s = 0, agree_s = 0;
};

// Element-wise min and max of `values` over all ranks (one dissemination round of small
// messages, as the allreduce's validation). Used by the Python helpers (allgather, broadcast) to
// validate input uniformly: every rank gets the same mins and maxs, hence the same error. Values
// must lie in (INT64_MIN, INT64_MAX]. Local outcome on a failure (ProcFailed, Revoked, Timeout).
Status MinMaxAcrossRanks(Communicator& comm, const std::vector<int64_t>& values,
                         std::vector<int64_t>* mins, std::vector<int64_t>* maxs, double timeout_s);

Status AllreduceStep(Communicator& comm, std::vector<RingBuffer>& buffers,
                     const AllreduceStepOptions& options, AllreduceStepResult* result);

}  // namespace ftcomm
