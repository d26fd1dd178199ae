#include "core/communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/liveness.h"
#include "core/mpi_compat.h"
#include "core/mpi_serial.h"
#include "core/settings.h"
#include "core/watchdog.h"

namespace ftcomm {
namespace {

std::string FormatSeconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", seconds);
  return buf;
}

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

// How long Drain waits for requests to complete in error before it cancels them.
constexpr double kDrainSeconds = 0.5;

// Polls politely: ranks often outnumber cores (4 ranks on 2 cores here), and a rank that spins
// without yielding steals the time its peers need to make the progress it is waiting for.
void Backoff(int idle_polls) {
  if (idle_polls > 64) sched_yield();
  if (idle_polls > 20000) usleep(50);
}

}  // namespace

// The end of a wait whose deadline passed. The first time, the members this wait depends on are
// judged (liveness::Judge): stopped ones are fenced, and late or hung ones under the late-rank
// policy "fence"; the others are named. If anybody was fenced (here or by another rank) the wait
// goes on for a grace period, so that ULFM reports the death and every survivor sees the same
// process failure; otherwise it gives up with a timeout that names who kept it waiting.
bool WaitDeadline::GiveUp() {
  if (!deadline_.expired()) return false;
  if (!judged_) {
    judged_ = true;
    liveness::Verdict verdict = liveness::Judge(judged_ranks_.empty() ? members_ : judged_ranks_,
                                                LateRankFence());
    if (!verdict.fenced.empty()) fence_.note_fenced();
    why_ = verdict.why;
  }
  fence_.Poll(/*force=*/true);
  if (fence_.fenced()) return -deadline_.seconds_left() > liveness::kFenceGraceSeconds;
  return true;
}

Status WaitDeadline::TimeoutStatus(const char* what) const {
  // "timeout" as a word of its own: code written for torch's backends matches their timeout errors so
  std::string message = std::string(what) + ": timeout after " + FormatSeconds(deadline_.timeout_seconds()) +
                        " with no progress";
  if (!why_.empty()) message += ": " + why_;
  return Status::Error(StatusCode::kTimeout, message);
}

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
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status Communicator::Create(MPI_Comm parent, double timeout_s, std::unique_ptr<Communicator>* out) {
  liveness::Register();  // publish pid and heartbeat, so that peers can fence this rank if it hangs
  liveness::ActivityScope activity(liveness::Activity::kDup, -1);
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

std::vector<int> Communicator::WorldRanksOf(const std::vector<int>& ranks) const {
  std::vector<int> out;
  for (int r : ranks) {
    if (r >= 0 && r < size_) out.push_back(world_ranks_[r]);
  }
  return out;
}

Status Communicator::Revoke() {
  if (!ft_enabled_) {
    return Status::Error(StatusCode::kUlfmUnavailable, "revoke needs an MPI with ULFM switched on");
  }
  failure_seen_ = true;
  revoked_seen_ = true;
  int rc = Serialized([&] { return ulfm::Revoke(comm_); });
  if (rc != MPI_SUCCESS && MpiErrorClass(rc) != ulfm::ErrRevoked()) return Classify(rc, "revoke");
  return Status::Ok();
}

bool Communicator::IsRevoked() const {
  if (!ft_enabled_) return false;
  int flag = 0;
  bool supported = false;
  {
    MpiSerial serial;
    ulfm::IsRevoked(comm_, &flag, &supported);
  }
  // An MPI that cannot tell (MPICH): revoked if this rank revoked it or saw an operation fail so.
  return supported ? flag != 0 : revoked_seen_;
}

Status Communicator::FailedRanks(std::vector<int>* out) {
  out->clear();
  if (!ft_enabled_) {
    return Status::Error(StatusCode::kUlfmUnavailable,
                         "failed_ranks needs an MPI with ULFM switched on");
  }
  MpiSerial serial;  // nothing below waits
  ulfm::AckFailed(comm_, size_);
  MPI_Group failed_group, comm_group;
  if (ulfm::GetFailed(comm_, &failed_group) != MPI_SUCCESS) return Status::Ok();
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
  return Status::Ok();
}

Status Communicator::Classify(int mpi_rc, const std::string& what) {
  if (mpi_rc == MPI_SUCCESS) return Status::Ok();
  const int cls = MpiErrorClass(mpi_rc);
  if (!ft_enabled_) {
    return Status::Error(StatusCode::kMpiError, what + ": " + MpiErrorString(mpi_rc));
  }
  failure_seen_ = true;
  if (cls == ulfm::ErrRevoked()) revoked_seen_ = true;
  std::vector<int> failed;
  FailedRanks(&failed);
  if (!failed.empty()) {
    Status s = Status::Error(StatusCode::kProcFailed, what + ": world rank(s) " + RankList(WorldRanksOf(failed)) +
                                                          " failed (rank(s) " + RankList(failed) + " here)");
    s.failed_ranks = failed;
    return s;
  }
  if (IsRevoked() || cls == ulfm::ErrRevoked()) {
    return Status::Error(StatusCode::kRevoked, what + ": the communicator was revoked");
  }
  if (cls == ulfm::ErrProcFailed() || cls == ulfm::ErrProcFailedPending()) {
    return Status::Error(StatusCode::kProcFailed, what + ": a peer failed");
  }
  return Status::Error(StatusCode::kMpiError, what + ": " + MpiErrorString(mpi_rc));
}

Status Communicator::Wait(MPI_Request* requests, int count, const Deadline& deadline,
                          const char* what, const std::vector<int>* peers) {
  int idle_polls = 0;
  WaitDeadline end(deadline, world_ranks_, peers ? WorldRanksOf(*peers) : std::vector<int>());
  for (;;) {
    bool pending = false;
    for (int i = 0; i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      int rc = Serialized([&] { return MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE); });
      if (rc != MPI_SUCCESS) {
        requests[i] = MPI_REQUEST_NULL;  // completed in error
        return Classify(rc, what);
      }
      if (!done) pending = true;
    }
    if (!pending) return Status::Ok();
    end.Poll();  // progress beat, and fence members whose process stopped
    if (end.GiveUp()) return end.TimeoutStatus(what);
    Backoff(++idle_polls);
  }
}

