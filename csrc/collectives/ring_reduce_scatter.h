// Ring reduce-scatter that never writes the user's input: the first half of the ring allreduce
// (Patarasuk & Yuan, JPDC 2009), N-1 ring steps, pipelined by chunk. The input holds N equal
// segments; rank r ends with segment r reduced over all ranks, in scratch memory (`result()`),
// so that the caller can publish it only once the step is committed. Each rank sends and
// receives (N-1)/N of the input: half the traffic of an allreduce.
//
// Ring step t (0 <= t < N-1): rank r sends segment (r-t-1) mod N (its own input at t = 0, the
// partial reduction it made at step t-1 after) and receives segment (r-t-2) mod N, which it
// reduces with its own input of that segment: out of place, into one of two rotating
// accumulators, or into the result at the last step.
//
// Transit guard (optional), as in the ring allreduce (collectives/chunk_sums.h): each chunk's
// sum is taken by its sender (a read pass over the input segment sent at step 0; in the
// reduction's loop after) and by its receiver in the reduction's loop, compared when the ring is
// done; a mismatch reports kCorruption.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "collectives/chunk_sums.h"
#include "collectives/dtype.h"
#include "collectives/ring_buffer.h"
#include "core/communicator.h"
#include "core/deadline.h"
#include "core/status.h"

namespace ftcomm {

class RingReduceScatter {
 public:
  // `input.count` must be a multiple of the communicator's size; `scratch` must hold
  // ScratchElements(input.count, size) elements of the input's dtype.
  RingReduceScatter(Communicator& comm, const RingBuffer& input, ReduceOp op, size_t chunk_bytes,
                    int64_t step, char* scratch, bool checksums = false);

  // Runs the ring. On error every request has been drained; the input is untouched either way.
  // kCorruption (checksums on): a received chunk's sum did not match its sender's;
  // failed_ranks = {sender, this rank} in the communicator's numbering.
  Status Run(const Deadline& deadline);
  // This rank's reduced segment (input.count / N elements), valid after a successful Run.
  const char* result() const { return result_; }

  // Two receive slots, two accumulators and the result: five segments.
  static size_t ScratchElements(size_t count, int world_size) { return 5 * (count / world_size); }

 private:
  int SendSegment(int t) const { return ((rank_ - t - 1) % n_ + n_) % n_; }
  int RecvSegment(int t) const { return ((rank_ - t - 2) % n_ + n_) % n_; }
  size_t ChunkCount() const { return (seg_len_ + chunk_elems_ - 1) / chunk_elems_; }
  size_t ChunkLength(size_t c) const;
  const char* SendSource(int t, size_t c) const;
  char* Slot(char* base, int parity, size_t c) const;

  Status PostRecvs(int t);
  Status PostSend(int t, size_t c);
  Status WaitSends(int t, const Deadline& deadline);
  void ReduceChunk(int t, size_t c);
  Status Fail(Status s);

  Communicator& comm_;
  RingBuffer in_;
  ReduceOp op_;
  int64_t step_;
  int n_, rank_, left_, right_;
  size_t esize_, chunk_elems_, seg_len_;
  char* staging_;  // two receive slots, by ring step parity
  char* acc_;      // two accumulators, by ring step parity
  char* result_;
  std::vector<MPI_Request> recvs_[2];         // per receive slot
  std::vector<bool> recvs_posted_;            // per ring step
  std::vector<std::vector<MPI_Request>> sends_;  // per ring step
  bool checksums_;
  std::unique_ptr<ChunkSums> sums_;  // with checksums only
};

}  // namespace ftcomm
