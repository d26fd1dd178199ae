// A user's host buffer as the collectives see it.
#pragma once

#include <cstddef>

#include "collectives/dtype.h"

namespace ftcomm {

struct RingBuffer {
  char* data = nullptr;   // the user's buffer (host memory), count * ElementSize(dtype) bytes
  size_t count = 0;       // elements
  DType dtype = DType::kFloat32;
};

}  // namespace ftcomm
