#include "collectives/step_protocol.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/liveness.h"
#include "core/settings.h"
#include "core/tags.h"
#include "fault/injection.h"

namespace ftcomm {
namespace {

// Fields compared across ranks. Each is sent as (v, -v) under MPI_MAX, which yields the max and
// the min in one small allreduce.
constexpr int64_t kRankSlots = int64_t(1) << 20;  // ranks per communicator the packing allows

enum Field { kStep, kStepRank, kOp, kNumBuffers, kLayoutHash, kTotalCount, kFirstDType, kProblem, kProblemRank,
             kMode, kChunkBytes, kFields };

// The step's mode, packed as checksums | fingerprints << 1 | uncommitted << 2, in words.
std::string ModeText(int64_t mode) {
  return std::string("checksums ") + (mode & 1 ? "on" : "off") + ", fingerprints " + (mode & 2 ? "on" : "off") +
         ", commit " + (mode & 4 ? "off" : "on");
}

const char* DTypeName(int64_t code) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64"};
  return code >= 0 && code < kNumDTypes ? names[code] : "none";
}

uint64_t LayoutHash(const std::vector<RingBuffer>& buffers) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over (count, dtype) pairs
  for (const RingBuffer& b : buffers) {
    for (uint64_t v : {static_cast<uint64_t>(b.count), static_cast<uint64_t>(b.dtype)}) {
      h ^= v;
      h *= 1099511628211ull;
    }
  }
  return h >> 2;  // keep it positive as an int64 so that its negation is representable
}

// A committed step with the id of the last committed one: its result is already in the buffers.
bool IsReplay(const Communicator& comm, const StepOptions& opt) {
  return opt.commit && opt.step == comm.last_committed_step() && opt.local_problem == InputProblem::kNone;
}

