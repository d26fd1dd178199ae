// The ring's guard against silent data corruption in transit: a checksum of each chunk, computed
// by its sender before the send and by its receiver on arrival, compared before the commit.
//
// WordSum is the wrapping sum of the data's 64-bit words (the tail bytes zero-padded). A single
// flipped bit changes the sum by +-2^k (mod 2^64), so every single-bit flip is caught, as is any
// set of flips that does not cancel exactly; two flips of one bit position in opposite directions
// do cancel. It runs at memory speed (one vectorised add per word) where a CRC would cost more:
// a guard against flips, not an error-correcting code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ftcomm {

uint64_t WordSum(const void* data, size_t bytes);

}  // namespace ftcomm
