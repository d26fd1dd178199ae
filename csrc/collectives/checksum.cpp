#include "collectives/checksum.h"

#include <cstring>

namespace ftcomm {

uint64_t WordSum(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  const size_t words = bytes / 8;
  // One accumulator and a memcpy load per word: the form compilers turn into vector adds (about
  // memcpy's read speed here; hand-split accumulators defeated that).
  uint64_t acc = 0;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    acc += w;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + words * 8, bytes - words * 8);
  return acc + tail;
}

}  // namespace ftcomm
