#include "collectives/allreduce_step.h"

#include <algorithm>
#include <vector>

#include "collectives/checksum.h"
#include "collectives/scratch.h"
#include "fault/injection.h"

namespace ftcomm {
namespace {

Scratch& UndoScratch() {
  thread_local Scratch s;  // per thread: two threads' collectives (two communicators) never share it
  return s;
}
Scratch& StagingScratch() {
  thread_local Scratch s;  // per thread: two threads' collectives (two communicators) never share it
  return s;
}

}  // namespace

Status AllreduceStep(Communicator& comm, std::vector<RingBuffer>& buffers,
                     const AllreduceStepOptions& options, AllreduceStepResult* result) {
  AllreduceStepOptions opt = options;
  // Fingerprints need the transit checksums: a flip in transit is forwarded around the ring, so a
  // majority of ranks could hold the corrupted result and single out the one rank that is right.
  opt.checksums = opt.checksums || opt.fingerprints;
  std::vector<RingAllreduce> rings;
  StepBody body;
  body.run = [&](const Deadline& deadline) {
    size_t total = 0, staging_bytes = 0;
    for (const RingBuffer& b : buffers) {
      total += b.count * ElementSize(b.dtype);
      staging_bytes = std::max(staging_bytes, RingAllreduce::StagingElements(b.count, comm.size()) *
                                                  ElementSize(b.dtype));
    }
    char* undo = opt.commit ? UndoScratch().Get(total) : nullptr;  // uncommitted: no undo log
    char* staging = StagingScratch().Get(staging_bytes);
    rings.reserve(buffers.size());
    size_t undo_offset = 0;
    Status corrupted;  // a corrupted ring still lets the bucket's later rings run: peers wait in them
    for (const RingBuffer& b : buffers) {
      rings.emplace_back(comm, b, opt.op, opt.chunk_bytes, opt.step, undo ? undo + undo_offset : nullptr, staging,
                         opt.checksums);
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
  // Last ring first: where a bucket's buffers overlap, a later ring's undo log holds what the
  // earlier ring wrote, and the earlier ring's log the original values, which must win.
  body.undo = [&] {
    for (auto ring = rings.rbegin(); ring != rings.rend(); ++ring) ring->Undo();
  };
  // Every rank must hold the same result: one more read pass over the buffers, with fingerprints on.
  body.fingerprint = [&] {
    const int world_rank = comm.world_ranks()[comm.rank()];
    uint64_t fp = 0;
    for (size_t i = 0; i < buffers.size(); ++i) {
      const RingBuffer& b = buffers[i];
      const size_t bytes = b.count * ElementSize(b.dtype);
      // tests: a flip in this rank's memory after the data arrived (not in transit)
      if (i == 0) fault::Flip("result", world_rank, opt.step, -1, -1, b.data, bytes);
      fp = fp * 0x9e3779b97f4a7c15ULL + WordSum(b.data, bytes);
    }
    return fp;
  };
  return RunCommittedStep(comm, RoundKind::kAllreduce, "allreduce", buffers, opt, body, result);
}

}  // namespace ftcomm
