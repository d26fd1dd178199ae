#include "collectives/ring_allreduce.h"

#include <algorithm>
#include <cstring>

#include "collectives/checksum.h"
#include "collectives/chunking.h"
#include "collectives/reduce_kernels.h"
#include "collectives/stream_copy.h"
#include "core/mpi_serial.h"
#include "core/tags.h"
#include "fault/injection.h"

namespace ftcomm {
namespace {
constexpr int kRingTag = TagValue(Tag::kRing);
constexpr int kSumTag = TagValue(Tag::kRingSum);
}

RingAllreduce::RingAllreduce(Communicator& comm, const RingBuffer& buf, ReduceOp op,
                             size_t chunk_bytes, int64_t step, char* undo, char* staging, bool checksums)
    : comm_(comm), buf_(buf), op_(op), step_(step), undo_(undo), staging_(staging), checksums_(checksums) {
  n_ = comm.size();
  rank_ = comm.rank();
  left_ = (rank_ - 1 + n_) % n_;
  right_ = (rank_ + 1) % n_;
  esize_ = ElementSize(buf.dtype);
  undo_stores_ = buf.count * esize_ >= kStreamUndoBytes ? UndoStores::kStreamed : UndoStores::kCached;
  chunk_elems_ = ChunkElements(chunk_bytes, esize_, buf.count, n_);
  staging_slot_elems_ = (buf.count + n_ - 1) / n_;
  recvs_posted_.assign(2 * (n_ - 1), false);
  segment_sends_.resize(n_);
  saved_.assign(n_, 0);
  if (checksums_) {
    sums_ = std::make_unique<ChunkSums>(
        "ring allreduce", kSumTag, std::max(2 * (n_ - 1), 0), [this](int t) { return ChunkCount(SendSegment(t)); },
        [this](int t) { return ChunkCount(RecvSegment(t)); });
  }
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
    int rc = Serialized([&] {
      return MPI_Irecv(RecvTarget(t, c), static_cast<int>(length * esize_), MPI_BYTE, left_, kRingTag,
                       comm_.handle(), &slot[c]);
    });
    if (rc != MPI_SUCCESS) return comm_.Classify(rc, "ring allreduce: receive");
  }
  if (checksums_) {
    Status s = sums_->PostReceive(comm_, t, left_);
    if (!s.ok()) return s;
  }
  recvs_posted_[t] = true;
  return Status::Ok();
}

std::string RingAllreduce::ChunkName(int t, size_t c) const {
  const bool rs = IsReduceScatter(t);
  return RingChunkName(rs ? "reduce-scatter" : "allgather", rs ? t : t - (n_ - 1), c);
}

Status RingAllreduce::PostSend(int t, size_t c) {
  const int seg = SendSegment(t);
  size_t offset, length;
  ChunkRange(seg, c, &offset, &length);
  MPI_Request req;
  int rc = Serialized([&] {
    return MPI_Isend(buf_.data + offset * esize_, static_cast<int>(length * esize_), MPI_BYTE, right_, kRingTag,
                     comm_.handle(), &req);
  });
  if (rc != MPI_SUCCESS) return comm_.Classify(rc, "ring allreduce: send");
  // The sums of the input and of reductions were taken as they were written (SaveOwnSegment,
  // ReduceChunk); an allgather step after the first forwards what arrived at the step before.
  if (checksums_ && t >= n_) sums_->sent(t, c) = sums_->got(t - 1, c);
  segment_sends_[seg].push_back(sends_.size());
  sends_.push_back(req);
  return Status::Ok();
}

