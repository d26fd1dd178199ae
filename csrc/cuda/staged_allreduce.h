// Allreduce over device buffers, staged through page-locked host memory (the PyPI Open MPI is
// built without CUDA, so MPI never sees a device pointer):
//   1. each device buffer is copied into its slice of one pinned host scratch
//      (cudaMemcpyAsync on the buffer's stream, the producer's stream: the copy is ordered after
//      the work that wrote the buffer), then every stream is synchronised;
//   2. AllreduceStep (collectives/allreduce_step.h) runs the whole host commit protocol, in place
//      on the pinned copy: validation, ring, agreement, commit or abort;
//   3. only on commit, the pinned results are copied back into the device buffers on the same
//      streams, which are synchronised before returning.
// On abort, on an invalid-input error or on a replay the device buffers are never written: the
// caller's memory holds bitwise what it held before the call.
//
// The copies go through a table of functions (StagingOps) so that the same code runs on
// CPU-only machines with "device" buffers that are host memory and memcpy for copies: the
// fault and commit tests of this path then run in CI without a GPU.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/allreduce_step.h"
#include "collectives/dtype.h"
#include "core/communicator.h"
#include "core/status.h"

namespace ftcomm {

struct DeviceBuffer {
  void* data = nullptr;    // device memory, count * ElementSize(dtype) bytes
  size_t count = 0;        // elements
  DType dtype = DType::kFloat32;
  void* stream = nullptr;  // cudaStream_t the copies are ordered on (0: legacy default stream)
};

// Each returns true on success, else false with a message in *err.
struct StagingOps {
  const char* name;
  bool (*copy_to_host)(void* dst, const void* src, size_t bytes, void* stream, std::string* err);
  bool (*copy_to_device)(void* dst, const void* src, size_t bytes, void* stream, std::string* err);
  bool (*synchronize)(void* stream, std::string* err);
  bool (*host_alloc)(void** ptr, size_t bytes, std::string* err);
  void (*host_free)(void* ptr);
  bool (*set_device)(int device, std::string* err);  // device < 0: leave the current one
  bool (*get_device)(int* device, std::string* err);
};

// memcpy over host memory, malloc'd scratch: for tests of the staging logic without a GPU.
const StagingOps& HostMemoryStagingOps();
#ifdef FTCOMM_WITH_CUDA
// cudaMemcpyAsync, cudaStreamSynchronize, cudaHostAlloc.
const StagingOps& CudaStagingOps();
#endif

struct StagedStepStats {
  double copy_in_s = 0;   // device to host copies, synchronisation included
  double step_s = 0;      // AllreduceStep on the host copy
  double copy_out_s = 0;  // host to device copies after commit
};

// `device` is the CUDA device every buffer lives on (made current for the call, then restored),
// -1 to leave the current device alone. `options.local_problem` is passed through: a rank with a
// bad input joins the validation with no buffers, so every rank fails the same way. A CUDA error
// while copying in also joins the validation as a local problem (kNotABuffer), so peers fail
// at once instead of waiting; this rank's error then names the CUDA call. A CUDA error while
// copying the committed results back is reported as kMpiError on this rank only (its peers
// have committed): the device buffer's content is then undefined.
Status StagedAllreduceStep(Communicator& comm, std::vector<DeviceBuffer>& buffers, int device,
                           const AllreduceStepOptions& options, const StagingOps& ops,
                           AllreduceStepResult* result, StagedStepStats* stats);

}  // namespace ftcomm