Status Validate(Communicator& comm, RoundKind kind, const char* name, const std::vector<RingBuffer>& buffers,
                const StepOptions& opt, const Deadline& deadline) {
  std::vector<int64_t> local(kFields), mins, maxs;
  size_t total = 0;
  for (const RingBuffer& b : buffers) total += b.count;
  local[kStep] = opt.step;
  // The rank rides in the low bits of a second copy (steps below 2^43), so that the min and max
  // also say who passed them.
  const bool packable = opt.step >= 0 && opt.step < (int64_t(1) << 42);
  local[kStepRank] = (packable ? opt.step : 0) * kRankSlots + comm.rank();
  local[kOp] = static_cast<int64_t>(opt.op);
  local[kNumBuffers] = static_cast<int64_t>(buffers.size());
  local[kLayoutHash] = static_cast<int64_t>(LayoutHash(buffers));
  // The rank rides in the low bits, so that the max and min also say who passed them.
  local[kTotalCount] = static_cast<int64_t>(total) * kRankSlots + comm.rank();
  const int64_t first_dtype = buffers.empty() ? kNumDTypes : static_cast<int64_t>(buffers[0].dtype);
  local[kFirstDType] = first_dtype * kRankSlots + comm.rank();
  local[kProblem] = static_cast<int64_t>(opt.local_problem);
  local[kProblemRank] = opt.local_problem == InputProblem::kNone ? -1 : comm.rank();
  // The ranks ride in the low bits here too: each of these changes the ring's messages or whether
  // an agreement follows it.
  local[kMode] = ((opt.checksums ? 1 : 0) | (opt.fingerprints ? 2 : 0) | (opt.commit ? 0 : 4)) * kRankSlots +
                 comm.rank();
  local[kChunkBytes] = static_cast<int64_t>(opt.chunk_bytes) * kRankSlots + comm.rank();
  if (opt.step <= comm.last_committed_step() && !IsReplay(comm, opt)) {
    local[kProblem] = static_cast<int64_t>(InputProblem::kStepNotAfterCommitted);
    local[kProblemRank] = comm.rank();
  }
  Status s = MinMaxRound(comm, kind, local, &mins, &maxs, deadline);
  if (s.code == StatusCode::kCollectiveMismatch) {
    s.message = std::string(name) + " step " + std::to_string(opt.step) + ": " + s.message;
    s.step = opt.step;
  }
  if (!s.ok()) return s;
  auto max_of = [&](int f) { return maxs[f]; };
  auto min_of = [&](int f) { return mins[f]; };

  std::string why;
  if (max_of(kProblem) == static_cast<int64_t>(InputProblem::kStepNotAfterCommitted)) {
    why = RankName(comm, max_of(kProblemRank)) + " passed step " +
          std::to_string(min_of(kStep)) + ", which is not after the last committed step " +
          std::to_string(comm.last_committed_step()) + " (steps must increase)";
  } else if (max_of(kProblem) != 0) {
    why = RankName(comm, max_of(kProblemRank)) + " rejected its input: " +
          InputProblemText(static_cast<InputProblem>(max_of(kProblem)));
  } else if (min_of(kStep) != max_of(kStep)) {
    why = "ranks passed different step ids (" + RankName(comm, min_of(kStepRank) % kRankSlots) + ": " +
          std::to_string(min_of(kStep)) + ", " + RankName(comm, max_of(kStepRank) % kRankSlots) + ": " +
          std::to_string(max_of(kStep)) + ")";
  } else if (min_of(kOp) != max_of(kOp)) {
    why = "ranks passed different reduction ops (codes " + std::to_string(min_of(kOp)) + " and " +
          std::to_string(max_of(kOp)) + ")";
  } else if (min_of(kMode) / kRankSlots != max_of(kMode) / kRankSlots) {
    why = "ranks differ on the corruption guard or the commit (FTCOMM_CHECKSUMS, FTCOMM_FINGERPRINTS, "
          "FTCOMM_STEP_COMMIT, commit=; " +
          RankName(comm, min_of(kMode) % kRankSlots) + ": " + ModeText(min_of(kMode) / kRankSlots) + ", " +
          RankName(comm, max_of(kMode) % kRankSlots) + ": " + ModeText(max_of(kMode) / kRankSlots) + ")";
  } else if (!opt.commit && (opt.checksums || opt.fingerprints)) {
    why = "the corruption guard (checksums, fingerprints) needs a committed step: its verdict rides in the "
          "commit agreement, which an uncommitted step (commit=False) does not have";
  } else if (min_of(kChunkBytes) / kRankSlots != max_of(kChunkBytes) / kRankSlots) {
    why = "ranks passed different chunk_bytes (" + RankName(comm, min_of(kChunkBytes) % kRankSlots) + ": " +
          std::to_string(min_of(kChunkBytes) / kRankSlots) + ", " + RankName(comm, max_of(kChunkBytes) % kRankSlots) +
          ": " + std::to_string(max_of(kChunkBytes) / kRankSlots) + ")";
  } else if (min_of(kNumBuffers) != max_of(kNumBuffers)) {
    why = "ranks passed different numbers of buffers (from " + std::to_string(min_of(kNumBuffers)) +
          " to " + std::to_string(max_of(kNumBuffers)) + ")";
  } else if (min_of(kTotalCount) / kRankSlots != max_of(kTotalCount) / kRankSlots) {
    why = "ranks passed buffers of different lengths (" + RankName(comm, min_of(kTotalCount) % kRankSlots) +
          ": " + std::to_string(min_of(kTotalCount) / kRankSlots) + " elements, " +
          RankName(comm, max_of(kTotalCount) % kRankSlots) + ": " +
          std::to_string(max_of(kTotalCount) / kRankSlots) + ")";
  } else if (min_of(kFirstDType) / kRankSlots != max_of(kFirstDType) / kRankSlots) {
    why = "ranks passed different dtypes (" + RankName(comm, min_of(kFirstDType) % kRankSlots) + ": " +
          DTypeName(min_of(kFirstDType) / kRankSlots) + ", " + RankName(comm, max_of(kFirstDType) % kRankSlots) +
          ": " + DTypeName(max_of(kFirstDType) / kRankSlots) + ")";
  } else if (min_of(kLayoutHash) != max_of(kLayoutHash)) {
    why = "ranks passed buffers of different lengths or dtypes (within the bucket)";
  }
  if (why.empty()) return Status::Ok();
  // Name the step the same way on every rank, even when their step ids differ (the highest).
  const int64_t step = max_of(kStep);
  Status err = Status::Error(StatusCode::kInvalidInput, std::string(name) + " step " + std::to_string(step) + ": " + why);
  err.step = step;
  return err;
}

// FTCOMM_PROFILE=1 (CoreSettings::profile) prints each step's phase times (validate, ring,
// agree) to stderr: the tool for telling protocol latency from ring bandwidth when tuning.
bool ProfileEnabled() { return CurrentSettings().profile; }

