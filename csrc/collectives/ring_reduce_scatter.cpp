#include "collectives/ring_reduce_scatter.h"

#include <algorithm>
#include <cstring>

#include "collectives/checksum.h"
#include "collectives/chunking.h"
#include "collectives/reduce_kernels.h"
#include "core/mpi_serial.h"
#include "core/tags.h"
#include "fault/injection.h"

namespace ftcomm {
namespace {
constexpr int kTag = TagValue(Tag::kReduceScatter);
constexpr int kSumTag = TagValue(Tag::kReduceScatterSum);
}

RingReduceScatter::RingReduceScatter(Communicator& comm, const RingBuffer& input, ReduceOp op,
                                     size_t chunk_bytes, int64_t step, char* scratch, bool checksums)
    : comm_(comm), in_(input), op_(op), step_(step), checksums_(checksums) {
  n_ = comm.size();
  rank_ = comm.rank();
  left_ = (rank_ - 1 + n_) % n_;
  right_ = (rank_ + 1) % n_;
  esize_ = ElementSize(input.dtype);
  chunk_elems_ = ChunkElements(chunk_bytes, esize_, input.count, n_);
  seg_len_ = input.count / n_;
  staging_ = scratch;
  acc_ = scratch + 2 * seg_len_ * esize_;
  result_ = scratch + 4 * seg_len_ * esize_;
  recvs_posted_.assign(std::max(n_ - 1, 0), false);
  sends_.resize(std::max(n_ - 1, 0));
  if (checksums_) {
    auto chunks = [this](int) { return ChunkCount(); };
    sums_ = std::make_unique<ChunkSums>("reduce-scatter", kSumTag, std::max(n_ - 1, 0), chunks, chunks);
  }
}

size_t RingReduceScatter::ChunkLength(size_t c) const {
  return std::min(chunk_elems_, seg_len_ - c * chunk_elems_);
}

char* RingReduceScatter::Slot(char* base, int parity, size_t c) const {
  return base + (parity * seg_len_ + c * chunk_elems_) * esize_;
}

// Step 0 sends the rank's own input; step t > 0 the accumulator written at step t-1.
const char* RingReduceScatter::SendSource(int t, size_t c) const {
  if (t == 0) return in_.data + (SendSegment(0) * seg_len_ + c * chunk_elems_) * esize_;
  return Slot(acc_, (t - 1) % 2, c);
}

Status RingReduceScatter::PostRecvs(int t) {
  std::vector<MPI_Request>& slot = recvs_[t % 2];
  slot.assign(ChunkCount(), MPI_REQUEST_NULL);
  for (size_t c = 0; c < slot.size(); ++c) {
    int rc = Serialized([&] {
      return MPI_Irecv(Slot(staging_, t % 2, c), static_cast<int>(ChunkLength(c) * esize_), MPI_BYTE, left_, kTag,
                       comm_.handle(), &slot[c]);
    });
    if (rc != MPI_SUCCESS) return comm_.Classify(rc, "reduce-scatter: receive");
  }
  if (checksums_) {
    Status s = sums_->PostReceive(comm_, t, left_);
    if (!s.ok()) return s;
  }
  recvs_posted_[t] = true;
  return Status::Ok();
}

Status RingReduceScatter::PostSend(int t, size_t c) {
  // Step 0 sends input no loop of the ring reads: summed here. Later steps send reductions,
  // summed as they were written (ReduceChunk).
  if (checksums_ && t == 0) sums_->sent(0, c) = WordSum(SendSource(0, c), ChunkLength(c) * esize_);
  MPI_Request req;
  int rc = Serialized([&] {
    return MPI_Isend(SendSource(t, c), static_cast<int>(ChunkLength(c) * esize_), MPI_BYTE, right_, kTag,
                     comm_.handle(), &req);
  });
  if (rc != MPI_SUCCESS) return comm_.Classify(rc, "reduce-scatter: send");
  sends_[t].push_back(req);
  return Status::Ok();
}

Status RingReduceScatter::WaitSends(int t, const Deadline& deadline) {
  std::vector<MPI_Request>& reqs = sends_[t];
  return comm_.Wait(reqs.data(), static_cast<int>(reqs.size()), deadline, "reduce-scatter: send");
}

// Chunk c of ring step t has arrived: injected faults (a bit flip as if in transit), then the
// reduction with this rank's input, out of place, with the sums in its loop.
void RingReduceScatter::ReduceChunk(int t, size_t c) {
  const int world_rank = comm_.world_ranks()[rank_];
  const size_t len = ChunkLength(c);
  char* arrived = Slot(staging_, t % 2, c);
  fault::Point("reduce_scatter", world_rank, step_, t, static_cast<int>(c));
  fault::Flip("reduce_scatter", world_rank, step_, t, static_cast<int>(c), arrived, len * esize_);
  const bool last = t == n_ - 2;
  char* out = last ? result_ + c * chunk_elems_ * esize_ : Slot(acc_, t % 2, c);
  const char* own = in_.data + (RecvSegment(t) * seg_len_ + c * chunk_elems_) * esize_;
  if (checksums_) {
    uint32_t out_sum;  // the last step's result is not sent on
    ReduceOutOfPlaceSum(in_.dtype, op_, arrived, own, out, len, &sums_->got(t, c),
                        last ? &out_sum : &sums_->sent(t + 1, c));
  } else {
    ReduceOutOfPlace(in_.dtype, op_, arrived, own, out, len);
  }
  if (last && op_ == ReduceOp::kAvg) ScaleForAvg(in_.dtype, out, len, n_);
}

Status RingReduceScatter::Fail(Status s) {
  for (auto& slot : recvs_) comm_.Drain(slot.data(), static_cast<int>(slot.size()));
  for (auto& reqs : sends_) comm_.Drain(reqs.data(), static_cast<int>(reqs.size()));
  if (sums_) sums_->Drain(comm_);
  return s;
}

Status RingReduceScatter::Run(const Deadline& deadline) {
  if (n_ == 1 || seg_len_ == 0) {
    std::memcpy(result_, in_.data + rank_ * seg_len_ * esize_, seg_len_ * esize_);
    return Status::Ok();
  }
  const int steps = n_ - 1;
  Status s = PostRecvs(0);
  for (size_t c = 0; s.ok() && c < ChunkCount(); ++c) s = PostSend(0, c);
  if (s.ok() && checksums_) s = sums_->PostSend(comm_, 0, right_);
  if (!s.ok()) return Fail(s);

  for (int t = 0; t < steps; ++t) {
    // Slot (t+1) % 2 was last read by step t-1's reductions, all done: pre-post, so that the left
    // neighbour's sends find a matching receive.
    if (t + 1 < steps) {
      s = PostRecvs(t + 1);
      if (!s.ok()) return Fail(s);
    }
    const bool last = t == steps - 1;
    // The accumulator this step writes was the source of step t-1's sends.
    if (!last && t >= 2) {
      s = WaitSends(t - 1, deadline);
      if (!s.ok()) return Fail(s);
    }
    std::vector<MPI_Request>& slot = recvs_[t % 2];
    for (size_t c = 0; c < slot.size(); ++c) {
      s = comm_.Wait(&slot[c], 1, deadline, "reduce-scatter");
      if (!s.ok()) return Fail(s);
      ReduceChunk(t, c);
      if (!last) {
        s = PostSend(t + 1, c);
        if (!s.ok()) return Fail(s);
      }
    }
    if (!last && checksums_) {
      s = sums_->PostSend(comm_, t + 1, right_);
      if (!s.ok()) return Fail(s);
    }
  }
  for (int t = 0; t < steps; ++t) {
    s = WaitSends(t, deadline);
    if (!s.ok()) return Fail(s);
  }
  if (checksums_) {
    s = sums_->Verify(comm_, deadline, left_, [](int t, size_t c) { return RingChunkName("reduce-scatter", t, c); });
    if (!s.ok() && s.code != StatusCode::kCorruption) return Fail(s);
  }
  return s;
}

}  // namespace ftcomm
