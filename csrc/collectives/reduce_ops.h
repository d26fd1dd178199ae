// The element-wise reduction operators, shared by the host kernels (reduce_kernels.cpp) and the
// CUDA kernels (cuda/reduce_kernels.cu), so that a sum, min, max or product means the same on
// both: integers wrap (two's complement) instead of overflowing into undefined behaviour, and min
// and max propagate NaN, as numpy's minimum and maximum do. Arguments are in the arithmetic type
// (float32 for fp16 and bf16 storage); loading and storing the storage types stays with each
// kernel file, since host and device have different half-precision types.
#pragma once

#include <type_traits>

#include "collectives/dtype.h"

#if defined(__CUDACC__)
#define FTCOMM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FTCOMM_HOST_DEVICE inline
#endif

namespace ftcomm {
namespace reduce_ops {

template <typename A> FTCOMM_HOST_DEVICE A Add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <typename A> FTCOMM_HOST_DEVICE A Mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <typename A> FTCOMM_HOST_DEVICE A Min(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b < a ? b : a;
}

template <typename A> FTCOMM_HOST_DEVICE A Max(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? b : a;
}

// `op(a, b)`; avg reduces as a sum (the division by the world size comes once, at the end).
template <ReduceOp Op, typename A> FTCOMM_HOST_DEVICE A Apply(A a, A b) {
  if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) return Add(a, b);
  if constexpr (Op == ReduceOp::kMin) return Min(a, b);
  if constexpr (Op == ReduceOp::kMax) return Max(a, b);
  if constexpr (Op == ReduceOp::kProd) return Mul(a, b);
}

}  // namespace reduce_ops
}  // namespace ftcomm
