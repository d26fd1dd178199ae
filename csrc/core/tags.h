// Every MPI message tag ftcomm uses, in one place: two protocols that shared a tag on one
// communicator could match each other's messages. The C++ collectives use them directly; Python
// gets them as ftcomm._C.Tag (bindings/module.cpp), so no tag is written down twice.
#pragma once

namespace ftcomm {

enum class Tag : int {
  kRing = 7001,          // ring allreduce chunks (collectives/ring_allreduce.cpp)
  kRingSum = 7004,       // the ring allreduce's per-step chunk checksums (same file)
  kValidate = 7002,      // input validation and min/max rounds (collectives/minmax_round.cpp)
  kReduceScatter = 7003, // ring reduce-scatter chunks (collectives/ring_reduce_scatter.cpp)
  kReduceScatterSum = 7005,  // the ring reduce-scatter's per-step chunk checksums (same file)
  kAllgather = 7101,     // Communicator.allgather's ring (ftcomm/core/p2p.py)
  kBroadcast = 7102,     // Communicator.broadcast's binomial tree (ftcomm/core/p2p.py)
  kAllToAll = 7103,      // the torch backend's all-to-all (ftcomm/torch/group/alltoall.py)
  kMonitoredBarrier = 7104,  // the torch backend's monitored barrier (ftcomm/torch/group/monitored_barrier.py)
  kSubgroup = 7200,      // MPI_Comm_create_group of torch subgroups, this and up (ftcomm/torch/backend.py)
  kReplica = 7301,       // shard replicas to buddies (ftcomm/training/replica.py)
  kReshard = 7302,       // re-shard pieces during a rebuild (ftcomm/training/rebuild.py)
  kSpareWake = 7501,     // an active rank tells an idle spare: released, or crashed
};

constexpr int TagValue(Tag tag) { return static_cast<int>(tag); }

}  // namespace ftcomm
