// Host reduction kernels: tight loops over raw arrays that the compiler vectorises, one
// instantiation per (dtype, op), chosen once per call (never per element).
//
// float16 and bfloat16 are widened to float32 for each operation and rounded back (round to
// nearest even), so one reduction step loses at most half an ulp of the 16-bit type.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/dtype.h"

namespace ftcomm {

// inout[i] = op(in[i], inout[i]) for i < n. Avg reduces as a sum; see ScaleForAvg.
void ReduceInto(DType dtype, ReduceOp op, const void* in, void* inout, size_t n);

// How the undo log is written: ordinary stores, or streaming ones that bypass the cache
// (collectives/stream_copy.h says when each is faster).
enum class UndoStores { kCached, kStreamed };

// The same, and first copies each old inout[i] into undo[i]: the undo log of the commit
// protocol is written while the input is read anyway, which costs one write stream and no
// extra read of the user's buffer.
void ReduceIntoWithUndo(DType dtype, ReduceOp op, const void* in, void* inout, void* undo,
                        size_t n, UndoStores stores = UndoStores::kCached);

// ReduceIntoWithUndo that also returns WordSum (collectives/checksum.h) of `in` and of the
// result, taken in the same loop: the ring's transit guard at no extra pass over memory (16-bit
// types take a second pass over the chunk, which their conversions, not memory, bound anyway).
void ReduceIntoWithUndoSum(DType dtype, ReduceOp op, const void* in, void* inout, void* undo,
                           size_t n, uint32_t* in_sum, uint32_t* out_sum);

// out[i] = op(a[i], b[i]) for i < n: a reduction that leaves both inputs as they were (the
// reduce-scatter reads the user's input and writes only scratch until the commit).
void ReduceOutOfPlace(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n);

// ReduceOutOfPlace that also returns WordSum of `a` (what arrived) and of `out`, taken in the
// same loop, as ReduceIntoWithUndoSum.
void ReduceOutOfPlaceSum(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t n,
                         uint32_t* a_sum, uint32_t* out_sum);

// buf[i] /= divisor, for the final step of an average. Integer types divide and truncate
// toward zero, as C does.
void ScaleForAvg(DType dtype, void* buf, size_t n, int divisor);

}  // namespace ftcomm
