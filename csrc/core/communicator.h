// Communicator: an MPI communicator with ULFM's recovery verbs, every wait bounded by a deadline.
// Semantics follow the ULFM chapter of the MPI Forum draft (mpi-forum/mpi-issues#20) and Open
// MPI's MPIX_Comm_* manual pages; each MPI's spelling of them is in core/mpi_compat.h.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "core/liveness.h"
#include "core/status.h"

namespace ftcomm {

// One wait's deadline, with what happens when it passes (liveness::Judge): the members the wait
// depends on are judged once, a fenced member earns a grace period for ULFM's report, and the
// timeout's message names who kept the wait.
class WaitDeadline {
 public:
  // `members`: world ranks of the communicator (fenced when their process stops); `judged`:
  // world ranks this wait depends on (judged at the deadline), empty for every member. Both are
  // only read once the deadline passes or every 200 ms, so the common path allocates nothing.
  WaitDeadline(const Deadline& deadline, const std::vector<int>& members, std::vector<int> judged = {})
      : deadline_(deadline), fence_(members), members_(members), judged_ranks_(std::move(judged)) {}
  void Poll() { fence_.Poll(); }
  bool GiveUp();
  Status TimeoutStatus(const char* what) const;

 private:
  const Deadline& deadline_;
  liveness::FenceTimer fence_;
  const std::vector<int>& members_;
  std::vector<int> judged_ranks_;
  bool judged_ = false;
  std::string why_;
};

class Communicator {
 public:
  // Duplicates `parent` (collective over parent), switches errors to MPI_ERRORS_RETURN and
  // synchronises with an agreement, so that nobody may revoke the new communicator while a peer
  // is still creating it (that crashes Open MPI 5.0.11, see docs/DESIGN.md).
  static Status Create(MPI_Comm parent, double timeout_s, std::unique_ptr<Communicator>* out);
  ~Communicator();

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  MPI_Comm handle() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // MPI_COMM_WORLD rank of each rank of this communicator.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  bool ft_enabled() const { return ft_enabled_; }

  // MPIX_Comm_revoke: every pending and future operation on this communicator, on every rank,
  // fails with a revoked error. Local and non-blocking.
  Status Revoke();
  bool IsRevoked() const;

  // MPIX_Comm_shrink, repeated until the new communicator is confirmed by an agreement with no
  // new failure. `old_to_new[r]` is the new rank of old rank r, -1 for a failed rank. Shrink
  // itself cannot be interrupted: past `timeout_s` the watchdog kills this rank.
  Status Shrink(double timeout_s, std::unique_ptr<Communicator>* out, std::vector<int>* old_to_new);

  // MPI_Comm_split, then an agreement that confirms the new communicator (used when a spare pool
  // splits into the active communicator, ranks ordered by `key`). `color` < 0 means
  // MPI_UNDEFINED: this rank joins no new communicator and `*out` stays null. Like shrink, the
  // split cannot be interrupted: past `timeout_s` the watchdog kills this rank.
  Status Split(int color, int key, double timeout_s, std::unique_ptr<Communicator>* out);

  // Waits for one int sent with `tag` from any rank (MPI_Iprobe polling, so no request is left
  // behind when the wait ends in error). `*source` is the sender. Used by idle spare ranks, which
  // may wait for hours: polls sleep up to 2 ms and keep this rank's heartbeat fresh.
  // Errors: kRevoked once any rank revokes; kProcFailed when a failure was first noticed (it is
  // acknowledged, so the next wait goes on); kTimeout past `timeout_s` (< 0: no deadline).
  Status WaitSignal(int tag, double timeout_s, int* value, int* source);

  // Sends one int with `tag` to `peer` (small, hence eager) and waits for it until `timeout_s`.
  Status Signal(int peer, int tag, int value, double timeout_s);

  // MPIX_Comm_agree: bitwise AND of `*flag` over the live ranks, the same on all of them. A
  // failure during the call is acknowledged and the agreement repeated, so the call returns the
  // agreed value unless the deadline passes. `*saw_failure` tells whether a failure was seen.
  Status Agree(int* flag, double timeout_s, bool* saw_failure);

  // Acknowledges the failures this rank knows of and returns them, in this communicator's ranks.
  Status FailedRanks(std::vector<int>* out);

  Status Barrier(double timeout_s);

  // Waits for the given requests until the deadline. On an error, the error is classified by the
  // communicator's failure state (a dead peer can surface as MPI_ERR_OTHER or MPI_ERR_REVOKED
  // as well as MPI_ERR_PROC_FAILED). Completed requests are set to MPI_REQUEST_NULL. `peers`:
  // the ranks the requests depend on (judged if the deadline passes); null: every member.
  Status Wait(MPI_Request* requests, int count, const Deadline& deadline, const char* what,
              const std::vector<int>* peers = nullptr);

  // Receives the next message from `source` with `tag` whole, whatever its length, as int64
  // words into `*into` (MPI_Improbe polling, then MPI_Imrecv of the matched message), until the
  // deadline. For rounds whose peers may have sent a message of another length than this rank
  // expects (a peer in another collective). Errors as Wait's.
  Status ReceiveWhole(int source, int tag, const Deadline& deadline, const char* what, std::vector<int64_t>* into);
  // MPI_COMM_WORLD ranks of the given ranks of this communicator.
  std::vector<int> WorldRanksOf(const std::vector<int>& ranks) const;

  // After a failure: revokes (if not yet revoked) and waits, briefly, for the given requests to
  // complete in error so that MPI no longer touches their buffers; cancels what is left.
  void Drain(MPI_Request* requests, int count);

  // Turns an MPI return code into a Status, looking at failed ranks and revocation.
  Status Classify(int mpi_rc, const std::string& what);

  // The step ledger: the last step id committed by a collective on this communicator (or on
  // the communicator it was shrunk from). -1 before the first commit.
  int64_t last_committed_step() const { return last_committed_step_; }
  void set_last_committed_step(int64_t step) { last_committed_step_ = step; }

  // A communicator already shrunk by a collective's abort path, handed out by TakeRecovered.
  void set_recovered(std::unique_ptr<Communicator> comm, std::vector<int> old_to_new);
  bool has_recovered() const { return recovered_ != nullptr; }
  std::unique_ptr<Communicator> TakeRecovered(std::vector<int>* old_to_new);

 private:
  explicit Communicator(MPI_Comm comm);
  Status SyncNew(double timeout_s);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  bool ft_enabled_ = false;
  std::vector<int> world_ranks_;
  int64_t last_committed_step_ = -1;
  bool failure_seen_ = false;
  bool revoked_seen_ = false;  // this rank revoked it or saw MPI_ERR_REVOKED (for MPIs that cannot say)
  std::unique_ptr<Communicator> recovered_;
  std::vector<int> recovered_map_;
};

}  // namespace ftcomm
