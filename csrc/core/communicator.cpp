#include "core/communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "core/liveness.h"
#include "core/mpi_compat.h"
#include "core/watchdog.h"

namespace ftcomm {
namespace {

std::string RankList(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

// Translates every rank of `from` into `to`'s numbering (MPI_UNDEFINED becomes -1).
std::vector<int> TranslateAll(MPI_Comm from, MPI_Comm to) {
  MPI_Group from_group, to_group;
  MPI_Comm_group(from, &from_group);
  MPI_Comm_group(to, &to_group);
  int n = 0;
  MPI_Group_size(from_group, &n);
  std::vector<int> ranks(n), out(n);
  std::iota(ranks.begin(), ranks.end(), 0);
  MPI_Group_translate_ranks(from_group, n, ranks.data(), to_group, out.data());
  for (int& r : out) r = (r == MPI_UNDEFINED) ? -1 : r;
  MPI_Group_free(&from_group);
  MPI_Group_free(&to_group);
  return out;
}

// Polls politely: ranks often outnumber cores (4 ranks on 2 cores here), and a rank that spins
// without yielding steals the time its peers need to make the progress it is waiting for.
void Backoff(int idle_polls) {
  if (idle_polls > 64) sched_yield();
  if (idle_polls > 20000) usleep(50);
}

// A wait's deadline, extended once by a grace period when the wait fenced a stuck peer: ULFM needs
// a moment to report the rank we killed, and a uniform ProcFailedError beats a local timeout.
// A peer silent for longer than this (seconds) is not polling ftcomm: it is computing, or stuck.
constexpr double kSilentSeconds = 1.0;

bool GiveUp(const Deadline& deadline, liveness::FenceTimer* fence,
            const std::vector<int>& world_ranks) {
  if (!deadline.expired()) return false;
  fence->Poll(/*force=*/true);  // one last look before giving up
  const double overrun = -deadline.seconds_left();
  if (fence->fenced()) return overrun > liveness::kFenceGraceSeconds;
  // A silent peer that will reach the fence timeout within another timeout of this call may be
  // stuck: wait until it is fenced rather than time out a moment before, so that every survivor
  // sees the same process failure. The overrun is bounded by the call's own timeout (plus 1 s).
  const double silence = liveness::LongestSilence(world_ranks);
  const double needed = std::max(kSilentSeconds, liveness::FenceTimeout() - deadline.timeout_seconds());
  return overrun > deadline.timeout_seconds() + 1.0 || silence < needed;
}

}  // namespace

Communicator::Communicator(MPI_Comm comm) : comm_(comm), ft_enabled_(FtEnabled()) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  world_ranks_ = TranslateAll(comm_, MPI_COMM_WORLD);
}

Communicator::~Communicator() {
  // Python may collect the last handle after MPI_Finalize, when no MPI call is allowed.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Freeing a communicator that saw a failure is not safe on every MPI; such handles are left
  // to MPI_Finalize (a few bytes each).
  if (comm_ != MPI_COMM_NULL && !failure_seen_ && !IsRevoked()) MPI_Comm_free(&comm_);
}

Status Communicator::Create(MPI_Comm parent, double timeout_s, std::unique_ptr<Communicator>* out) {
  liveness::Register();  // publish pid and heartbeat, so that peers can fence this rank if it hangs
  MPI_Comm dup = MPI_COMM_NULL;
  int rc;
  {
    watchdog::Guard guard(timeout_s, "MPI_Comm_dup");
    rc = MPI_Comm_dup(parent, &dup);
  }
  if (rc != MPI_SUCCESS) {
    return Status::Error(StatusCode::kMpiError, "MPI_Comm_dup failed: " + MpiErrorString(rc));
  }
  std::unique_ptr<Communicator> comm(new Communicator(dup));
  Status s = comm->SyncNew(timeout_s);
  if (!s.ok()) return s;
  *out = std::move(comm);
  return Status::Ok();
}

Status Communicator::SyncNew(double timeout_s) {
  int flag = 1;
  bool saw_failure = false;
  Status s = Agree(&flag, timeout_s, &saw_failure);
  if (s.ok() && saw_failure) {
    return Status::Error(StatusCode::kProcFailed, "a rank failed while the communicator was created");
  }
  return s;
}

Status Communicator::Revoke() {
  if (!ft_enabled_) {
    return Status::Error(StatusCode::kUlfmUnavailable, "revoke needs an MPI with ULFM switched on");
  }
#if FTCOMM_HAVE_ULFM
  failure_seen_ = true;
  int rc = MPIX_Comm_revoke(comm_);
  if (rc != MPI_SUCCESS && MpiErrorClass(rc) != MPI_ERR_REVOKED) return Classify(rc, "revoke");
#endif
  return Status::Ok();
}

bool Communicator::IsRevoked() const {
#if FTCOMM_HAVE_ULFM
  if (!ft_enabled_) return false;
  int flag = 0;
  MPIX_Comm_is_revoked(comm_, &flag);
  return flag != 0;
#else
  return false;
#endif
}

Status Communicator::FailedRanks(std::vector<int>* out) {
  out->clear();
  if (!ft_enabled_) {
    return Status::Error(StatusCode::kUlfmUnavailable,
                         "failed_ranks needs an MPI with ULFM switched on");
  }
#if FTCOMM_HAVE_ULFM
  int acked = 0;
  MPIX_Comm_ack_failed(comm_, size_, &acked);
  MPI_Group failed_group, comm_group;
  if (MPIX_Comm_get_failed(comm_, &failed_group) != MPI_SUCCESS) return Status::Ok();
  MPI_Comm_group(comm_, &comm_group);
  int n = 0;
  MPI_Group_size(failed_group, &n);
  std::vector<int> in(n), translated(n);
  std::iota(in.begin(), in.end(), 0);
  MPI_Group_translate_ranks(failed_group, n, in.data(), comm_group, translated.data());
  for (int r : translated) {
    if (r != MPI_UNDEFINED) out->push_back(r);
  }
  std::sort(out->begin(), out->end());
  MPI_Group_free(&failed_group);
  MPI_Group_free(&comm_group);
  if (!out->empty()) failure_seen_ = true;
#endif
  return Status::Ok();
}

Status Communicator::Classify(int mpi_rc, const std::string& what) {
  if (mpi_rc == MPI_SUCCESS) return Status::Ok();
  const int cls = MpiErrorClass(mpi_rc);
  if (!ft_enabled_) {
    return Status::Error(StatusCode::kMpiError, what + ": " + MpiErrorString(mpi_rc));
  }
  failure_seen_ = true;
  std::vector<int> failed;
  FailedRanks(&failed);
  if (!failed.empty()) {
    Status s = Status::Error(StatusCode::kProcFailed, what + ": rank(s) " + RankList(failed) + " failed");
    s.failed_ranks = failed;
    return s;
  }
  if (IsRevoked() || cls == MPI_ERR_REVOKED) {
    return Status::Error(StatusCode::kRevoked, what + ": the communicator was revoked");
  }
#if FTCOMM_HAVE_ULFM
  if (cls == MPI_ERR_PROC_FAILED || cls == MPI_ERR_PROC_FAILED_PENDING) {
    return Status::Error(StatusCode::kProcFailed, what + ": a peer failed");
  }
#endif
  return Status::Error(StatusCode::kMpiError, what + ": " + MpiErrorString(mpi_rc));
}

Status Communicator::Wait(MPI_Request* requests, int count, const Deadline& deadline,
                          const char* what) {
  int idle_polls = 0;
  liveness::FenceTimer fence(world_ranks_);
  for (;;) {
    bool pending = false;
    for (int i = 0; i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      int rc = MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        requests[i] = MPI_REQUEST_NULL;  // completed in error
        return Classify(rc, what);
      }
      if (!done) pending = true;
    }
    if (!pending) return Status::Ok();
    fence.Poll();  // heartbeat, and fence peers silent for longer than FTCOMM_FENCE_TIMEOUT
    if (GiveUp(deadline, &fence, world_ranks_)) {
      return Status::Error(StatusCode::kTimeout,
                           std::string(what) + ": no progress within " +
                               std::to_string(deadline.timeout_seconds()) + " s");
    }
    Backoff(++idle_polls);
  }
}

