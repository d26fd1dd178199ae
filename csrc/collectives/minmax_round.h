// The min/max round: element-wise min and max of a few int64 over all ranks, in one dissemination
// of small messages. It is how every collective checks its input across ranks before touching a
// buffer (the steps' validation, the Python allgather's and broadcast's), and every message of it
// says which of those rounds its sender is in, so that ranks that called different collectives (a
// program error) all raise instead of merging each other's values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/communicator.h"
#include "core/deadline.h"
#include "core/status.h"

namespace ftcomm {

// Which round a rank is in: every message of a round carries it, with its number of values.
enum class RoundKind : int64_t {
  kAllreduce = 1,      // an allreduce's input validation
  kReduceScatter = 2,  // a reduce-scatter's input validation
  kMinMax = 3,         // Communicator.minmax (also the rounds ftcomm's Python layers build on it)
  kAllgather = 4,      // Communicator.allgather's input check
  kBroadcast = 5,      // Communicator.broadcast's input check
};

// "an allreduce's input validation", for error messages.
const char* RoundKindText(int64_t kind);

// "rank 2 (world rank 5)": errors name both, the world rank being the one that stays put.
std::string RankName(const Communicator& comm, int64_t rank);

// Element-wise min and max of `values` over all ranks, by dissemination (Hensgen, Finkel & Manber
// 1988): in round k each rank sends what it has to rank + 2^k and merges what comes from
// rank - 2^k; after ceil(log2 N) rounds every rank has seen every value. Each value travels as
// (v, -v) under MAX, which gives the max and the min at once; MAX is idempotent, so overlapping
// windows do not matter. Values must lie in (INT64_MIN, INT64_MAX]. Point-to-point rather than
// MPI_Iallreduce: Open MPI's non-blocking collectives advance only inside MPI_Test and cost ~200 us
// here at 4 ranks, several times a blocking allreduce.
//
// A message from a rank in another kind of round, or with another number of values, is not
// merged: the receiving rank records who it came from and forwards the record in its later
// messages. Since every rank's messages reach every rank through such chains, either no rank
// sees a difference or every rank does, and then each returns kCollectiveMismatch naming two
// ranks and the rounds they were in. Every rank still sends and receives one message per round
// whatever its peers called, so no message is left behind and no rank waits for one that never
// comes.
//
// A rank whose caller could not give it its values (one outside the range) passes
// `values_rejected` (its values are then ignored): it still takes part in every message, and
// every rank returns kInvalidInput naming it.
//
// Errors: kCollectiveMismatch as above (on every rank); kInvalidInput for rejected values (on
// every rank); kProcFailed, kRevoked, kTimeout as a local outcome (a peer failed or never came:
// the peers' outcomes may differ).
Status MinMaxRound(Communicator& comm, RoundKind kind, const std::vector<int64_t>& values,
                   std::vector<int64_t>* mins, std::vector<int64_t>* maxs, const Deadline& deadline,
                   bool values_rejected = false);

// MinMaxRound with a deadline of `timeout_s` seconds, for a communicator that must not be revoked
// (kRevoked at once otherwise: call recover() first). Used by Communicator.minmax (and through it
// by the Python helpers, allgather and broadcast, to validate their input uniformly: every rank
// gets the same mins and maxs, hence the same error).
Status MinMaxAcrossRanks(Communicator& comm, RoundKind kind, const std::vector<int64_t>& values,
                         std::vector<int64_t>* mins, std::vector<int64_t>* maxs, double timeout_s,
                         bool values_rejected = false);

}  // namespace ftcomm
