#include "core/settings.h"

namespace ftcomm {
namespace {
CoreSettings& Stored() {
  static CoreSettings settings;
  return settings;
}
}  // namespace

void Configure(const CoreSettings& settings) { Stored() = settings; }

const CoreSettings& CurrentSettings() { return Stored(); }

}  // namespace ftcomm
