#include "collectives/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "collectives/reduce_kernels.h"
#include "core/tags.h"
#include "fault/injection.h"

namespace ftcomm {
namespace {
constexpr int kRingTag = TagValue(Tag::kRing);
}

RingAllreduce::RingAllreduce(Communicator& comm, const RingBuffer& buf, ReduceOp op,
                             size_t chunk_bytes, int64_t step, char* undo, char* staging)
    : comm_(comm), buf_(buf), op_(op), step_(step), undo_(undo), staging_(staging) {
  n_ = comm.size();
  rank_ = comm.rank();
  left_ = (rank_ - 1 + n_) % n_;
  right_ = (rank_ + 1) % n_;
  esize_ = ElementSize(buf.dtype);
  chunk_elems_ = std::max<size_t>(1, chunk_bytes / esize_);
  staging_slot_elems_ = (buf.count + n_ - 1) / n_;
  recvs_posted_.assign(2 * (n_ - 1), false);
  segment_sends_.resize(n_);
  saved_.assign(n_, 0);
}

// Ring step t < N-1 is reduce-scatter step t; t >= N-1 is allgather step t-(N-1). After
// reduce-scatter, rank r holds the fully reduced segment r+1.
int RingAllreduce::SendSegment(int t) const {
  const int k = IsReduceScatter(t) ? t : t - (n_ - 1);
  const int base = IsReduceScatter(t) ? rank_ : rank_ + 1;
  return ((base - k) % n_ + n_) % n_;
}

int RingAllreduce::RecvSegment(int t) const {
  const int k = IsReduceScatter(t) ? t + 1 : t - (n_ - 1);
  return ((rank_ - k) % n_ + n_) % n_;
}

size_t RingAllreduce::SegmentOffset(int seg) const {
  const size_t base = buf_.count / n_, extra = buf_.count % n_;
  return seg * base + std::min<size_t>(seg, extra);
}

size_t RingAllreduce::SegmentLength(int seg) const {
  return buf_.count / n_ + (static_cast<size_t>(seg) < buf_.count % n_ ? 1 : 0);
}

size_t RingAllreduce::ChunkCount(int seg) const {
  return (SegmentLength(seg) + chunk_elems_ - 1) / chunk_elems_;
}

void RingAllreduce::ChunkRange(int seg, size_t c, size_t* offset, size_t* length) const {
  const size_t start = c * chunk_elems_;
  *offset = SegmentOffset(seg) + start;
  *length = std::min(chunk_elems_, SegmentLength(seg) - start);
}

// Reduce-scatter receives into a staging slot (the user's buffer still holds this rank's
// input there); allgather receives straight into the user's buffer (already in the undo log).
char* RingAllreduce::RecvTarget(int t, size_t c) {
  size_t offset, length;
  ChunkRange(RecvSegment(t), c, &offset, &length);
  if (!IsReduceScatter(t)) return buf_.data + offset * esize_;
  const size_t in_segment = offset - SegmentOffset(RecvSegment(t));
  return staging_ + ((t % 2) * staging_slot_elems_ + in_segment) * esize_;
}

Status RingAllreduce::PostRecvs(int t) {
  const int seg = RecvSegment(t);
  std::vector<MPI_Request>& slot = recvs_[t % 2];
  slot.assign(ChunkCount(seg), MPI_REQUEST_NULL);
  for (size_t c = 0; c < slot.size(); ++c) {
    size_t offset, length;
    ChunkRange(seg, c, &offset, &length);
    int rc = MPI_Irecv(RecvTarget(t, c), static_cast<int>(length * esize_), MPI_BYTE, left_,
                       kRingTag, comm_.handle(), &slot[c]);
    if (rc != MPI_SUCCESS) return comm_.Classify(rc, "ring allreduce: receive");
  }
  recvs_posted_[t] = true;
  return Status::Ok();
}

Status RingAllreduce::PostSend(int t, size_t c) {
  const int seg = SendSegment(t);
  size_t offset, length;
  ChunkRange(seg, c, &offset, &length);
  MPI_Request req;
  int rc = MPI_Isend(buf_.data + offset * esize_, static_cast<int>(length * esize_), MPI_BYTE,
                     right_, kRingTag, comm_.handle(), &req);
  if (rc != MPI_SUCCESS) return comm_.Classify(rc, "ring allreduce: send");
  segment_sends_[seg].push_back(sends_.size());
  sends_.push_back(req);
  return Status::Ok();
}

bool RingAllreduce::SendsFromSegmentDone(int seg) {
  for (size_t i : segment_sends_[seg]) {
    if (sends_[i] == MPI_REQUEST_NULL) continue;
    int done = 0;
    if (MPI_Test(&sends_[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (!done) return false;
  }
  return true;
}

Status RingAllreduce::WaitSendsFromSegment(int seg, const Deadline& deadline) {
  for (size_t i : segment_sends_[seg]) {
    Status s = comm_.Wait(&sends_[i], 1, deadline, "ring allreduce: send");
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

void RingAllreduce::FaultPoint(int t, size_t c) const {
  if (IsReduceScatter(t)) {
    fault::Point("reduce_scatter", comm_.world_ranks()[rank_], step_, t, static_cast<int>(c));
  } else {
    fault::Point("allgather", comm_.world_ranks()[rank_], step_, t - (n_ - 1), static_cast<int>(c));
  }
}

Status RingAllreduce::Fail(Status s) {
  for (auto& slot : recvs_) comm_.Drain(slot.data(), static_cast<int>(slot.size()));
  comm_.Drain(sends_.data(), static_cast<int>(sends_.size()));
  return s;
}

Status RingAllreduce::Run(const Deadline& deadline) {
  if (n_ == 1 || buf_.count == 0) return Status::Ok();
  const int steps = 2 * (n_ - 1);

  // Segment `rank` is sent unreduced and later overwritten by the allgather: save it now.
  const size_t own_off = SegmentOffset(rank_), own_len = SegmentLength(rank_);
  std::memcpy(undo_ + own_off * esize_, buf_.data + own_off * esize_, own_len * esize_);
  saved_[rank_] = own_len;

  Status s = PostRecvs(0);
  for (size_t c = 0; s.ok() && c < ChunkCount(SendSegment(0)); ++c) s = PostSend(0, c);
  if (!s.ok()) return Fail(s);

  for (int t = 0; t < steps; ++t) {
    const int seg = RecvSegment(t);
    if (!recvs_posted_[t]) {
      // An allgather step writes into the user's buffer: no send may still read from there.
      if (!IsReduceScatter(t)) s = WaitSendsFromSegment(seg, deadline);
      if (s.ok()) s = PostRecvs(t);
      if (!s.ok()) return Fail(s);
    }
    // Pre-post the next step's receives when their target is free, so the left neighbour's
    // sends find a matching receive.
    if (t + 1 < steps && (IsReduceScatter(t + 1) || SendsFromSegmentDone(RecvSegment(t + 1)))) {
      s = PostRecvs(t + 1);
      if (!s.ok()) return Fail(s);
    }
    std::vector<MPI_Request>& slot = recvs_[t % 2];
    for (size_t c = 0; c < slot.size(); ++c) {
      s = comm_.Wait(&slot[c], 1, deadline, IsReduceScatter(t) ? "reduce-scatter" : "allgather");
      if (!s.ok()) return Fail(s);
      FaultPoint(t, c);
      if (IsReduceScatter(t)) {
        size_t offset, length;
        ChunkRange(seg, c, &offset, &length);
        char* user = buf_.data + offset * esize_;
        ReduceIntoWithUndo(buf_.dtype, op_, RecvTarget(t, c), user, undo_ + offset * esize_, length);
        saved_[seg] += length;
        if (t == n_ - 2 && op_ == ReduceOp::kAvg) ScaleForAvg(buf_.dtype, user, length, n_);
      }
      if (t + 1 < steps) {
        s = PostSend(t + 1, c);
        if (!s.ok()) return Fail(s);
      }
    }
  }
  s = comm_.Wait(sends_.data(), static_cast<int>(sends_.size()), deadline, "ring allreduce: send");
  if (!s.ok()) return Fail(s);
  return Status::Ok();
}

void RingAllreduce::Undo() {
  for (int seg = 0; seg < n_; ++seg) {
    const size_t off = SegmentOffset(seg) * esize_;
    std::memcpy(buf_.data + off, undo_ + off, saved_[seg] * esize_);
  }
}

}  // namespace ftcomm
