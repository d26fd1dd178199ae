// Status: the one way the core reports an outcome. The core never throws into Python and never
// calls back into it; the bindings turn a non-OK Status into the matching ftcomm exception.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ftcomm {

enum class StatusCode : int {
  kOk = 0,
  kProcFailed = 1,       // a peer died; failed_ranks says who (in the communicator's numbering)
  kRevoked = 2,          // the communicator was revoked by some rank
  kTimeout = 3,          // a deadline passed before the operation completed
  kUlfmUnavailable = 4,  // a recovery verb was called but MPI runs without ULFM
  kInvalidInput = 5,     // bad buffer, dtype, op or step on this or another rank
  kMpiError = 6,         // any other MPI error
  kCorruption = 7,       // silent data corruption: a checksum did not match; nothing committed.
                         // failed_ranks then holds the implicated ranks (sender, receiver), alive
  kResultsDiffer = 8,    // silent data corruption: the ranks' result fingerprints differ; nothing
                         // committed. failed_ranks: those that differ from a strict majority (all
                         // without one), alive
  kCollectiveMismatch = 9,  // ranks called different collectives (or passed a min/max round
                            // different numbers of values): a program error, raised on every rank
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;
  std::vector<int> failed_ranks;  // only for kProcFailed
  int64_t step = -1;              // the step of the collective that failed, -1 if none

  static Status Ok() { return Status(); }
  static Status Error(StatusCode code, std::string message) {
    Status s;
    s.code = code;
    s.message = std::move(message);
    return s;
  }
  bool ok() const { return code == StatusCode::kOk; }
};

}  // namespace ftcomm
