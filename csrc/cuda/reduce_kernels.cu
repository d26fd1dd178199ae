// CUDA reduction kernels (API and semantics in reduce_cuda.h). Memory-bound: each element is
// read twice and written once, so the kernel's job is to keep enough 16-byte loads in flight.
//
// Layout of one launch: when `in` and `inout` have the same address modulo 16 bytes, the first
// `head` elements (up to the next 16-byte boundary of inout) and the last few (less than one
// vector) go through scalar code, the body through 16-byte vector loads and stores, kUnroll
// vectors per thread per iteration of a grid-stride loop. Otherwise every element is scalar.
// The operators are the host kernels' own (collectives/reduce_ops.h): fp16/bf16 widened to
// float32 and rounded back to nearest even, NaN-propagating min/max, wrapping integers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "collectives/reduce_ops.h"
#include "cuda/check.cuh"
#include "cuda/reduce_cuda.h"

namespace ftcomm {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kMaxDevices = 64;

template <typename T> struct Arith { using type = T; };
template <> struct Arith<__half> { using type = float; };
template <> struct Arith<__nv_bfloat16> { using type = float; };

template <typename T> __device__ __forceinline__ T Load(T v) { return v; }
__device__ __forceinline__ float Load(__half v) { return __half2float(v); }
__device__ __forceinline__ float Load(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T Store(typename Arith<T>::type v) { return v; }
template <> __device__ __forceinline__ __half Store<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

using reduce_ops::Apply;

template <typename T, ReduceOp Op>
__device__ __forceinline__ T Combine(T in, T inout) {
  return Store<T>(Apply<Op>(Load(in), Load(inout)));
}

// Elements [0, head) and [tail_start, n) scalar; vectors [0, nvec) starting at element `head`.
template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads)
ReduceKernel(const T* __restrict__ in, T* __restrict__ inout, size_t head, size_t nvec, size_t n) {
  constexpr int kPer = 16 / sizeof(T);
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;

  const size_t tail_start = head + nvec * kPer;
  const size_t scalar_count = head + (n - tail_start);
  for (size_t s = tid; s < scalar_count; s += stride) {
    const size_t i = s < head ? s : tail_start + (s - head);
    inout[i] = Combine<T, Op>(in[i], inout[i]);
  }

  const uint4* vin = reinterpret_cast<const uint4*>(in + head);
  uint4* vio = reinterpret_cast<uint4*>(inout + head);
  for (size_t base = tid; base < nvec; base += stride * kUnroll) {
    uint4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = base + u * stride;
      if (j < nvec) {
        a[u] = vin[j];
        b[u] = vio[j];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = base + u * stride;
      if (j < nvec) {
        T x[kPer], y[kPer];
        memcpy(x, &a[u], 16);
        memcpy(y, &b[u], 16);
#pragma unroll
        for (int k = 0; k < kPer; ++k) y[k] = Combine<T, Op>(x[k], y[k]);
        memcpy(&b[u], y, 16);
        vio[j] = b[u];
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ScaleKernel(T* buf, size_t n, int divisor) {
  using A = typename Arith<T>::type;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const bool pow2 = (divisor & (divisor - 1)) == 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (std::is_integral_v<A>) {
      buf[i] = static_cast<T>(buf[i] / static_cast<A>(divisor));
    } else if (pow2) {
      buf[i] = Store<T>(Load(buf[i]) * (A(1) / static_cast<A>(divisor)));  // exact
    } else {
      buf[i] = Store<T>(Load(buf[i]) / static_cast<A>(divisor));
    }
  }
}

// Blocks per launch: enough to fill every multiprocessor twice over (2048 threads each), no more:
// the grid-stride loop covers the rest.
bool GridLimit(unsigned* blocks, std::string* err) {
  static int sm_count[kMaxDevices] = {0};
  int dev = 0;
  if (!Check(cudaGetDevice(&dev), "cudaGetDevice", err)) return false;
  if (dev >= 0 && dev < kMaxDevices && sm_count[dev] > 0) {
    *blocks = 2u * sm_count[dev] * (2048 / kThreads);
    return true;
  }
  int sms = 0;
  if (!Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
             "cudaDeviceGetAttribute(MultiProcessorCount)", err)) {
    return false;
  }
  if (dev >= 0 && dev < kMaxDevices) sm_count[dev] = sms;
  *blocks = 2u * sms * (2048 / kThreads);
  return true;
}

unsigned Blocks(size_t threads_needed, unsigned limit) {
  const size_t b = (threads_needed + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > limit ? limit : b));
}

template <typename T, ReduceOp Op>
bool LaunchReduce(const void* in_v, void* inout_v, size_t n, cudaStream_t stream, std::string* err) {
  if (n == 0) return true;
  const T* in = static_cast<const T*>(in_v);
  T* inout = static_cast<T*>(inout_v);
  constexpr size_t kPer = 16 / sizeof(T);
  const uintptr_t a_in = reinterpret_cast<uintptr_t>(in), a_io = reinterpret_cast<uintptr_t>(inout);
  size_t head = n, nvec = 0;  // default: all scalar
  if (a_in % 16 == a_io % 16 && (a_io % 16) % sizeof(T) == 0) {
    head = ((16 - a_io % 16) % 16) / sizeof(T);
    if (head > n) head = n;
    nvec = (n - head) / kPer;
  }
  const size_t scalar = n - nvec * kPer;
  unsigned limit = 0;
  if (!GridLimit(&limit, err)) return false;
  const size_t threads = nvec > 0 ? (nvec + kUnroll - 1) / kUnroll : scalar;
  ReduceKernel<T, Op><<<Blocks(threads > scalar ? threads : scalar, limit), kThreads, 0, stream>>>(
      in, inout, head, nvec, n);
  return Check(cudaGetLastError(), "reduce kernel launch", err);
}

template <typename T>
bool LaunchReduceOp(ReduceOp op, const void* in, void* inout, size_t n, cudaStream_t s, std::string* err) {
  switch (op) {
    case ReduceOp::kSum: return LaunchReduce<T, ReduceOp::kSum>(in, inout, n, s, err);
    case ReduceOp::kAvg: return LaunchReduce<T, ReduceOp::kAvg>(in, inout, n, s, err);
    case ReduceOp::kMin: return LaunchReduce<T, ReduceOp::kMin>(in, inout, n, s, err);
    case ReduceOp::kMax: return LaunchReduce<T, ReduceOp::kMax>(in, inout, n, s, err);
    case ReduceOp::kProd: return LaunchReduce<T, ReduceOp::kProd>(in, inout, n, s, err);
  }
  if (err) *err = "invalid reduction op";
  return false;
}

template <typename T>
bool LaunchScale(void* buf, size_t n, int divisor, cudaStream_t s, std::string* err) {
  if (n == 0 || divisor == 1) return true;
  unsigned limit = 0;
  if (!GridLimit(&limit, err)) return false;
  ScaleKernel<T><<<Blocks(n, limit), kThreads, 0, s>>>(static_cast<T*>(buf), n, divisor);
  return Check(cudaGetLastError(), "scale kernel launch", err);
}

}  // namespace

bool Reduce(DType dtype, ReduceOp op, const void* in, void* inout, size_t n, void* stream,
            std::string* err) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kFloat32: return LaunchReduceOp<float>(op, in, inout, n, s, err);
    case DType::kFloat64: return LaunchReduceOp<double>(op, in, inout, n, s, err);
    case DType::kFloat16: return LaunchReduceOp<__half>(op, in, inout, n, s, err);
    case DType::kBFloat16: return LaunchReduceOp<__nv_bfloat16>(op, in, inout, n, s, err);
    case DType::kInt32: return LaunchReduceOp<int32_t>(op, in, inout, n, s, err);
    case DType::kInt64: return LaunchReduceOp<int64_t>(op, in, inout, n, s, err);
  }
  if (err) *err = "invalid dtype";
  return false;
}

