#include "collectives/allreduce_step.h"

#include <algorithm>
#include <vector>

#include "collectives/scratch.h"

namespace ftcomm {
namespace {

Scratch& UndoScratch() {
  static Scratch s;
  return s;
}
Scratch& StagingScratch() {
  static Scratch s;
  return s;
}

}  // namespace

Status AllreduceStep(Communicator& comm, std::vector<RingBuffer>& buffers,
                     const AllreduceStepOptions& opt, AllreduceStepResult* result) {
  std::vector<RingAllreduce> rings;
  StepBody body;
  body.run = [&](const Deadline& deadline) {
    size_t total = 0, staging_bytes = 0;
    for (const RingBuffer& b : buffers) {
      total += b.count * ElementSize(b.dtype);
      staging_bytes = std::max(staging_bytes, RingAllreduce::StagingElements(b.count, comm.size()) *
                                                  ElementSize(b.dtype));
    }
    char* undo = UndoScratch().Get(total);
    char* staging = StagingScratch().Get(staging_bytes);
    rings.reserve(buffers.size());
    size_t undo_offset = 0;
    Status corrupted;  // a corrupted ring still lets the bucket's later rings run: peers wait in them
    for (const RingBuffer& b : buffers) {
      rings.emplace_back(comm, b, opt.op, opt.chunk_bytes, opt.step, undo + undo_offset, staging, opt.checksums);
      undo_offset += b.count * ElementSize(b.dtype);
      Status s = rings.back().Run(deadline);
      if (s.code == StatusCode::kCorruption) {
        if (corrupted.ok()) corrupted = s;
      } else if (!s.ok()) {
        return s;
      }
    }
    return corrupted;
  };
  body.undo = [&] {
    for (RingAllreduce& ring : rings) ring.Undo();
  };
  return RunCommittedStep(comm, "allreduce", buffers, opt, body, result);
}

}  // namespace ftcomm
