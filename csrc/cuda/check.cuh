// Internal to csrc/cuda/*.cu: turns a cudaError_t into the bool + message convention of
// reduce_cuda.h.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace ftcomm {
namespace cuda {

inline bool Check(cudaError_t e, const char* what, std::string* err) {
  if (e == cudaSuccess) return true;
  if (err != nullptr) {
    *err = std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  }
  return false;
}

}  // namespace cuda
}  // namespace ftcomm