bool RingAllreduce::SendsFromSegmentDone(int seg) {
  for (size_t i : segment_sends_[seg]) {
    if (sends_[i] == MPI_REQUEST_NULL) continue;
    int done = 0;
    MpiSerial serial;
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

// A chunk has arrived: injected failures and bit flips (as if it were corrupted in transit),
// then its checksum.
void RingAllreduce::FaultPoint(int t, size_t c) {
  const bool rs = IsReduceScatter(t);
  const char* point = rs ? "reduce_scatter" : "allgather";
  const int phase_step = rs ? t : t - (n_ - 1);
  const int world_rank = comm_.world_ranks()[rank_];
  fault::Point(point, world_rank, step_, phase_step, static_cast<int>(c));
  size_t offset, length;
  ChunkRange(RecvSegment(t), c, &offset, &length);
  char* data = RecvTarget(t, c);
  fault::Flip(point, world_rank, step_, phase_step, static_cast<int>(c), data, length * esize_);
  // A reduce-scatter chunk is summed as it is reduced (ReduceChunk); an allgather chunk here,
  // just after it landed.
  if (checksums_ && !rs) sums_->got(t, c) = WordSum(data, length * esize_);
}

// Segment `rank` is sent unreduced at ring step 0 and later overwritten by the allgather: save
// it in the undo log, and with checksums take each chunk's sum while copying.
void RingAllreduce::SaveOwnSegment() {
  if (undo_ == nullptr) return;  // uncommitted: nothing is ever restored
  const size_t own_off = SegmentOffset(rank_), own_len = SegmentLength(rank_);
  if (!checksums_) {
    char* const to = undo_ + own_off * esize_;
    const char* const from = buf_.data + own_off * esize_;
    if (undo_stores_ == UndoStores::kStreamed) {
      StreamCopy(to, from, own_len * esize_);
    } else {
      std::memcpy(to, from, own_len * esize_);
    }
  } else {
    for (size_t c = 0; c < ChunkCount(rank_); ++c) {
      size_t offset, length;
      ChunkRange(rank_, c, &offset, &length);
      sums_->sent(0, c) = CopyAndSum(undo_ + offset * esize_, buf_.data + offset * esize_, length * esize_);
    }
  }
  saved_[rank_] = own_len;
}

// Reduce-scatter step t: reduces the arrived chunk c into the user's buffer (old values to the
// undo log; the average's division at the last step). With checksums, the sums of the arrived
// data (checked against its sender's) and of the result (sent at the next ring step) are taken in
// the reduction's loop; the average's last step sums its scaled result once more.
void RingAllreduce::ReduceChunk(int t, size_t c) {
  size_t offset, length;
  ChunkRange(RecvSegment(t), c, &offset, &length);
  const char* in = RecvTarget(t, c);
  char* user = buf_.data + offset * esize_;
  char* undo = undo_ == nullptr ? nullptr : undo_ + offset * esize_;
  const bool scale = t == n_ - 2 && op_ == ReduceOp::kAvg;
  if (undo_ == nullptr) {
    ReduceInto(buf_.dtype, op_, in, user, length);
  } else if (checksums_) {
    ReduceIntoWithUndoSum(buf_.dtype, op_, in, user, undo, length, &sums_->got(t, c), &sums_->sent(t + 1, c));
  } else {
    ReduceIntoWithUndo(buf_.dtype, op_, in, user, undo, length, undo_stores_);
  }
  if (scale) ScaleForAvg(buf_.dtype, user, length, n_);
  if (scale && checksums_) sums_->sent(t + 1, c) = WordSum(user, length * esize_);
  saved_[RecvSegment(t)] += length;
}

Status RingAllreduce::Fail(Status s) {
  for (auto& slot : recvs_) comm_.Drain(slot.data(), static_cast<int>(slot.size()));
  comm_.Drain(sends_.data(), static_cast<int>(sends_.size()));
  if (sums_) sums_->Drain(comm_);
  return s;
}

Status RingAllreduce::Run(const Deadline& deadline) {
  if (n_ == 1 || buf_.count == 0) return Status::Ok();
  const int steps = 2 * (n_ - 1);

  SaveOwnSegment();
  Status s = PostRecvs(0);
  for (size_t c = 0; s.ok() && c < ChunkCount(SendSegment(0)); ++c) s = PostSend(0, c);
  if (s.ok() && checksums_) s = sums_->PostSend(comm_, 0, right_);
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
      if (IsReduceScatter(t)) ReduceChunk(t, c);
      if (t + 1 < steps) {
        s = PostSend(t + 1, c);
        if (!s.ok()) return Fail(s);
      }
    }
    if (t + 1 < steps && checksums_) {
      s = sums_->PostSend(comm_, t + 1, right_);
      if (!s.ok()) return Fail(s);
    }
  }
  s = comm_.Wait(sends_.data(), static_cast<int>(sends_.size()), deadline, "ring allreduce: send");
  if (s.ok() && checksums_) s = sums_->Verify(comm_, deadline, left_, [this](int t, size_t c) { return ChunkName(t, c); });
  if (!s.ok() && s.code != StatusCode::kCorruption) return Fail(s);
  return s;
}

void RingAllreduce::Undo() {
  if (undo_ == nullptr) return;
  for (int seg = 0; seg < n_; ++seg) {
    const size_t off = SegmentOffset(seg) * esize_;
    std::memcpy(buf_.data + off, undo_ + off, saved_[seg] * esize_);
  }
}

}  // namespace ftcomm
