// Exchange: a batch of point-to-point sends and receives, all posted at once and completed
// under one deadline. The building block of the Python-level allgather, broadcast and shard
// replication. Not a commit protocol by itself: on failure it revokes the communicator (so peers
// blocked on this rank leave too) and returns the local error; callers that need a uniform
// outcome follow it with Communicator::Agree.
#pragma once

#include <cstddef>
#include <vector>

#include "core/communicator.h"
#include "core/status.h"

namespace ftcomm {

struct Transfer {
  int peer = 0;          // rank in the communicator
  char* data = nullptr;  // host memory
  size_t bytes = 0;
};

Status Exchange(Communicator& comm, const std::vector<Transfer>& sends,
                const std::vector<Transfer>& recvs, int tag, double timeout_s);

}  // namespace ftcomm
