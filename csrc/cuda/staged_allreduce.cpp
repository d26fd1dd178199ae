// Compiled by g++ in every build; the CUDA ops exist only with FTCOMM_WITH_CUDA (see the header).
#include "cuda/staged_allreduce.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "collectives/ring_allreduce.h"

#ifdef FTCOMM_WITH_CUDA
#include "cuda/reduce_cuda.h"
#endif

namespace ftcomm {
namespace {

constexpr size_t kSliceAlign = 64;  // each buffer's slice of the scratch starts on a cache line

// Host scratch, grown on demand and kept for the next step (pinned allocations are slow).
class HostScratch {
 public:
  ~HostScratch() { Release(); }
  bool Get(const StagingOps& ops, size_t bytes, char** out, std::string* err) {
    if (ops_ != &ops || bytes > capacity_) {
      Release();
      void* p = nullptr;
      if (!ops.host_alloc(&p, bytes, err)) return false;
      ops_ = &ops;
      data_ = static_cast<char*>(p);
      capacity_ = bytes;
    }
    *out = data_;
    return true;
  }

 private:
  void Release() {
    if (data_ != nullptr) ops_->host_free(data_);
    data_ = nullptr;
    capacity_ = 0;
    ops_ = nullptr;
  }
  const StagingOps* ops_ = nullptr;
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

HostScratch& Scratch() {
  static HostScratch* s = new HostScratch();  // never destroyed: the CUDA runtime may be gone at exit
  return *s;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Makes `device` current for the scope and restores the previous one.
class DeviceScope {
 public:
  DeviceScope(const StagingOps& ops, int device) : ops_(ops) {
    if (device < 0) return;
    std::string ignored;
    if (!ops_.get_device(&previous_, &ignored)) previous_ = -1;
    if (previous_ == device) return;
    ok_ = ops_.set_device(device, &error_);
    restore_ = ok_ && previous_ >= 0;
  }
  ~DeviceScope() {
    std::string ignored;
    if (restore_) ops_.set_device(previous_, &ignored);
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }

 private:
  const StagingOps& ops_;
  int previous_ = -1;
  bool ok_ = true, restore_ = false;
  std::string error_;
};

// Streams in first-use order, without repeats (a bucket usually has one).
std::vector<void*> DistinctStreams(const std::vector<DeviceBuffer>& buffers) {
  std::vector<void*> out;
  for (const DeviceBuffer& b : buffers) {
    bool seen = false;
    for (void* s : out) seen = seen || s == b.stream;
    if (!seen) out.push_back(b.stream);
  }
  return out;
}

bool SynchronizeAll(const StagingOps& ops, const std::vector<void*>& streams, std::string* err) {
  bool ok = true;
  for (void* s : streams) {
    std::string e;
    if (!ops.synchronize(s, &e) && ok) {
      ok = false;
      *err = e;
    }
  }
  return ok;
}

// --- host-memory ops (tests) ---------------------------------------------------------------
bool HostCopy(void* dst, const void* src, size_t bytes, void*, std::string*) {
  if (bytes) std::memcpy(dst, src, bytes);
  return true;
}
bool HostSync(void*, std::string*) { return true; }
bool HostAllocPlain(void** ptr, size_t bytes, std::string* err) {
  *ptr = std::malloc(bytes == 0 ? 1 : bytes);
  if (*ptr == nullptr && err) *err = "malloc of the staging buffer failed";
  return *ptr != nullptr;
}
void HostFreePlain(void* ptr) { std::free(ptr); }
bool HostSetDevice(int, std::string*) { return true; }
bool HostGetDevice(int* device, std::string*) {
  *device = -1;
  return true;
}

}  // namespace

const StagingOps& HostMemoryStagingOps() {
  static const StagingOps ops{"host memory (test)", HostCopy,      HostCopy,      HostSync,
                              HostAllocPlain,       HostFreePlain, HostSetDevice, HostGetDevice};
  return ops;
}

#ifdef FTCOMM_WITH_CUDA
const StagingOps& CudaStagingOps() {
  static const StagingOps ops{"cuda",           cuda::CopyDeviceToHostAsync, cuda::CopyHostToDeviceAsync,
                              cuda::StreamSynchronize, cuda::HostAlloc,     cuda::HostFree,
                              cuda::SetDevice,  cuda::GetDevice};
  return ops;
}
#endif

Status StagedAllreduceStep(Communicator& comm, std::vector<DeviceBuffer>& buffers, int device,
                           const AllreduceStepOptions& options, const StagingOps& ops,
                           AllreduceStepResult* result, StagedStepStats* stats) {
  StagedStepStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  AllreduceStepOptions opt = options;
  std::string copy_error;
  std::vector<RingBuffer> host;
  std::vector<void*> streams = DistinctStreams(buffers);

  DeviceScope scope(ops, device);
  if (!scope.ok()) copy_error = scope.error();

  // 1. Copy in. Skipped when this rank already rejected its input: it joins the validation
  //    with no buffers and the step fails on every rank.
  auto t0 = std::chrono::steady_clock::now();
  if (copy_error.empty() && opt.local_problem == InputProblem::kNone) {
    size_t total = 0;
    for (const DeviceBuffer& b : buffers) {
      total += (b.count * ElementSize(b.dtype) + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
    }
    char* scratch = nullptr;
    if (Scratch().Get(ops, total, &scratch, &copy_error)) {
      size_t offset = 0;
      for (const DeviceBuffer& b : buffers) {
        const size_t bytes = b.count * ElementSize(b.dtype);
        RingBuffer r;
        r.data = scratch + offset;
        r.count = b.count;
        r.dtype = b.dtype;
        host.push_back(r);
        if (!ops.copy_to_host(r.data, b.data, bytes, b.stream, &copy_error)) break;
        offset += (bytes + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
      }
      std::string sync_error;
      // Synchronise even after a failed copy: earlier copies must not land after we return.
      if (!SynchronizeAll(ops, streams, &sync_error) && copy_error.empty()) copy_error = sync_error;
    }
  }
  if (!copy_error.empty()) {
    opt.local_problem = InputProblem::kNotABuffer;
    host.clear();
  } else if (opt.local_problem != InputProblem::kNone) {
    host.clear();
  }
  stats->copy_in_s = Seconds(t0);

  // 2. The host commit protocol on the pinned copy.
  auto t1 = std::chrono::steady_clock::now();
  Status s = AllreduceStep(comm, host, opt, result);
  stats->step_s = Seconds(t1);
  if (!copy_error.empty()) {
    // Every rank failed validation because of this rank; say why here.
    Status out = Status::Error(s.ok() ? StatusCode::kMpiError : s.code,
                               "copying device buffers to host memory failed (" + copy_error +
                                   "); " + (s.ok() ? std::string("step not run") : s.message));
    out.step = opt.step;
    out.failed_ranks = s.failed_ranks;
    return out;
  }
  if (!s.ok() || result->replayed) return s;  // abort, invalid input or replay: device untouched

  // 3. Commit: copy the results back.
  auto t2 = std::chrono::steady_clock::now();
  std::string err;
  for (size_t i = 0; i < buffers.size() && err.empty(); ++i) {
    const DeviceBuffer& b = buffers[i];
    ops.copy_to_device(b.data, host[i].data, b.count * ElementSize(b.dtype), b.stream, &err);
  }
  std::string sync_error;
  if (!SynchronizeAll(ops, streams, &sync_error) && err.empty()) err = sync_error;
  stats->copy_out_s = Seconds(t2);
  if (!err.empty()) {
    Status out = Status::Error(StatusCode::kMpiError,
                               "allreduce step " + std::to_string(opt.step) +
                                   " committed, but copying the result back to the device failed (" +
                                   err + "): this rank's device buffers are undefined");
    out.step = opt.step;
    return out;
  }
  return Status::Ok();
}

}  // namespace ftcomm
