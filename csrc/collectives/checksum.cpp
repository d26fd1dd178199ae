#include "collectives/checksum.h"

#include <cstring>

namespace ftcomm {
namespace {

uint32_t TailWord(const char* p, size_t bytes) {
  uint32_t tail = 0;
  std::memcpy(&tail, p, bytes);
  return tail;
}

}  // namespace

// On x86-64 the compiler also builds an AVX2 version, chosen at load time where the CPU has it:
// twice the sum's speed over cache-hot data (the allgather's arrived chunks), the one pass of the
// guard that no other loop carries.
#if defined(__x86_64__) && defined(__GNUC__)
#define FTCOMM_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FTCOMM_VECTOR_CLONES
#endif

FTCOMM_VECTOR_CLONES uint32_t WordSum(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  const size_t words = bytes / 4;
  // Independent lanes (memcpy loads, vectorised by the compiler): one accumulator's add latency
  // would bound the loop, not the memory.
  constexpr size_t kLanes = 32;
  uint32_t lane[kLanes] = {};
  const size_t full = words / kLanes * kLanes;
  for (size_t i = 0; i < full; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      uint32_t w;
      std::memcpy(&w, p + (i + k) * 4, 4);
      lane[k] += w;
    }
  }
  uint32_t acc = 0;
  for (size_t k = 0; k < kLanes; ++k) acc += lane[k];
  for (size_t i = full; i < words; ++i) {
    uint32_t w;
    std::memcpy(&w, p + i * 4, 4);
    acc += w;
  }
  return acc + TailWord(p + words * 4, bytes - words * 4);
}

uint32_t CopyAndSum(void* dst, const void* src, size_t bytes) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  const size_t words = bytes / 4;
  uint32_t acc = 0;
  for (size_t i = 0; i < words; ++i) {
    uint32_t w;
    std::memcpy(&w, s + i * 4, 4);
    std::memcpy(d + i * 4, &w, 4);
    acc += w;
  }
  std::memcpy(d + words * 4, s + words * 4, bytes - words * 4);
  return acc + TailWord(s + words * 4, bytes - words * 4);
}

}  // namespace ftcomm
