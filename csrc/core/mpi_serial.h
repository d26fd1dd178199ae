#pragma once

#include <mutex>

namespace ftcomm {

// Open MPI 5.0's ULFM agreement (coll/ftagree) is not safe while another thread of the process
// drives MPI. With two threads running steps on two communicators, an agreement now and then
// decided a value no rank had contributed (every rank the same garbage), and the step aborted as
// if a deadline had passed. Seen here at 4 ranks in 6 of 60 runs of a 40-step two-thread test; in
// 2 of about 20 with only the agreement calls serialized; in none of 160 with every call
// serialized. So every MPI call ftcomm's core makes on a collective's path holds one process-wide
// lock for the call itself. It is never held while waiting for peers (waits poll MPI_Test), so
// threads whose collectives complete in different orders on different ranks cannot deadlock on
// it. Blocking calls (MPI_Comm_dup, MPI_Comm_split, MPIX_Comm_shrink) do not take it: a shrink's
// own agreement beside another thread's collective stays exposed.
std::recursive_mutex& MpiCallMutex();

// Holds the lock above for its scope: scope it to the MPI call alone.
class MpiSerial {
 public:
  MpiSerial() : lock_(MpiCallMutex()) {}

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

// Makes `call` (one MPI call, returning its error code) holding the lock.
template <typename Call>
int Serialized(Call&& call) {
  MpiSerial serial;
  return call();
}

}  // namespace ftcomm
