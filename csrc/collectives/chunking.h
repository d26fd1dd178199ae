// How a ring cuts a segment into chunks: the pipelining unit of its messages.
#pragma once

#include <algorithm>
#include <cstddef>

namespace ftcomm {

// At most this many chunks per ring segment, whatever chunk_bytes asks for: every chunk is a
// request in flight, and with a few hundred per segment Open MPI's shared-memory transport ran
// out of fragments when a rank failed, so that the revoke's broadcast could not be sent
// ("bml_base_alloc failed") and the agreement crashed or the retry hung. 64 leaves a wide margin
// (96 per segment was seen to work, 192 not) and costs no pipelining: a 256 MiB buffer at 2 ranks
// still goes in 2 MiB chunks.
constexpr size_t kMaxChunksPerSegment = 64;

// Elements per chunk for a ring over `count` elements at `ranks` ranks: chunk_bytes' worth, or
// more where that would exceed kMaxChunksPerSegment. The same on every rank (the count, dtype
// and chunk_bytes are validated equal).
inline size_t ChunkElements(size_t chunk_bytes, size_t element_size, size_t count, int ranks) {
  const size_t longest_segment = (count + ranks - 1) / static_cast<size_t>(ranks);
  const size_t fewest = (longest_segment + kMaxChunksPerSegment - 1) / kMaxChunksPerSegment;
  return std::max<size_t>({1, chunk_bytes / element_size, fewest});
}

}  // namespace ftcomm
