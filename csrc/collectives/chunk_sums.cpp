#include "collectives/chunk_sums.h"

#include "core/mpi_serial.h"

namespace ftcomm {

std::string RingChunkName(const char* phase, int ring_step, size_t chunk) {
  return "chunk " + std::to_string(chunk) + " of " + phase + " ring step " + std::to_string(ring_step);
}

ChunkSums::ChunkSums(const char* name, int tag, int steps, const std::function<size_t(int)>& send_chunks,
                     const std::function<size_t(int)>& recv_chunks)
    : name_(name), tag_(tag) {
  sent_.resize(steps);
  got_.resize(steps);
  expected_.resize(steps);
  for (int t = 0; t < steps; ++t) {
    sent_[t].assign(send_chunks(t), 0);
    got_[t].assign(recv_chunks(t), 0);
    expected_[t].assign(recv_chunks(t), 0);
  }
}

Status ChunkSums::PostReceive(Communicator& comm, int t, int left) {
  if (expected_[t].empty()) return Status::Ok();
  MPI_Request req;
  int rc = Serialized([&] {
    return MPI_Irecv(expected_[t].data(), static_cast<int>(expected_[t].size()), MPI_UINT32_T, left, tag_,
                     comm.handle(), &req);
  });
  if (rc != MPI_SUCCESS) return comm.Classify(rc, std::string(name_) + ": receive checksums");
  requests_.push_back(req);
  return Status::Ok();
}

Status ChunkSums::PostSend(Communicator& comm, int t, int right) {
  if (sent_[t].empty()) return Status::Ok();
  MPI_Request req;
  int rc = Serialized([&] {
    return MPI_Isend(sent_[t].data(), static_cast<int>(sent_[t].size()), MPI_UINT32_T, right, tag_,
                     comm.handle(), &req);
  });
  if (rc != MPI_SUCCESS) return comm.Classify(rc, std::string(name_) + ": send checksums");
  requests_.push_back(req);
  return Status::Ok();
}

Status ChunkSums::Verify(Communicator& comm, const Deadline& deadline, int left,
                         const std::function<std::string(int t, size_t c)>& where) {
  const std::string what = std::string(name_) + ": checksums";
  Status s = comm.Wait(requests_.data(), static_cast<int>(requests_.size()), deadline, what.c_str());
  if (!s.ok()) return s;
  for (size_t t = 0; t < got_.size(); ++t) {
    for (size_t c = 0; c < got_[t].size(); ++c) {
      if (got_[t][c] == expected_[t][c]) continue;
      Status bad = Status::Error(StatusCode::kCorruption, "checksum mismatch in " + where(static_cast<int>(t), c) +
                                                              " received from rank " + std::to_string(left));
      bad.failed_ranks = {left, comm.rank()};
      return bad;
    }
  }
  return Status::Ok();
}

void ChunkSums::Drain(Communicator& comm) { comm.Drain(requests_.data(), static_cast<int>(requests_.size())); }

}  // namespace ftcomm