void Communicator::Drain(MPI_Request* requests, int count) {
  if (ft_enabled_ && !IsRevoked()) Revoke();
  Deadline deadline(5.0);
  for (;;) {
    bool pending = false;
    for (int i = 0; i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
        requests[i] = MPI_REQUEST_NULL;
      } else {
        pending = true;
      }
    }
    if (!pending || deadline.expired()) break;
    sched_yield();
  }
  for (int i = 0; i < count; ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&requests[i]);
    MPI_Request_free(&requests[i]);
  }
}

Status Communicator::Agree(int* flag, double timeout_s, bool* saw_failure) {
  *saw_failure = false;
  Deadline deadline(timeout_s);
  if (!ft_enabled_) {
    // Without ULFM an agreement is a plain bitwise-AND allreduce: right while nobody fails.
    int in = *flag;
    MPI_Request req;
    int rc = MPI_Iallreduce(&in, flag, 1, MPI_INT, MPI_BAND, comm_, &req);
    if (rc != MPI_SUCCESS) return Classify(rc, "agree");
    return Wait(&req, 1, deadline, "agree");
  }
#if FTCOMM_HAVE_ULFM
  // MPIX_Comm_agree raises MPI_ERR_PROC_FAILED at every rank alike when a rank failed without
  // being acknowledged, and the flag is still agreed; after an ack the next agreement does not
  // raise for that failure. So the loop below runs the same number of times on every rank.
  int value = *flag;
  liveness::FenceTimer fence(world_ranks_);
  for (int attempt = 0; attempt <= size_; ++attempt) {
    int contributed = value;
    MPI_Request req;
    int rc = MPIX_Comm_iagree(comm_, &contributed, &req);
    if (rc == MPI_SUCCESS) {
      int done = 0, idle_polls = 0;
      while (!done) {
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) break;
        if (!done) fence.Poll();
        if (!done && GiveUp(deadline, &fence, world_ranks_)) {
          Drain(&req, 1);
          return Status::Error(StatusCode::kTimeout, "agree: no agreement within " +
                                                         std::to_string(timeout_s) + " s");
        }
        if (!done) Backoff(++idle_polls);
      }
    }
    if (rc == MPI_SUCCESS) {
      *flag = contributed;
      return Status::Ok();
    }
    if (MpiErrorClass(rc) != MPI_ERR_PROC_FAILED) return Classify(rc, "agree");
    *saw_failure = true;
    failure_seen_ = true;
    value = contributed;  // agreed among the contributors; acknowledge and agree again
    int acked = 0;
    MPIX_Comm_ack_failed(comm_, size_, &acked);
  }
  return Status::Error(StatusCode::kProcFailed, "agree: failures kept arriving");