std::string FormatSeconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", seconds);
  return buf;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Seconds the commit agreement may take beyond the step's deadline (with the 0.5 s a timed-out
// wait may spend draining, a step returns at most 1.5 s after its timeout).
constexpr double kAgreeGraceSeconds = 1.0;

// Agreement bits: a set bit means "all is well" so that the AND clears it if any rank objects.
constexpr int kBitCompleted = 1;
constexpr int kBitNoTimeout = 2;
constexpr int kBitNoCorruption = 4;
// With fingerprints, bits 3-16 hold a 14-bit fingerprint of the rank's result and bits 17-30 its
// complement. The agreement ANDs both: they come back as each other's complement exactly when every
// rank brought the same fingerprint (a bit where two ranks differ is cleared in both), so every rank
// reaches the same verdict from the one agreement. A rank without a result brings all ones in both
// (it changes neither AND; the step aborts anyway).
constexpr int kFingerprintBits = 14;
constexpr int kFingerprintMask = (1 << kFingerprintBits) - 1;
constexpr int kFingerprintShift = 3;
constexpr int kComplementShift = kFingerprintShift + kFingerprintBits;

int FingerprintBits(uint64_t fingerprint, bool have) {
  const int fp = have ? static_cast<int>(fingerprint & kFingerprintMask) : kFingerprintMask;
  const int complement = have ? (~fp & kFingerprintMask) : kFingerprintMask;
  return (fp << kFingerprintShift) | (complement << kComplementShift);
}

bool FingerprintsAgree(int agreed_flag) {
  const int fp = (agreed_flag >> kFingerprintShift) & kFingerprintMask;
  const int complement = (agreed_flag >> kComplementShift) & kFingerprintMask;
  return (fp | complement) == kFingerprintMask;
}

// splitmix64's finalizer: every bit of the result depends on every bit of the input, so the 14
// bits taken for the agreement are as good as any.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A rank whose result differed from a strict majority's is suspect; singled out again within
// kFenceWindowSteps committed steps (of any communicator of this process) it is faulty, not
// unlucky: it fences itself (SIGKILL), and its peers recover from it as from any failure (shrink,
// or a spare in its place). Once is not enough: one flip in memory is a transient fault.
constexpr int64_t kFenceWindowSteps = 1000;
std::atomic<int64_t> g_committed_steps{0};
std::atomic<int64_t> g_last_odd_one_out{std::numeric_limits<int64_t>::min() / 2};

void FenceIfOddOneOutAgain(Communicator& comm, const std::string& why) {
  const int64_t now = g_committed_steps.load();
  const int64_t last = g_last_odd_one_out.exchange(now);
  if (now - last > kFenceWindowSteps) return;
  std::fprintf(stderr,
               "ftcomm: world rank %d fences itself (pid %d): %s, again within %lld committed steps; "
               "SIGKILL so that its peers go on without it\n",
               comm.world_ranks()[comm.rank()], static_cast<int>(getpid()), why.c_str(),
               static_cast<long long>(kFenceWindowSteps));
  std::fflush(stderr);
  kill(getpid(), SIGKILL);
}

// After an agreement that found different results: one round of small messages in which every
// rank learns every rank's full fingerprint; those outside the largest group of equal ones (all,
// without a strict majority) are named, the same on every rank.
Status ResultsDifferError(Communicator& comm, const char* name, const StepOptions& opt, uint64_t fingerprint) {
  const int n = comm.size();
  std::vector<int64_t> mine(n, -1), mins, maxs;
  mine[comm.rank()] = static_cast<int64_t>(fingerprint >> 2);  // non-negative: -1 is "not mine"
  std::string what = std::string(name) + " step " + std::to_string(opt.step) +
                     " voided: silent data corruption: the ranks' results differ";
  Status out = Status::Error(StatusCode::kResultsDiffer, what + "; buffers unchanged, nothing committed: redo the step");
  if (MinMaxAcrossRanks(comm, RoundKind::kMinMax, mine, &mins, &maxs, opt.timeout_s).ok()) {
    std::map<int64_t, int> count;
    for (int64_t v : maxs) ++count[v];
    int64_t common = maxs[0];
    for (const auto& [value, c] : count) {
      if (c > count[common]) common = value;
    }
    const bool majority = 2 * count[common] > n;
    std::vector<int> named;
    std::string list;
    for (int r = 0; r < n; ++r) {
      if (majority && maxs[r] == common) continue;
      named.push_back(comm.world_ranks()[r]);
      list += (list.empty() ? "" : ", ") + std::to_string(comm.world_ranks()[r]);
    }
    const std::string who = named.size() == 1 ? "world rank " + list + " differs" : "world ranks " + list + " differ";
    out = Status::Error(StatusCode::kResultsDiffer,
                        what + (majority ? ": " + who + " from the majority" : ": no majority; " + who) +
                            "; buffers unchanged, nothing committed: redo the step");
    out.failed_ranks = named;
    if (majority && maxs[comm.rank()] != common) FenceIfOddOneOutAgain(comm, "its allreduce result differed from the majority's");
  }
  out.step = opt.step;
  return out;
}

