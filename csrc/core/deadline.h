// Deadline: an absolute point on the monotonic clock that every wait in the core checks, so that
// no call blocks forever (the first guarantee in docs/DESIGN.md).
#pragma once

#include <chrono>

namespace ftcomm {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Deadline(double timeout_seconds)
      : end_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(timeout_seconds))),
        timeout_seconds_(timeout_seconds) {}

  bool expired() const { return Clock::now() >= end_; }
  double seconds_left() const {
    return std::chrono::duration<double>(end_ - Clock::now()).count();
  }
  double timeout_seconds() const { return timeout_seconds_; }

 private:
  Clock::time_point end_;
  double timeout_seconds_;
};

}  // namespace ftcomm
