// Element types and reduction operators understood by the core. Exported to Python as
// ftcomm._C.DType and ftcomm._C.ReduceOp (ftcomm/core/codes.py reads them from there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ftcomm {

enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
};
constexpr int kNumDTypes = 6;

enum class ReduceOp : int {
  kSum = 0,
  kAvg = 1,
  kMin = 2,
  kMax = 3,
  kProd = 4,
};
constexpr int kNumReduceOps = 5;

inline size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
  }
  return 0;
}

inline bool ValidDType(int code) { return code >= 0 && code < kNumDTypes; }
inline bool ValidReduceOp(int code) { return code >= 0 && code < kNumReduceOps; }

}  // namespace ftcomm
