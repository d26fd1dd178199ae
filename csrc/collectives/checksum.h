// The ring's guard against silent data corruption in transit: a checksum of each chunk, computed
// by its sender as the chunk is produced and by its receiver on arrival, compared before the
// commit.
//
// WordSum is the wrapping (mod 2^32) sum of the data's little-endian 32-bit words, the tail bytes
// zero-padded. A single flipped bit changes the sum by +-2^k (mod 2^32, k < 32), never by 0, so
// every single-bit flip is caught, as is any set of flips that does not cancel exactly (two flips
// of one bit position in opposite directions do; random garbage passes with probability 2^-32).
// 32-bit lanes, not 64: the sum then rides in the reduction's own vectorised loop at no measurable
// cost (ReduceIntoWithUndoSum), where widening to 64 bits doubled the loop's time on SSE2. A guard
// against flips, not an error-correcting code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ftcomm {

uint32_t WordSum(const void* data, size_t bytes);

// Copies `bytes` from src to dst and returns WordSum(src): one pass for both.
uint32_t CopyAndSum(void* dst, const void* src, size_t bytes);

}  // namespace ftcomm
