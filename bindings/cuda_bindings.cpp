// Python bindings of ftcomm's CUDA support (GPU buffers), registered into ftcomm._C by
// RegisterCudaBindings. Defined in every build: without FTCOMM_WITH_CUDA the CUDA functions
// raise RuntimeError naming why CUDA was left out, while the staging logic stays callable with
// host-memory copies (`host_memory_ops=True`) for CPU-only tests. ftcomm/core/cuda.py is the Python
// face of these functions; device memory is passed as integer addresses, streams as integer
// cudaStream_t handles.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/allreduce_step.h"
#include "collectives/dtype.h"
#include "core/communicator.h"
#include "core/mpi_compat.h"
#include "core/status.h"
#include "cuda/staged_allreduce.h"
#ifdef FTCOMM_WITH_CUDA
#include "cuda/reduce_cuda.h"
#endif

namespace py = pybind11;

// Defined in bindings/module.cpp.
ftcomm::Communicator& CoreCommunicatorOf(py::handle communicator);
void RaiseIfError(const ftcomm::Status& status);
ftcomm::StepOptions StepOptionsFrom(int op, int64_t step, double timeout, size_t chunk_bytes, int problem,
                                    bool checksums, bool fingerprints);

namespace {

#ifndef FTCOMM_WITH_CUDA
#ifndef FTCOMM_CUDA_SKIPPED_REASON
#define FTCOMM_CUDA_SKIPPED_REASON "unknown reason"
#endif
const char* const kNoCuda = "ftcomm was built without CUDA (" FTCOMM_CUDA_SKIPPED_REASON
                            "): rebuild with nvcc on PATH and FTCOMM_CUDA unset";

[[noreturn]] void NoCuda() { throw std::runtime_error(kNoCuda); }
#else
// Raises RuntimeError with the message of a failed CUDA call.
void Ok(bool ok, const std::string& err) {
  if (!ok) throw std::runtime_error(err);
}
#endif

ftcomm::DType DTypeOf(int code) {
  if (!ftcomm::ValidDType(code)) throw py::value_error("invalid dtype code");
  return static_cast<ftcomm::DType>(code);
}

ftcomm::ReduceOp OpOf(int code) {
  if (!ftcomm::ValidReduceOp(code)) throw py::value_error("invalid op code");
  return static_cast<ftcomm::ReduceOp>(code);
}

void* Ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

using DeviceQuad = std::tuple<uintptr_t, size_t, int, uintptr_t>;  // (address, count, dtype, stream)

py::tuple StagedAllreduce(py::handle communicator, const std::vector<DeviceQuad>& quads, int device,
                          int op, int64_t step, double timeout, size_t chunk_bytes, int problem,
                          bool checksums, bool fingerprints, bool host_memory_ops) {
  ftcomm::Communicator& comm = CoreCommunicatorOf(communicator);
  std::vector<ftcomm::DeviceBuffer> buffers;
  for (const DeviceQuad& q : quads) {
    ftcomm::DeviceBuffer b;
    b.data = Ptr(std::get<0>(q));
    b.count = std::get<1>(q);
    b.dtype = DTypeOf(std::get<2>(q));
    b.stream = Ptr(std::get<3>(q));
    buffers.push_back(b);
  }
  const ftcomm::StagingOps* ops = &ftcomm::HostMemoryStagingOps();
  if (!host_memory_ops) {
#ifdef FTCOMM_WITH_CUDA
    ops = &ftcomm::CudaStagingOps();
#else
    NoCuda();
#endif
  }
  // the guard, if on, runs on the pinned host copy
  ftcomm::AllreduceStepOptions opt = StepOptionsFrom(op, step, timeout, chunk_bytes, problem, checksums, fingerprints);
  ftcomm::AllreduceStepResult result;
  ftcomm::StagedStepStats stats;
  ftcomm::Status s;
  {
    py::gil_scoped_release release;
    s = ftcomm::StagedAllreduceStep(comm, buffers, device, opt, *ops, &result, &stats);
  }
  RaiseIfError(s);
  return py::make_tuple(result.replayed, stats.copy_in_s, stats.step_s, stats.copy_out_s);
}

}  // namespace

