#include "core/settings.h"

#include <atomic>

namespace ftcomm {
namespace {
CoreSettings& Stored() {
  static CoreSettings settings;
  return settings;
}

std::atomic<bool> g_late_rank_fence{true};
}  // namespace

void Configure(const CoreSettings& settings) {
  Stored() = settings;
  g_late_rank_fence.store(settings.late_rank_fence);
}

const CoreSettings& CurrentSettings() { return Stored(); }

bool LateRankFence() { return g_late_rank_fence.load(); }

void SetLateRankFence(bool fence) { g_late_rank_fence.store(fence); }

}  // namespace ftcomm