#else
  return Status::Error(StatusCode::kUlfmUnavailable, "agree needs ULFM");
#endif
}

Status Communicator::Barrier(double timeout_s) {
  MPI_Request req;
  int rc = MPI_Ibarrier(comm_, &req);
  if (rc != MPI_SUCCESS) return Classify(rc, "barrier");
  Status s = Wait(&req, 1, Deadline(timeout_s), "barrier");
  if (!s.ok()) Drain(&req, 1);
  return s;
}

Status Communicator::Shrink(double timeout_s, std::unique_ptr<Communicator>* out,
                            std::vector<int>* old_to_new) {
  if (!ft_enabled_) {
    return Status::Error(StatusCode::kUlfmUnavailable, "shrink needs an MPI with ULFM switched on");
  }
#if FTCOMM_HAVE_ULFM
  failure_seen_ = true;
  MPI_Comm current = comm_;
  std::unique_ptr<Communicator> result;
  for (int attempt = 0; attempt < size_; ++attempt) {
    MPI_Comm shrunk = MPI_COMM_NULL;
    int rc;
    {
      // The watchdog fences members that stopped answering (a stuck rank would hold the shrink
      // forever); only if nobody can be fenced does it kill this rank at the deadline.
      watchdog::Guard guard(timeout_s, "MPIX_Comm_shrink", watchdog::Action::kKillSelf, world_ranks_);
      rc = MPIX_Comm_shrink(current, &shrunk);
    }
    if (rc != MPI_SUCCESS) return Classify(rc, "shrink");
    result.reset(new Communicator(shrunk));
    // Confirm the new communicator before anyone may revoke it; a failure during the shrink
    // shows up here, uniformly, and we shrink once more.
    int flag = 1;
    bool saw_failure = false;
    Status s = result->Agree(&flag, timeout_s, &saw_failure);
    if (!s.ok()) return s;
    if (!saw_failure) break;
    current = result->handle();
    result->failure_seen_ = true;
    result.release();  // left to MPI_Finalize, see ~Communicator
  }
  if (!result) return Status::Error(StatusCode::kProcFailed, "shrink: failures kept arriving");
  *old_to_new = TranslateAll(comm_, result->handle());
  result->last_committed_step_ = last_committed_step_;
  *out = std::move(result);
  return Status::Ok();
#else
  return Status::Error(StatusCode::kUlfmUnavailable, "shrink needs ULFM");
#endif
}