void RegisterCudaBindings(py::module_& m) {
#ifdef FTCOMM_WITH_CUDA
  m.def("cuda_compiled_in", [] { return true; });
  m.def("cuda_status", [] {
    std::string reason;
    bool ok = ftcomm::cuda::Available(&reason);
    return py::make_tuple(ok, reason);
  });
  m.def("cuda_versions", [] {
    return py::make_tuple(ftcomm::cuda::RuntimeVersion(), ftcomm::cuda::DriverVersion());
  });
  m.def("cuda_reduce", [](int dtype, int op, uintptr_t in, uintptr_t inout, size_t n, uintptr_t stream) {
    std::string err;
    Ok(ftcomm::cuda::Reduce(DTypeOf(dtype), OpOf(op), Ptr(in), Ptr(inout), n, Ptr(stream), &err), err);
  });
  m.def("cuda_scale", [](int dtype, uintptr_t buf, size_t n, int divisor, uintptr_t stream) {
    std::string err;
    Ok(ftcomm::cuda::Scale(DTypeOf(dtype), Ptr(buf), n, divisor, Ptr(stream), &err), err);
  });
  m.def("cuda_time_reduce", [](int dtype, int op, uintptr_t in, uintptr_t inout, size_t n, int iters,
                               uintptr_t stream) {
    std::string err;
    float ms = 0;
    bool ok;
    {
      py::gil_scoped_release release;
      ok = ftcomm::cuda::TimeReduce(DTypeOf(dtype), OpOf(op), Ptr(in), Ptr(inout), n, iters, Ptr(stream),
                                    &ms, &err);
    }
    Ok(ok, err);
    return ms;
  });
  m.def("cuda_malloc", [](size_t bytes) {
    void* p = nullptr;
    std::string err;
    Ok(ftcomm::cuda::Malloc(&p, bytes, &err), err);
    return reinterpret_cast<uintptr_t>(p);
  });
  m.def("cuda_free", [](uintptr_t p) {
    std::string err;
    Ok(ftcomm::cuda::Free(Ptr(p), &err), err);
  });
  m.def("cuda_copy_to_device", [](uintptr_t dst, uintptr_t src, size_t bytes) {
    std::string err;
    Ok(ftcomm::cuda::CopyToDevice(Ptr(dst), Ptr(src), bytes, &err), err);
  });
  m.def("cuda_copy_from_device", [](uintptr_t dst, uintptr_t src, size_t bytes) {
    std::string err;
    Ok(ftcomm::cuda::CopyFromDevice(Ptr(dst), Ptr(src), bytes, &err), err);
  });
  m.def("cuda_pointer_device", [](uintptr_t p) {
    int device = -1;
    std::string err;
    Ok(ftcomm::cuda::PointerDevice(Ptr(p), &device, &err), err);
    return device;
  });
  m.def("cuda_get_device", [] {
    int device = -1;
    std::string err;
    Ok(ftcomm::cuda::GetDevice(&device, &err), err);
    return device;
  });
  m.def("cuda_set_device", [](int device) {
    std::string err;
    Ok(ftcomm::cuda::SetDevice(device, &err), err);
  });
  m.def("cuda_synchronize", [](uintptr_t stream) {
    std::string err;
    bool ok;
    {
      py::gil_scoped_release release;
      ok = ftcomm::cuda::StreamSynchronize(Ptr(stream), &err);
    }
    Ok(ok, err);
  });
#else
  m.def("cuda_compiled_in", [] { return false; });
  m.def("cuda_status", [] { return py::make_tuple(false, std::string(kNoCuda)); });
  m.def("cuda_versions", [] { return py::make_tuple(0, 0); });
  m.def("cuda_reduce", [](int, int, uintptr_t, uintptr_t, size_t, uintptr_t) { NoCuda(); });
  m.def("cuda_scale", [](int, uintptr_t, size_t, int, uintptr_t) { NoCuda(); });
  m.def("cuda_time_reduce", [](int, int, uintptr_t, uintptr_t, size_t, int, uintptr_t) -> float { NoCuda(); });
  m.def("cuda_malloc", [](size_t) -> uintptr_t { NoCuda(); });
  m.def("cuda_free", [](uintptr_t) { NoCuda(); });
  m.def("cuda_copy_to_device", [](uintptr_t, uintptr_t, size_t) { NoCuda(); });
  m.def("cuda_copy_from_device", [](uintptr_t, uintptr_t, size_t) { NoCuda(); });
  m.def("cuda_pointer_device", [](uintptr_t) -> int { NoCuda(); });
  m.def("cuda_get_device", []() -> int { NoCuda(); });
  m.def("cuda_set_device", [](int) { NoCuda(); });
  m.def("cuda_synchronize", [](uintptr_t) { NoCuda(); });
#endif
  m.def("cuda_aware_mpi", &ftcomm::CudaAwareMpi,
        "1 if the MPI library passes device pointers (MPIX_Query_cuda_support), 0 if not, -1 unknown");
  m.def("cuda_allreduce", &StagedAllreduce, py::arg("comm"), py::arg("buffers"), py::arg("device"),
        py::arg("op"), py::arg("step"), py::arg("timeout"), py::arg("chunk_bytes"), py::arg("problem"),
        py::arg("checksums") = false, py::arg("fingerprints") = false, py::arg("host_memory_ops") = false,
        "Staged allreduce of device buffers [(address, count, dtype code, stream)]; returns "
        "(replayed, copy_in_s, step_s, copy_out_s)");
}
