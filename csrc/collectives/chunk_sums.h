// The transit guard's bookkeeping for one ring collective: per ring step and chunk, the
// checksum (collectives/checksum.h) of what this rank sent, of what arrived (taken here), and what
// the sender says it sent. Each ring step's sent sums travel in one small message to the ring
// successor after that step's chunks, on a tag of their own; the receiver compares once its ring
// is done, so a mismatch never stops the ring (every request completes, then kCorruption).
// Used by the ring allreduce and the ring reduce-scatter.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/communicator.h"
#include "core/deadline.h"
#include "core/status.h"

namespace ftcomm {

// "chunk 2 of allgather ring step 0": how the rings name a chunk in their errors.
std::string RingChunkName(const char* phase, int ring_step, size_t chunk);

class ChunkSums {
 public:
  // `name` starts error messages; `send_chunks(t)` and `recv_chunks(t)`: how many chunks ring
  // step t sends and receives.
  ChunkSums(const char* name, int tag, int steps, const std::function<size_t(int)>& send_chunks,
            const std::function<size_t(int)>& recv_chunks);

  uint32_t& sent(int t, size_t c) { return sent_[t][c]; }
  uint32_t& got(int t, size_t c) { return got_[t][c]; }

  // Posts the receive of the sender's sums of ring step t (from `left`).
  Status PostReceive(Communicator& comm, int t, int left);
  // Sends this rank's sums of ring step t (to `right`), once they are all taken.
  Status PostSend(Communicator& comm, int t, int right);
  // Waits for every sums message, then compares. kCorruption names the first chunk whose sums
  // differ, in `where(t, c)`'s words; failed_ranks = {left, this rank}.
  Status Verify(Communicator& comm, const Deadline& deadline, int left,
                const std::function<std::string(int t, size_t c)>& where);
  // Cancels or completes the outstanding sums messages after a failed ring.
  void Drain(Communicator& comm);

 private:
  const char* name_;
  int tag_;
  std::vector<std::vector<uint32_t>> sent_, got_, expected_;
  std::vector<MPI_Request> requests_;
};

}  // namespace ftcomm
