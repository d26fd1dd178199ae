// One allreduce step under the commit protocol (collectives/step_protocol.h): the ring is a
// RingAllreduce per buffer of the bucket, in place with an undo log, so an abort restores every
// buffer bitwise. A step id equal to the last committed one is a replay: a no-op with no
// communication. Uncommitted (options.commit false): the ring in place, no undo log, no agreement.
#pragma once

#include <vector>

#include "collectives/ring_allreduce.h"
#include "collectives/step_protocol.h"
#include "core/communicator.h"
#include "core/status.h"

namespace ftcomm {

using AllreduceStepOptions = StepOptions;
using AllreduceStepResult = StepResult;

Status AllreduceStep(Communicator& comm, std::vector<RingBuffer>& buffers,
                     const AllreduceStepOptions& options, AllreduceStepResult* result);

}  // namespace ftcomm
