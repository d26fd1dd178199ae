#include "collectives/reduce_scatter_step.h"

#include <cstring>
#include <memory>

#include "collectives/ring_reduce_scatter.h"
#include "collectives/scratch.h"

namespace ftcomm {
namespace {

Scratch& RingScratch() {
  thread_local Scratch s;  // per thread: two threads' collectives (two communicators) never share it
  return s;
}

bool ShapesFit(const RingBuffer& input, const RingBuffer& output, int size) {
  return output.dtype == input.dtype && input.count % size == 0 && output.count * size == input.count;
}

}  // namespace

Status ReduceScatterStep(Communicator& comm, const RingBuffer& input, const RingBuffer& output,
                         const StepOptions& options, StepResult* result) {
  StepOptions opt = options;
  if (opt.local_problem == InputProblem::kNone && !ShapesFit(input, output, comm.size())) {
    opt.local_problem = InputProblem::kOutputShape;
  }
  std::unique_ptr<RingReduceScatter> ring;
  StepBody body;
  body.run = [&](const Deadline& deadline) {
    const size_t bytes = RingReduceScatter::ScratchElements(input.count, comm.size()) * ElementSize(input.dtype);
    ring = std::make_unique<RingReduceScatter>(comm, input, opt.op, opt.chunk_bytes, opt.step, RingScratch().Get(bytes),
                                               opt.checksums);
    return ring->Run(deadline);
  };
  body.commit = [&] { std::memcpy(output.data, ring->result(), output.count * ElementSize(output.dtype)); };
  return RunCommittedStep(comm, RoundKind::kReduceScatter, "reduce-scatter", {input}, opt, body, result);
}

}  // namespace ftcomm