// After an agreement that found corruption somewhere: every rank learns which world ranks were
// implicated (the highest detecting rank and its sender), so that the error reads the same
// everywhere. One round of small messages; if it fails the error names no ranks.
Status CorruptionError(Communicator& comm, const char* name, const StepOptions& opt, const Status& local) {
  const bool mine = local.code == StatusCode::kCorruption && local.failed_ranks.size() == 2;
  std::vector<int64_t> mins, maxs;
  Status out;
  std::string what = std::string(name) + " step " + std::to_string(opt.step) +
                     " voided: silent data corruption in transit";
  if (MinMaxAcrossRanks(comm, RoundKind::kMinMax, {mine ? int64_t(comm.rank()) * (int64_t(1) << 20) + local.failed_ranks[0] : -1},
                        &mins, &maxs, opt.timeout_s)
          .ok() &&
      maxs[0] >= 0) {
    const int receiver = static_cast<int>(maxs[0] >> 20), sender = static_cast<int>(maxs[0] & ((1 << 20) - 1));
    const std::string detail = mine && receiver == comm.rank() ? " (" + local.message + ")" : "";
    out = Status::Error(StatusCode::kCorruption,
                        what + ": world rank " + std::to_string(comm.world_ranks()[receiver]) +
                            " found a checksum mismatch in data from world rank " +
                            std::to_string(comm.world_ranks()[sender]) + detail +
                            "; buffers unchanged, nothing committed: redo the step");
    out.failed_ranks = {comm.world_ranks()[sender], comm.world_ranks()[receiver]};
  } else {
    out = Status::Error(StatusCode::kCorruption, what + "; buffers unchanged, nothing committed: redo the step");
  }
  out.step = opt.step;
  return out;
}

Status Abort(Communicator& comm, const char* name, StepBody& body, int agreed_flag, const StepOptions& opt,
             Status local) {
  if (body.undo) body.undo();
  Status out;
  if (!comm.ft_enabled()) {
    out = local.ok() ? Status::Error(StatusCode::kMpiError, std::string("a peer aborted the ") + name) : local;
    out.step = opt.step;
    return out;
  }
  comm.Revoke();
  std::unique_ptr<Communicator> shrunk;
  std::vector<int> old_to_new;
  Status s = comm.Shrink(opt.timeout_s, &shrunk, &old_to_new);
  if (!s.ok()) {
    s.step = opt.step;
    return s;
  }
  std::vector<int> failed;
  for (size_t r = 0; r < old_to_new.size(); ++r) {
    if (old_to_new[r] < 0) failed.push_back(static_cast<int>(r));
  }
  comm.set_recovered(std::move(shrunk), old_to_new);
  std::string what = std::string(name) + " step " + std::to_string(opt.step) + " aborted, buffers unchanged";
  if (!failed.empty()) {
    std::string list;
    for (size_t i = 0; i < failed.size(); ++i) {
      list += (i ? "; " : "") + liveness::Describe(comm.world_ranks()[failed[i]]) + " [rank " +
              std::to_string(failed[i]) + " of " + std::to_string(comm.size()) + "]";
    }
    out = Status::Error(StatusCode::kProcFailed, what + ": failed: " + list);
    out.failed_ranks = failed;
  } else if (!(agreed_flag & kBitNoTimeout)) {
    std::string here = local.code == StatusCode::kTimeout ? "; here: " + local.message : "";
    out = Status::Error(StatusCode::kTimeout, what + ": a rank's deadline passed (" + FormatSeconds(opt.timeout_s) +
                                                  ")" + here);
  } else {
    out = Status::Error(StatusCode::kRevoked, what + ": the communicator was revoked");
  }
  out.step = opt.step;
  return out;
}

