// Copies whose destination is written with non-temporal (streaming) stores: the data goes to
// memory without first reading the destination's cache lines and without evicting what the
// caller works on. For the undo log, which is written on every committed step and read only
// when a step fails.
#pragma once

#include <cstddef>

namespace ftcomm {

// Buffers at least this large (bytes, per ring) write their undo log with streaming stores.
// Measured at 2 and 4 ranks on a 2-core machine with a 32 MiB L3, committed float32 allreduces
// interleaved in one job: streaming was 10-30% faster from 2 MiB to 16 MiB and 6% at 64 MiB, but
// up to 14% slower at 1-1.5 MiB, where the user's buffer, the staging slots and the undo log of
// both ranks still fit in the cache and ordinary stores are cheaper.
constexpr size_t kStreamUndoBytes = size_t(2) << 20;

// memcpy(dst, src, bytes) with streaming stores for the 16-byte aligned middle of `dst`, without
// a fence: a loop of many copies calls StreamFence once at its end. Plain memcpy where the target
// lacks SSE2, or for fewer than 256 bytes.
void StreamCopyUnfenced(void* dst, const void* src, size_t bytes);

// Orders the streaming stores before it ahead of later stores (the next collective's messages;
// this thread's own loads see them either way).
void StreamFence();

// StreamCopyUnfenced, then StreamFence.
void StreamCopy(void* dst, const void* src, size_t bytes);

}  // namespace ftcomm