Status Communicator::Split(int color, int key, double timeout_s, std::unique_ptr<Communicator>* out) {
  MPI_Comm split = MPI_COMM_NULL;
  int rc;
  {
    watchdog::Guard guard(timeout_s, "MPI_Comm_split", watchdog::Action::kKillSelf, world_ranks_);
    rc = MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &split);
  }
  if (rc != MPI_SUCCESS) return Classify(rc, "split");
  if (split == MPI_COMM_NULL) return Status::Ok();
  std::unique_ptr<Communicator> result(new Communicator(split));
  Status s = result->SyncNew(timeout_s);
  if (!s.ok()) {
    result->failure_seen_ = true;
    result.release();  // left to MPI_Finalize, see ~Communicator
    return s;
  }
  *out = std::move(result);
  return Status::Ok();
}

Status Communicator::WaitSignal(int tag, double timeout_s, int* value, int* source) {
  const bool forever = timeout_s < 0;  // idle spares wait for as long as the job runs
  Deadline deadline(forever ? 0.0 : timeout_s);
  int idle_polls = 0;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &flag, &status);
    if (rc != MPI_SUCCESS) {
      Status s = Classify(rc, "spare wait");
#if FTCOMM_HAVE_ULFM
      int acked = 0;  // re-arms MPI_ANY_SOURCE receives for the next wait
      MPIX_Comm_ack_failed(comm_, size_, &acked);
#endif
      return s;
    }
    if (flag) {
      rc = MPI_Recv(value, 1, MPI_INT, status.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return Classify(rc, "spare wait");
      *source = status.MPI_SOURCE;
      return Status::Ok();
    }
    liveness::Beat();
    if (!forever && deadline.expired()) {
      return Status::Error(StatusCode::kTimeout, "spare wait: no signal within " +
                                                     std::to_string(timeout_s) + " s");
    }
    // Idle spares may outnumber cores many times over: after a short spin, sleep, growing to 2 ms
    // (the count stops growing there, so it cannot overflow however long the spare waits).
    if (idle_polls < 264) ++idle_polls;
    if (idle_polls > 64) usleep(10 * (idle_polls - 64));
  }
}

Status Communicator::Signal(int peer, int tag, int value, double timeout_s) {
  MPI_Request req;
  int rc = MPI_Isend(&value, 1, MPI_INT, peer, tag, comm_, &req);
  if (rc != MPI_SUCCESS) return Classify(rc, "signal");
  Status s = Wait(&req, 1, Deadline(timeout_s), "signal");
  if (!s.ok() && req != MPI_REQUEST_NULL) {
    // Not Drain: a signal that could not be delivered must not revoke the whole pool.
    MPI_Cancel(&req);
    MPI_Request_free(&req);
  }
  return s;
}

void Communicator::set_recovered(std::unique_ptr<Communicator> comm, std::vector<int> old_to_new) {
  recovered_ = std::move(comm);
  recovered_map_ = std::move(old_to_new);
}

std::unique_ptr<Communicator> Communicator::TakeRecovered(std::vector<int>* old_to_new) {
  *old_to_new = recovered_map_;
  return std::move(recovered_);
}

}  // namespace ftcomm
