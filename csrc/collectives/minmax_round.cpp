#include "collectives/minmax_round.h"

#include <algorithm>

#include "core/liveness.h"
#include "core/mpi_serial.h"
#include "core/tags.h"

namespace ftcomm {
namespace {

constexpr int kTag = TagValue(Tag::kValidate);

// Every message of a round: this header, then the (v, -v) pairs. The "seen" words are the record
// of a mismatch: the rank that received a message it could not merge (-1: none yet), its own round
// and count, and the sender's. Of two records the one seen by the higher rank is kept, so that a
// record only ever changes towards one answer. "Rejected by" is the highest rank that could not
// bring its values (one was outside the range; -1: none), merged from every message.
enum Word {
  kKind, kCount, kSeenBy, kSeenByKind, kSeenByCount, kSeenFrom, kSeenFromKind, kSeenFromCount, kRejectedBy, kHeader
};

// Merges a message from `source` into `mine` (this rank's message for the next round).
void Merge(int rank, int source, const std::vector<int64_t>& in, std::vector<int64_t>* mine) {
  std::vector<int64_t>& out = *mine;
  const bool whole = in.size() >= kHeader;
  if (whole) out[kRejectedBy] = std::max(out[kRejectedBy], in[kRejectedBy]);
  if (whole && in[kSeenBy] > out[kSeenBy]) {
    std::copy(in.begin() + kSeenBy, in.begin() + kSeenFromCount + 1, out.begin() + kSeenBy);
  }
  const bool same = whole && in[kKind] == out[kKind] && in[kCount] == out[kCount] && in.size() == out.size();
  if (same) {
    for (size_t i = kHeader; i < out.size(); ++i) out[i] = std::max(out[i], in[i]);
    return;
  }
  if (rank <= out[kSeenBy]) return;
  out[kSeenBy] = rank;
  out[kSeenByKind] = out[kKind];
  out[kSeenByCount] = out[kCount];
  out[kSeenFrom] = source;
  out[kSeenFromKind] = whole ? in[kKind] : 0;
  out[kSeenFromCount] = whole ? in[kCount] : static_cast<int64_t>(in.size());
}

Status MismatchError(const Communicator& comm, const std::vector<int64_t>& record) {
  const std::string by = RankName(comm, record[kSeenBy]), from = RankName(comm, record[kSeenFrom]);
  std::string why;
  if (record[kSeenByKind] == record[kSeenFromKind]) {
    why = "ranks passed different numbers of values to " + std::string(RoundKindText(record[kSeenByKind])) + " (" +
          by + ": " + std::to_string(record[kSeenByCount]) + ", " + from + ": " +
          std::to_string(record[kSeenFromCount]) + ")";
  } else {
    why = "ranks called different collectives: " + from + " is in " + RoundKindText(record[kSeenFromKind]) + ", " +
          by + " in " + RoundKindText(record[kSeenByKind]);
  }
  return Status::Error(StatusCode::kCollectiveMismatch,
                       why + " (every rank must call the same collectives in the same order)");
}

}  // namespace

const char* RoundKindText(int64_t kind) {
  switch (static_cast<RoundKind>(kind)) {
    case RoundKind::kAllreduce: return "an allreduce's input validation";
    case RoundKind::kReduceScatter: return "a reduce-scatter's input validation";
    case RoundKind::kMinMax: return "a min/max round (Communicator.minmax)";
    case RoundKind::kAllgather: return "an allgather's input check";
    case RoundKind::kBroadcast: return "a broadcast's input check";
  }
  return "an unknown round";
}

std::string RankName(const Communicator& comm, int64_t rank) {
  std::string out = "rank " + std::to_string(rank);
  if (rank >= 0 && rank < comm.size()) out += " (world rank " + std::to_string(comm.world_ranks()[rank]) + ")";
  return out;
}

Status MinMaxRound(Communicator& comm, RoundKind kind, const std::vector<int64_t>& values,
                   std::vector<int64_t>* mins, std::vector<int64_t>* maxs, const Deadline& deadline,
                   bool values_rejected) {
  const size_t n = values.size();
  std::vector<int64_t> out(kHeader + 2 * n, 0), in;
  out[kKind] = static_cast<int64_t>(kind);
  out[kCount] = static_cast<int64_t>(n);
  out[kSeenBy] = -1;
  out[kRejectedBy] = values_rejected ? comm.rank() : -1;
  for (size_t i = 0; i < n; ++i) {
    out[kHeader + i] = values[i];
    out[kHeader + n + i] = -values[i];
  }
  const int size = comm.size(), rank = comm.rank();
  for (int dist = 1; dist < size; dist *= 2) {
    const int source = (rank - dist + size) % size;
    MPI_Request send;
    int rc = Serialized([&] {
      return MPI_Isend(out.data(), static_cast<int>(out.size()), MPI_INT64_T, (rank + dist) % size, kTag,
                       comm.handle(), &send);
    });
    if (rc != MPI_SUCCESS) return comm.Classify(rc, "validation");
    Status s = comm.ReceiveWhole(source, kTag, deadline, "validation", &in);
    if (s.ok()) s = comm.Wait(&send, 1, deadline, "validation");
    if (!s.ok()) {
      comm.Drain(&send, 1);
      return s;
    }
    Merge(rank, source, in, &out);  // after the send completed: `out` is its buffer
  }
  if (out[kSeenBy] >= 0) return MismatchError(comm, out);
  if (out[kRejectedBy] >= 0) {
    return Status::Error(StatusCode::kInvalidInput, RankName(comm, out[kRejectedBy]) +
                                                        " passed a value outside (-2**63, 2**63) to " +
                                                        RoundKindText(static_cast<int64_t>(kind)));
  }
  maxs->assign(out.begin() + kHeader, out.begin() + kHeader + n);
  mins->resize(n);
  for (size_t i = 0; i < n; ++i) (*mins)[i] = -out[kHeader + n + i];
  return Status::Ok();
}

Status MinMaxAcrossRanks(Communicator& comm, RoundKind kind, const std::vector<int64_t>& values,
                         std::vector<int64_t>* mins, std::vector<int64_t>* maxs, double timeout_s,
                         bool values_rejected) {
  if (comm.IsRevoked()) {
    return Status::Error(StatusCode::kRevoked, "validation on a revoked communicator: call recover() first");
  }
  // Published so that a peer whose own wait times out sees this rank inside ftcomm (named, never
  // fenced) rather than late in its own code; inside an allreduce the allreduce's scope stays.
  liveness::ActivityScope activity(liveness::Activity::kValidate, comm.last_committed_step());
  return MinMaxRound(comm, kind, values, mins, maxs, Deadline(timeout_s), values_rejected);
}

}  // namespace ftcomm
