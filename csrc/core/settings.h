// The core's run-time settings. The core reads no environment variable itself: ftcomm's Python
// settings module (ftcomm/settings.py) reads every FTCOMM_* variable and hands the core its part
// through Configure() when ftcomm is imported, before any communicator exists.
#pragma once

#include <string>

namespace ftcomm {

struct CoreSettings {
  double fence_timeout_s = 60.0;  // silence after which a waiting peer fences a rank (seconds)
  std::string run_dir;            // ftcomm-run's run directory (liveness table); empty: none
  bool profile = false;           // print each allreduce step's phase times to stderr
  bool late_rank_fence = true;    // initial late-rank policy (LateRankFence() holds the current one)
};

// Replaces the settings. Called once at start-up; not meant to change while collectives run.
void Configure(const CoreSettings& settings);

const CoreSettings& CurrentSettings();

// The late-rank policy: a live rank that misses a collective's deadline is fenced (true) or only
// named in the waiting ranks' timeout (false). Unlike the other settings it may change while ftcomm
// runs (the torch backend fences late ranks only inside a resilient loop); a wait reads it when
// its deadline passes. A stopped rank (no heartbeat) is fenced under either policy.
bool LateRankFence();
void SetLateRankFence(bool fence);

}  // namespace ftcomm
