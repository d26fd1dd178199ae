// Reusable host scratch for the collectives (undo log, staging, partial sums), grown on demand
// and kept for the next step: large allocations would otherwise page-fault on every call. The
// collectives keep one per thread, so that collectives on different communicators may run in
// different threads at once.
#pragma once

#include <cstddef>
#include <memory>

namespace ftcomm {

class Scratch {
 public:
  char* Get(size_t bytes) {
    if (bytes > capacity_) {
      data_.reset(new char[bytes]);
      capacity_ = bytes;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t capacity_ = 0;
};

}  // namespace ftcomm