// An uncommitted step after its validation: the run, and on a failure a revoke (so that peers
// blocked in the ring leave it too) and this rank's own error. No agreement: the caller's.
Status FinishUncommitted(Communicator& comm, const char* name, const StepOptions& opt, StepBody& body, Status local,
                         const Deadline& deadline, double validate_s, std::chrono::steady_clock::time_point t_start,
                         StepResult* result) {
  if (local.ok() && body.run) local = body.run(deadline);
  // Where the commit agreement would be: fault specs aimed at it still find a point.
  if (local.ok()) fault::Point("commit", comm.world_ranks()[comm.rank()], opt.step);
  result->validate_s = validate_s;
  result->ring_s = SecondsSince(t_start) - validate_s;
  result->agree_s = 0;
  if (ProfileEnabled()) {
    std::fprintf(stderr, "ftcomm-profile rank %d %s step %lld (uncommitted): validate %.1f us, ring %.1f us\n",
                 comm.rank(), name, static_cast<long long>(opt.step), validate_s * 1e6, result->ring_s * 1e6);
  }
  if (local.ok()) return local;
  if (comm.ft_enabled()) comm.Revoke();
  local.message = std::string(name) + " step " + std::to_string(opt.step) +
                  " (uncommitted) failed here, buffers undefined until the caller's agreement: " + local.message;
  local.step = opt.step;
  return local;
}

// A replay does nothing, but it is checked with the peers as any step is: one input check round,
// so that a rank replaying while the others take the next step (or another collective) is an
// error on every rank at once, not a wait until the peers' deadline. A failure or a revoked
// communicator is not the replay's to report (nothing is done; the next collective sees it),
// nor is there anybody to check with on a communicator already recovered.
Status Replay(Communicator& comm, RoundKind kind, const char* name, const std::vector<RingBuffer>& validated,
              const StepOptions& opt, StepResult* result) {
  if (!comm.has_recovered() && !comm.IsRevoked()) {
    liveness::ActivityScope activity(liveness::Activity::kAllreduce, opt.step);
    Status s = Validate(comm, kind, name, validated, opt, Deadline(opt.timeout_s));
    if (s.code == StatusCode::kInvalidInput || s.code == StatusCode::kCollectiveMismatch ||
        s.code == StatusCode::kTimeout) {
      if (s.step < 0) s.step = opt.step;
      return s;
    }
  }
  result->replayed = true;
  return Status::Ok();
}

}  // namespace

const char* InputProblemText(InputProblem problem) {
  switch (problem) {
    case InputProblem::kNone: return "no problem";
    case InputProblem::kNotContiguous: return "a buffer is not contiguous";
    case InputProblem::kReadOnly: return "a buffer is read-only";
    case InputProblem::kUnsupportedDType:
      return "a buffer has an unsupported dtype (supported: float32, float64, float16, bfloat16, int32, int64)";
    case InputProblem::kUnsupportedOp: return "the reduction op is not supported (supported: sum, avg, min, max, prod)";
    case InputProblem::kNotABuffer: return "an argument is not an array or tensor (numpy, torch, CUDA array)";
    case InputProblem::kMixedDevices:
      return "host and device buffers are mixed in one step (or buffers on two devices, or CUDA unavailable)";
    case InputProblem::kStepNotAfterCommitted: return "its step id is not after the last committed step";
    case InputProblem::kOutputShape:
      return "the output is not 1/N of the input (N the world size) or has another dtype than the input";
    case InputProblem::kBadChunkBytes: return "its chunk_bytes is not a positive integer";
    case InputProblem::kUncommittedDevice:
      return "commit=False takes host buffers only (device buffers are staged and copied back on a commit)";
  }
  return "invalid input";
}

