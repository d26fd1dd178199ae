#include "collectives/exchange.h"

#include <algorithm>
#include <climits>
#include <string>

#include "core/mpi_serial.h"

namespace ftcomm {
namespace {

// MPI counts are ints: larger transfers go as several messages of at most 1 GiB.
constexpr size_t kMaxMessage = size_t(1) << 30;

Status Post(Communicator& comm, const Transfer& t, int tag, bool is_send,
            std::vector<MPI_Request>* requests) {
  if (t.peer < 0 || t.peer >= comm.size()) {
    return Status::Error(StatusCode::kInvalidInput, "exchange: peer rank " + std::to_string(t.peer) +
                                                        " is outside the communicator");
  }
  size_t done = 0;
  do {
    const size_t n = std::min(kMaxMessage, t.bytes - done);
    MPI_Request req;
    int rc = Serialized([&] {
      return is_send ? MPI_Isend(t.data + done, static_cast<int>(n), MPI_BYTE, t.peer, tag, comm.handle(), &req)
                     : MPI_Irecv(t.data + done, static_cast<int>(n), MPI_BYTE, t.peer, tag, comm.handle(), &req);
    });
    if (rc != MPI_SUCCESS) return comm.Classify(rc, is_send ? "exchange: send" : "exchange: receive");
    requests->push_back(req);
    done += n;
  } while (done < t.bytes);
  return Status::Ok();
}

}  // namespace

Status Exchange(Communicator& comm, const std::vector<Transfer>& sends,
                const std::vector<Transfer>& recvs, int tag, double timeout_s) {
  if (comm.IsRevoked()) {
    return Status::Error(StatusCode::kRevoked, "exchange on a revoked communicator: recover first");
  }
  liveness::ActivityScope activity(liveness::Activity::kExchange, comm.last_committed_step());
  std::vector<MPI_Request> requests;
  std::vector<int> peers;  // judged if the deadline passes: only these can keep this wait
  Status s;
  for (const Transfer& t : recvs) {
    if (s.ok()) s = Post(comm, t, tag, false, &requests);
    peers.push_back(t.peer);
  }
  for (const Transfer& t : sends) {
    if (s.ok()) s = Post(comm, t, tag, true, &requests);
    peers.push_back(t.peer);
  }
  if (s.ok()) {
    s = comm.Wait(requests.data(), static_cast<int>(requests.size()), Deadline(timeout_s), "exchange", &peers);
  }
  if (!s.ok()) {
    comm.Drain(requests.data(), static_cast<int>(requests.size()));  // revokes first
  }
  return s;
}

}  // namespace ftcomm
