#include "collectives/reduce_kernels.h"

#include "collectives/checksum.h"
#include "collectives/reduce_ops.h"
#include "collectives/stream_copy.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ftcomm {
namespace {

// Storage types. _Float16 is native in GCC >= 12 and Clang >= 15 on x86-64 and AArch64.
using half_t = _Float16;
struct bf16_t {
  uint16_t bits;
};

inline float BF16ToFloat(bf16_t v) {
  uint32_t bits = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline bf16_t FloatToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((bits >> 16) | 0x40)};  // NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return bf16_t{static_cast<uint16_t>(bits >> 16)};
}

// Widening: the type arithmetic happens in, and the conversions to and from storage.
template <typename T> struct Arith { using type = T; };
template <> struct Arith<half_t> { using type = float; };
template <> struct Arith<bf16_t> { using type = float; };

template <typename T> inline typename Arith<T>::type Load(T v) { return v; }
inline float Load(half_t v) { return static_cast<float>(v); }
inline float Load(bf16_t v) { return BF16ToFloat(v); }

template <typename T> inline T Store(typename Arith<T>::type v) { return v; }
template <> inline half_t Store<half_t>(float v) { return static_cast<half_t>(v); }
template <> inline bf16_t Store<bf16_t>(float v) { return FloatToBF16(v); }

using reduce_ops::Apply;

template <typename T, ReduceOp Op>
void ReduceLoop(const T* __restrict in, T* __restrict inout, size_t n) {
  for (size_t i = 0; i < n; ++i) inout[i] = Store<T>(Apply<Op>(Load(in[i]), Load(inout[i])));
}

template <typename T, ReduceOp Op>
void ReduceUndoLoop(const T* __restrict in, T* __restrict inout, T* __restrict undo, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const T old = inout[i];
    undo[i] = old;
    inout[i] = Store<T>(Apply<Op>(Load(in[i]), Load(old)));
  }
}

// The undo log streamed: block by block, the old values go out with streaming stores, then the
// block (still in L1) is reduced in place; one fence at the end.
template <typename T, ReduceOp Op>
void ReduceStreamedUndoLoop(const T* __restrict in, T* __restrict inout, T* __restrict undo, size_t n) {
  constexpr size_t kBlock = 4096 / sizeof(T);
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = n - b < kBlock ? n - b : kBlock;
    StreamCopyUnfenced(undo + b, inout + b, m * sizeof(T));
    ReduceLoop<T, Op>(in + b, inout + b, m);
  }
  StreamFence();
}

// An element's contribution to WordSum: itself (4 bytes) or its two 32-bit halves (8 bytes).
template <typename T>
inline uint32_t Word32(T v) {
  if constexpr (sizeof(T) == 4) {
    uint32_t w;
    std::memcpy(&w, &v, 4);
    return w;
  } else {
    uint64_t w;
    std::memcpy(&w, &v, 8);
    return static_cast<uint32_t>(w) + static_cast<uint32_t>(w >> 32);
  }
}

template <typename T, ReduceOp Op>
void ReduceUndoSumLoop(const T* __restrict in, T* __restrict inout, T* __restrict undo, size_t n,
                       uint32_t* in_sum, uint32_t* out_sum) {
  if constexpr (sizeof(T) == 2) {  // two elements per word: the loop would not vectorise
    ReduceUndoLoop<T, Op>(in, inout, undo, n);
    *in_sum = WordSum(in, n * sizeof(T));
    *out_sum = WordSum(inout, n * sizeof(T));
  } else {
    uint32_t in_acc = 0, out_acc = 0;  // 32-bit lanes: vector adds, no widening
    for (size_t i = 0; i < n; ++i) {
      const T old = inout[i];
      undo[i] = old;
      const T result = Store<T>(Apply<Op>(Load(in[i]), Load(old)));
      inout[i] = result;
      in_acc += Word32(in[i]);
      out_acc += Word32(result);
    }
    *in_sum = in_acc;
    *out_sum = out_acc;
  }
}

template <typename T, ReduceOp Op>
void ReduceOutOfPlaceLoop(const T* __restrict a, const T* __restrict b, T* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Store<T>(Apply<Op>(Load(a[i]), Load(b[i])));
}

template <typename T, ReduceOp Op>
void ReduceOutOfPlaceSumLoop(const T* __restrict a, const T* __restrict b, T* __restrict out, size_t n,
                             uint32_t* a_sum, uint32_t* out_sum) {
  if constexpr (sizeof(T) == 2) {  // as in ReduceUndoSumLoop
    ReduceOutOfPlaceLoop<T, Op>(a, b, out, n);
    *a_sum = WordSum(a, n * sizeof(T));
    *out_sum = WordSum(out, n * sizeof(T));
  } else {
    uint32_t a_acc = 0, out_acc = 0;
    for (size_t i = 0; i < n; ++i) {
      const T result = Store<T>(Apply<Op>(Load(a[i]), Load(b[i])));
      out[i] = result;
      a_acc += Word32(a[i]);
      out_acc += Word32(result);
    }
    *a_sum = a_acc;
    *out_sum = out_acc;
  }
}

