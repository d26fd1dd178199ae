// Thin wrappers over the CUDA runtime for host code compiled without CUDA headers (see
// reduce_cuda.h). Linked with the static runtime: the extension imports on machines without a
// driver, and every call then fails with a message instead of the import failing.
#include <cuda_runtime.h>

#include "cuda/check.cuh"
#include "cuda/reduce_cuda.h"

namespace ftcomm {
namespace cuda {

int RuntimeVersion() {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
}

int DriverVersion() {
  int v = 0;  // stays 0 when no driver is installed
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
}

bool Available(std::string* reason) {
  if (DriverVersion() == 0) {
    if (reason) *reason = "no CUDA driver found (libcuda.so is not installed or not loadable)";
    return false;
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (reason) {
      *reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e) + " (driver " +
                std::to_string(DriverVersion()) + ", built with runtime " +
                std::to_string(RuntimeVersion()) + ")";
    }
    cudaGetLastError();  // do not leave the error for later calls
    return false;
  }
  if (count == 0) {
    if (reason) *reason = "no CUDA device is visible";
    return false;
  }
  if (reason) *reason = std::to_string(count) + " CUDA device(s) visible";
  return true;
}

bool GetDevice(int* device, std::string* err) { return Check(cudaGetDevice(device), "cudaGetDevice", err); }
bool SetDevice(int device, std::string* err) { return Check(cudaSetDevice(device), "cudaSetDevice", err); }

bool PointerDevice(const void* ptr, int* device, std::string* err) {
  cudaPointerAttributes attr{};
  if (!Check(cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes", err)) return false;
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  *device = on_device ? attr.device : -1;
  return true;
}

bool StreamSynchronize(void* stream, std::string* err) {
  return Check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize", err);
}

bool DeviceSynchronize(std::string* err) { return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", err); }

bool CopyDeviceToHostAsync(void* dst, const void* src, size_t bytes, void* stream, std::string* err) {
  if (bytes == 0) return true;
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)),
               "cudaMemcpyAsync (device to host)", err);
}

bool CopyHostToDeviceAsync(void* dst, const void* src, size_t bytes, void* stream, std::string* err) {
  if (bytes == 0) return true;
  return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
               "cudaMemcpyAsync (host to device)", err);
}

bool CopyDeviceToDevice(void* dst, const void* src, size_t bytes, std::string* err) {
  if (bytes == 0) return true;
  return Check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy (device to device)", err);
}

bool CopyToDevice(void* dst, const void* src, size_t bytes, std::string* err) {
  if (bytes == 0) return true;
  return Check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)", err);
}

bool CopyFromDevice(void* dst, const void* src, size_t bytes, std::string* err) {
  if (bytes == 0) return true;
  return Check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)", err);
}

bool Malloc(void** ptr, size_t bytes, std::string* err) {
  return Check(cudaMalloc(ptr, bytes == 0 ? 1 : bytes), "cudaMalloc", err);
}

bool Free(void* ptr, std::string* err) { return Check(cudaFree(ptr), "cudaFree", err); }

bool HostAlloc(void** ptr, size_t bytes, std::string* err) {
  return Check(cudaHostAlloc(ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable), "cudaHostAlloc", err);
}

void HostFree(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

}  // namespace cuda
}  // namespace ftcomm