Status RunCommittedStep(Communicator& comm, RoundKind kind, const char* name,
                        const std::vector<RingBuffer>& validated, const StepOptions& opt, StepBody& body,
                        StepResult* result) {
  result->replayed = false;
  if (IsReplay(comm, opt)) return Replay(comm, kind, name, validated, opt, result);
  if (comm.has_recovered()) {
    // Every survivor went through this communicator's abort already and holds its shrunk
    // successor: the same answer everywhere, with no communication.
    Status s = Status::Error(StatusCode::kRevoked, std::string(name) +
                                                       " on a communicator that already failed: call recover() first");
    s.step = opt.step;
    return s;
  }
  liveness::ActivityScope activity(liveness::Activity::kAllreduce, opt.step);
  const Deadline deadline(opt.timeout_s);
  const int world_rank = comm.world_ranks()[comm.rank()];
  fault::Point("before", world_rank, opt.step);

  const auto t_start = std::chrono::steady_clock::now();
  // Revoked before this rank arrived (a failure seen by a peer): no early return, which would
  // leave the peers alone in their agreement; this rank joins it with "not completed" and every
  // rank takes the same path through the abort's shrink.
  Status local = comm.IsRevoked()
                     ? Status::Error(StatusCode::kRevoked, std::string(name) + ": the communicator was revoked")
                     : Validate(comm, kind, name, validated, opt, deadline);
  const double validate_s = SecondsSince(t_start);
  if (local.code == StatusCode::kInvalidInput || local.code == StatusCode::kCollectiveMismatch) {
    if (local.step < 0) local.step = opt.step;
    return local;  // uniform: every rank saw the same validation result
  }
  if (!opt.commit) return FinishUncommitted(comm, name, opt, body, local, deadline, validate_s, t_start, result);
  if (local.ok() && body.run) local = body.run(deadline);
  const double ring_s = SecondsSince(t_start) - validate_s;
  // A rank that failed locally revokes, so peers blocked in the ring leave it too. Corruption is
  // no such failure: the ring completed, every request with it.
  const bool corrupted = local.code == StatusCode::kCorruption;
  if (!local.ok() && !corrupted && comm.ft_enabled()) comm.Revoke();

  fault::Point("commit", world_rank, opt.step);
  const bool compare_results = opt.fingerprints && static_cast<bool>(body.fingerprint);
  const uint64_t fingerprint = compare_results && local.ok() ? Mix(body.fingerprint()) : 0;
  int flag = (local.ok() || corrupted ? kBitCompleted : 0) | (local.code == StatusCode::kTimeout ? 0 : kBitNoTimeout) |
             (corrupted ? 0 : kBitNoCorruption) | FingerprintBits(fingerprint, compare_results && local.ok());
  bool saw_failure = false;
  // What is left of the step's deadline, and a little more: after a failure every rank leaves
  // the ring at once (the communicator is revoked), so the agreement waits only for stragglers.
  const double agree_timeout_s = std::max(deadline.seconds_left(), 0.0) + kAgreeGraceSeconds;
  Status agreed = comm.Agree(&flag, agree_timeout_s, &saw_failure);
  result->validate_s = validate_s;
  result->ring_s = ring_s;
  result->agree_s = SecondsSince(t_start) - validate_s - ring_s;
  if (ProfileEnabled()) {
    std::fprintf(stderr, "ftcomm-profile rank %d %s step %lld: validate %.1f us, ring %.1f us, agree %.1f us\n",
                 comm.rank(), name, static_cast<long long>(opt.step), validate_s * 1e6, ring_s * 1e6,
                 result->agree_s * 1e6);
  }
  const bool same_results = FingerprintsAgree(flag);
  if (agreed.ok() && !saw_failure && (flag & kBitCompleted) && (flag & kBitNoCorruption) && same_results) {
    if (body.commit) body.commit();
    comm.set_last_committed_step(opt.step);
    g_committed_steps.fetch_add(1);
    return Status::Ok();
  }
  if (agreed.ok() && !saw_failure && (flag & kBitCompleted)) {
    if (body.undo) body.undo();
    if (flag & kBitNoCorruption) return ResultsDifferError(comm, name, opt, fingerprint);  // kResultsDiffer
    return CorruptionError(comm, name, opt, local);
  }
  if (!agreed.ok()) {
    if (body.undo) body.undo();
    // The agreement itself did not complete: a rank is alive but not here (it left the
    // program, or is in another call), so no uniform outcome is possible.
    agreed.message = std::string(name) + " step " + std::to_string(opt.step) + ", buffers unchanged: " + agreed.message;
    if (local.code == StatusCode::kTimeout && local.message != agreed.message) agreed.message += "; before: " + local.message;
    agreed.step = opt.step;
    return agreed;
  }
  return Abort(comm, name, body, flag, opt, local);
}

}  // namespace ftcomm