template <typename T>
void ScaleLoop(T* buf, size_t n, int divisor) {
  using A = typename Arith<T>::type;
  if constexpr (std::is_integral_v<A>) {
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(buf[i] / static_cast<A>(divisor));
  } else {
    const A inv = A(1) / static_cast<A>(divisor);
    // Multiplying by the reciprocal rounds differently from dividing; divide for exactness
    // where the divisor is not a power of two.
    if ((divisor & (divisor - 1)) == 0) {
      for (size_t i = 0; i < n; ++i) buf[i] = Store<T>(Load(buf[i]) * inv);
    } else {
      const A d = static_cast<A>(divisor);
      for (size_t i = 0; i < n; ++i) buf[i] = Store<T>(Load(buf[i]) / d);
    }
  }
}

// Calls fn.template operator()<T>() with the storage type of `dtype`.
template <typename Fn>
void DispatchType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(float{}); break;
    case DType::kFloat64: fn(double{}); break;
    case DType::kFloat16: fn(half_t{}); break;
    case DType::kBFloat16: fn(bf16_t{}); break;
    case DType::kInt32: fn(int32_t{}); break;
    case DType::kInt64: fn(int64_t{}); break;
  }
}

template <typename Fn>
void DispatchOp(ReduceOp op, Fn&& fn) {
  switch (op) {
    case ReduceOp::kSum: fn(std::integral_constant<ReduceOp, ReduceOp::kSum>{}); break;
    case ReduceOp::kAvg: fn(std::integral_constant<ReduceOp, ReduceOp::kAvg>{}); break;
    case ReduceOp::kMin: fn(std::integral_constant<ReduceOp, ReduceOp::kMin>{}); break;
    case ReduceOp::kMax: fn(std::integral_constant<ReduceOp, ReduceOp::kMax>{}); break;
    case ReduceOp::kProd: fn(std::integral_constant<ReduceOp, ReduceOp::kProd>{}); break;
  }
}

}  // namespace

void ReduceInto(DType dtype, ReduceOp op, const void* in, void* inout, size_t n) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    DispatchOp(op, [&](auto op_tag) {
      ReduceLoop<T, decltype(op_tag)::value>(static_cast<const T*>(in), static_cast<T*>(inout), n);
    });
  });
}

void ReduceIntoWithUndo(DType dtype, ReduceOp op, const void* in, void* inout, void* undo,
                        size_t n, UndoStores stores) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    DispatchOp(op, [&](auto op_tag) {
      constexpr ReduceOp kOp = decltype(op_tag)::value;
      auto* const t_in = static_cast<const T*>(in);
      auto* const t_inout = static_cast<T*>(inout);
      auto* const t_undo = static_cast<T*>(undo);
      if (stores == UndoStores::kStreamed) {
        ReduceStreamedUndoLoop<T, kOp>(t_in, t_inout, t_undo, n);
      } else {
        ReduceUndoLoop<T, kOp>(t_in, t_inout, t_undo, n);
      }
    });
  });
}

void ReduceIntoWithUndoSum(DType dtype, ReduceOp op, const void* in, void* inout, void* undo,
                           size_t n, uint32_t* in_sum, uint32_t* out_sum) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    DispatchOp(op, [&](auto op_tag) {
      ReduceUndoSumLoop<T, decltype(op_tag)::value>(static_cast<const T*>(in), static_cast<T*>(inout),
                                                    static_cast<T*>(undo), n, in_sum, out_sum);
    });
  });
}

void ReduceOutOfPlace(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    DispatchOp(op, [&](auto op_tag) {
      ReduceOutOfPlaceLoop<T, decltype(op_tag)::value>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                       static_cast<T*>(out), n);
    });
  });
}

void ReduceOutOfPlaceSum(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                         uint32_t* a_sum, uint32_t* out_sum) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    DispatchOp(op, [&](auto op_tag) {
      ReduceOutOfPlaceSumLoop<T, decltype(op_tag)::value>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                          static_cast<T*>(out), n, a_sum, out_sum);
    });
  });
}

void ScaleForAvg(DType dtype, void* buf, size_t n, int divisor) {
  if (divisor == 1) return;
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    ScaleLoop<T>(static_cast<T*>(buf), n, divisor);
  });
}

}  // namespace ftcomm