Status Communicator::ReceiveWhole(int source, int tag, const Deadline& deadline, const char* what,
                                  std::vector<int64_t>* into) {
  int idle_polls = 0;
  // Every member is judged at the deadline, as in Wait without peers: the rounds that use this
  // depend, through their earlier messages, on every rank.
  WaitDeadline end(deadline, world_ranks_);
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  for (;;) {
    int matched = 0;
    int rc = Serialized([&] { return MPI_Improbe(source, tag, comm_, &matched, &message, &status); });
    if (rc != MPI_SUCCESS) return Classify(rc, what);
    if (matched) break;
    end.Poll();
    if (end.GiveUp()) return end.TimeoutStatus(what);
    Backoff(++idle_polls);
  }
  int count = 0;
  MPI_Get_count(&status, MPI_INT64_T, &count);
  into->assign(count == MPI_UNDEFINED ? 0 : count, 0);
  MPI_Request req;
  int rc = Serialized([&] {
    return MPI_Imrecv(into->data(), static_cast<int>(into->size()), MPI_INT64_T, &message, &req);
  });
  if (rc != MPI_SUCCESS) return Classify(rc, what);
  Status s = Wait(&req, 1, deadline, what);
  if (!s.ok()) Drain(&req, 1);
  return s;
}

void Communicator::Drain(MPI_Request* requests, int count) {
  if (ft_enabled_ && !IsRevoked()) Revoke();
  // Point-to-point requests complete in error within milliseconds of the revoke; an agreement's
  // does not, and must not hold the call past its bound (docs/DESIGN.md, "Hangs and fencing").
  Deadline deadline(kDrainSeconds);
  for (;;) {
    bool pending = false;
    for (int i = 0; i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      MpiSerial serial;
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
    MpiSerial serial;
    MPI_Cancel(&requests[i]);
    MPI_Request_free(&requests[i]);
  }
}

Status Communicator::Agree(int* flag, double timeout_s, bool* saw_failure) {
  liveness::ActivityScope activity(liveness::Activity::kAgree, last_committed_step_);
  *saw_failure = false;
  Deadline deadline(timeout_s);
  if (!ft_enabled_) {
    // Without ULFM an agreement is a plain bitwise-AND allreduce: right while nobody fails.
    int in = *flag;
    MPI_Request req;
    int rc = Serialized([&] { return MPI_Iallreduce(&in, flag, 1, MPI_INT, MPI_BAND, comm_, &req); });
    if (rc != MPI_SUCCESS) return Classify(rc, "agree");
    return Wait(&req, 1, deadline, "agree");
  }
  // MPIX_Comm_agree raises MPI_ERR_PROC_FAILED at every rank alike when a rank failed without
  // being acknowledged, and the flag is still agreed; after an ack the next agreement does not
  // raise for that failure. So the loop below runs the same number of times on every rank.
  int value = *flag;
  WaitDeadline end(deadline, world_ranks_);
  for (int attempt = 0; attempt <= size_; ++attempt) {
    int contributed = value;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc;
    if (!ulfm::HasIagree()) {
      // MPICH has only the blocking agreement: like a shrink it cannot be interrupted, so past
      // the deadline the watchdog fences who it can, else kills this rank.
      watchdog::Guard guard(std::max(deadline.seconds_left(), 0.0), "MPIX_Comm_agree",
                            watchdog::Action::kKillSelf, world_ranks_);
      rc = ulfm::Agree(comm_, &contributed);
    } else if ((rc = Serialized([&] { return ulfm::Iagree(comm_, &contributed, &req); })) == MPI_SUCCESS) {
      int done = 0, idle_polls = 0;
      while (!done) {
        rc = Serialized([&] { return MPI_Test(&req, &done, MPI_STATUS_IGNORE); });
        if (rc != MPI_SUCCESS) break;
        if (!done) end.Poll();
        if (!done && end.GiveUp()) {
          Drain(&req, 1);
          return end.TimeoutStatus("agree");
        }
        if (!done) Backoff(++idle_polls);
      }
    }
    if (rc == MPI_SUCCESS) {
      *flag = contributed;
      return Status::Ok();
    }
    if (MpiErrorClass(rc) != ulfm::ErrProcFailed()) return Classify(rc, "agree");
    *saw_failure = true;
    failure_seen_ = true;
    value = contributed;  // agreed among the contributors; acknowledge and agree again
    Serialized([&] { return ulfm::AckFailed(comm_, size_); });
  }
  return Status::Error(StatusCode::kProcFailed, "agree: failures kept arriving");
}

Status Communicator::Barrier(double timeout_s) {
  liveness::ActivityScope activity(liveness::Activity::kBarrier, last_committed_step_);
  MPI_Request req;
  int rc = Serialized([&] { return MPI_Ibarrier(comm_, &req); });
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
  liveness::ActivityScope activity(liveness::Activity::kShrink, last_committed_step_);
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
      rc = ulfm::Shrink(current, &shrunk);
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
}

Status Communicator::Split(int color, int key, double timeout_s, std::unique_ptr<Communicator>* out) {
  liveness::ActivityScope activity(liveness::Activity::kSplit, last_committed_step_);
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
  liveness::ActivityScope activity(liveness::Activity::kSignal, -1);
  const bool forever = timeout_s < 0;  // idle spares wait for as long as the job runs
  Deadline deadline(forever ? 0.0 : timeout_s);
  int idle_polls = 0;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    int rc = Serialized([&] { return MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &flag, &status); });
    if (rc != MPI_SUCCESS) {
      Status s = Classify(rc, "spare wait");
      // re-arms MPI_ANY_SOURCE receives for the next wait
      if (ft_enabled_) Serialized([&] { return ulfm::AckFailed(comm_, size_); });
      return s;
    }
    if (flag) {
      // The probed message has arrived: its receive completes without waiting for anybody.
      rc = Serialized([&] { return MPI_Recv(value, 1, MPI_INT, status.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE); });
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
  liveness::ActivityScope activity(liveness::Activity::kSignal, -1);
  MPI_Request req;
  int rc = Serialized([&] { return MPI_Isend(&value, 1, MPI_INT, peer, tag, comm_, &req); });
  if (rc != MPI_SUCCESS) return Classify(rc, "signal");
  const std::vector<int> peers{peer};
  Status s = Wait(&req, 1, Deadline(timeout_s), "signal", &peers);
  if (!s.ok() && req != MPI_REQUEST_NULL) {
    // Not Drain: a signal that could not be delivered must not revoke the whole pool.
    MpiSerial serial;
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
