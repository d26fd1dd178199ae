// C++ API of ftcomm's CUDA code, callable from host code compiled by g++: no CUDA header is
// needed here (streams are void*, a cudaStream_t as the runtime defines it; 0 is the legacy
// default stream, 1 cudaStreamLegacy, 2 cudaStreamPerThread). The definitions live in
// csrc/cuda/*.cu and are linked only when the extension is built with nvcc, which then defines
// FTCOMM_WITH_CUDA for every host source. Host code must not call these without that macro.
//
// Every function returns true on success; on failure it returns false and, when `err` is not
// null, sets *err to a message that names the call and the CUDA error.
#pragma once

#include <cstddef>
#include <string>

#include "collectives/dtype.h"

namespace ftcomm {
namespace cuda {

// True when the CUDA runtime loads, the driver is new enough and at least one device is visible;
// otherwise false with the reason in *reason (e.g. "no CUDA-capable device is detected").
bool Available(std::string* reason);

// The CUDA runtime version this was built with and the driver's, as CUDA encodes them
// (1000 * major + 10 * minor); 0 when unknown.
int RuntimeVersion();
int DriverVersion();

// Reduction kernels on device memory, enqueued on `stream` (asynchronous to the host).
// inout[i] = op(in[i], inout[i]) for i < n, n elements of `dtype`. Avg reduces as a sum (divide
// afterwards with Scale), as the host kernels do. float16 and bfloat16 are widened to float32
// for each operation and rounded back to nearest even; min and max propagate NaN. Integer sums
// and products wrap around. Any length and alignment: when `in` and `inout` share their
// alignment modulo 16 bytes the body moves in 16-byte vectors, with a scalar head and tail;
// otherwise every element is scalar. Both pointers must be device memory of the current device.
bool Reduce(DType dtype, ReduceOp op, const void* in, void* inout, size_t n, void* stream,
            std::string* err);

// buf[i] /= divisor on the device (the last step of an average); integers truncate toward zero.
bool Scale(DType dtype, void* buf, size_t n, int divisor, void* stream, std::string* err);

// Runtime wrappers used by the staging path and the bindings.
bool GetDevice(int* device, std::string* err);
bool SetDevice(int device, std::string* err);
// The device that owns `ptr` (*device >= 0), or *device = -1 when it is host or unknown memory.
bool PointerDevice(const void* ptr, int* device, std::string* err);
bool StreamSynchronize(void* stream, std::string* err);
bool DeviceSynchronize(std::string* err);
bool CopyDeviceToHostAsync(void* dst, const void* src, size_t bytes, void* stream, std::string* err);
bool CopyHostToDeviceAsync(void* dst, const void* src, size_t bytes, void* stream, std::string* err);
bool CopyDeviceToDevice(void* dst, const void* src, size_t bytes, std::string* err);
bool CopyToDevice(void* dst, const void* src, size_t bytes, std::string* err);    // synchronous
bool CopyFromDevice(void* dst, const void* src, size_t bytes, std::string* err);  // synchronous
bool Malloc(void** ptr, size_t bytes, std::string* err);
bool Free(void* ptr, std::string* err);
// Page-locked host memory (cudaHostAlloc, portable across devices).
bool HostAlloc(void** ptr, size_t bytes, std::string* err);
void HostFree(void* ptr);

// Event timing for benchmarks: milliseconds of `iters` calls of Reduce on `stream`, measured
// with CUDA events after one warm-up call.
bool TimeReduce(DType dtype, ReduceOp op, const void* in, void* inout, size_t n, int iters,
                void* stream, float* ms, std::string* err);

}  // namespace cuda
}  // namespace ftcomm
