// One reduce-scatter step under the commit protocol (collectives/step_protocol.h). The ring
// (RingReduceScatter) reads the input and writes only scratch; the commit copies this rank's
// reduced segment into the output, so an abort leaves input and output bitwise as before, with
// no undo log. The output may alias the input (torch's in-place form): the input is read only
// before the commit. A step id equal to the last committed one is a replay: a no-op.
#pragma once

#include "collectives/ring_buffer.h"
#include "collectives/step_protocol.h"
#include "core/communicator.h"
#include "core/status.h"

namespace ftcomm {

// `input`: N equal segments (N = comm.size()); `output`: one segment, same dtype. A rank whose
// shapes do not fit sets kOutputShape itself (every rank then gets the same kInvalidInput).
Status ReduceScatterStep(Communicator& comm, const RingBuffer& input, const RingBuffer& output,
                         const StepOptions& options, StepResult* result);

}  // namespace ftcomm
