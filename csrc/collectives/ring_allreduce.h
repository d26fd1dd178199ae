// Ring allreduce over one host buffer, in place, with an undo log: reduce-scatter then
// allgather, N-1 ring steps each (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms
// for clusters of workstations", JPDC 2009). The buffer is cut into N segments and each segment
// into chunks; the send of chunk c for ring step t+1 is posted as soon as chunk c of step t is
// reduced, so communication of one chunk overlaps the reduction of the next.
//
// Commit support: the first write to any element of the user's buffer is preceded by saving its
// old value in the undo log (fused into the reduction loop), so Undo() restores the buffer
// exactly after an aborted collective. The caller decides commit or abort (see step_protocol.h).
//
// Transit guard (optional): every chunk's WordSum (collectives/checksum.h) is computed by its
// sender and, once per ring step, sent after the step's chunks; the receiver sums each chunk on
// arrival and compares once the ring is done. The sums ride on passes the ring makes anyway (the
// undo copy of the input, the reduction, block by block while in L1); a forwarded allgather chunk
// reuses the sum taken on its arrival, so only an arrived allgather chunk is read once more.
// A mismatch does not stop the ring: it completes, then reports kCorruption.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/chunk_sums.h"
#include "collectives/dtype.h"
#include "collectives/reduce_kernels.h"
#include "collectives/ring_buffer.h"
#include "core/communicator.h"
#include "core/deadline.h"
#include "core/status.h"

namespace ftcomm {

class RingAllreduce {
 public:
  // `undo` must hold count elements, or be null for an uncommitted step (no undo log: Undo()
  // cannot be called, and the transit guard needs the log's pass, so `checksums` must be
  // false); `staging` two segments (2 * ceil(count / N) elements).
  RingAllreduce(Communicator& comm, const RingBuffer& buf, ReduceOp op, size_t chunk_bytes,
                int64_t step, char* undo, char* staging, bool checksums = false);

  // Runs the ring. On error every request has been drained and the buffer may be partly
  // written: call Undo(). kCorruption (checksums on): a received chunk's sum did not match its
  // sender's; failed_ranks = {sender, this rank} in the communicator's numbering.
  Status Run(const Deadline& deadline);
  // Restores every element written by Run from the undo log.
  void Undo();

  static size_t StagingElements(size_t count, int world_size) {
    return 2 * ((count + world_size - 1) / world_size);
  }

 private:
  bool IsReduceScatter(int t) const { return t < n_ - 1; }
  int SendSegment(int t) const;
  int RecvSegment(int t) const;
  size_t SegmentOffset(int seg) const;  // elements
  size_t SegmentLength(int seg) const;  // elements
  size_t ChunkCount(int seg) const;
  void ChunkRange(int seg, size_t c, size_t* offset, size_t* length) const;
  char* RecvTarget(int t, size_t c);

  Status PostRecvs(int t);
  Status PostSend(int t, size_t c);
  bool SendsFromSegmentDone(int seg);
  Status WaitSendsFromSegment(int seg, const Deadline& deadline);
  void FaultPoint(int t, size_t c);
  void SaveOwnSegment();
  std::string ChunkName(int t, size_t c) const;  // "chunk 2 of allgather ring step 0"
  void ReduceChunk(int t, size_t c);
  Status Fail(Status s);

  Communicator& comm_;
  RingBuffer buf_;
  ReduceOp op_;
  int64_t step_;
  char* undo_;
  UndoStores undo_stores_;  // streamed for large buffers (collectives/stream_copy.h)
  char* staging_;
  int n_, rank_, left_, right_;
  size_t esize_, chunk_elems_, staging_slot_elems_;
  std::vector<MPI_Request> recvs_[2];     // per staging slot (ring step parity)
  std::vector<bool> recvs_posted_;        // per ring step
  std::vector<MPI_Request> sends_;
  std::vector<std::vector<size_t>> segment_sends_;  // indices into sends_
  std::vector<size_t> saved_;             // per segment: elements saved in the undo log
  bool checksums_;
  std::unique_ptr<ChunkSums> sums_;  // with checksums only
};

}  // namespace ftcomm