bool Scale(DType dtype, void* buf, size_t n, int divisor, void* stream, std::string* err) {
  if (divisor <= 0) {
    if (err) *err = "divisor must be positive";
    return false;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kFloat32: return LaunchScale<float>(buf, n, divisor, s, err);
    case DType::kFloat64: return LaunchScale<double>(buf, n, divisor, s, err);
    case DType::kFloat16: return LaunchScale<__half>(buf, n, divisor, s, err);
    case DType::kBFloat16: return LaunchScale<__nv_bfloat16>(buf, n, divisor, s, err);
    case DType::kInt32: return LaunchScale<int32_t>(buf, n, divisor, s, err);
    case DType::kInt64: return LaunchScale<int64_t>(buf, n, divisor, s, err);
  }
  if (err) *err = "invalid dtype";
  return false;
}

bool TimeReduce(DType dtype, ReduceOp op, const void* in, void* inout, size_t n, int iters,
                void* stream, float* ms, std::string* err) {
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  bool ok = Check(cudaEventCreate(&start), "cudaEventCreate", err) &&
            Check(cudaEventCreate(&stop), "cudaEventCreate", err) &&
            Reduce(dtype, op, in, inout, n, stream, err) &&  // warm-up
            Check(cudaEventRecord(start, s), "cudaEventRecord", err);
  for (int i = 0; ok && i < iters; ++i) ok = Reduce(dtype, op, in, inout, n, stream, err);
  ok = ok && Check(cudaEventRecord(stop, s), "cudaEventRecord", err) &&
       Check(cudaEventSynchronize(stop), "cudaEventSynchronize", err) &&
       Check(cudaEventElapsedTime(ms, start, stop), "cudaEventElapsedTime", err);
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  return ok;
}

}  // namespace cuda
}  // namespace ftcomm
