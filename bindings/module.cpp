// Python bindings of the core (module ftcomm._C). This layer only converts: Python objects to
// pointers and lengths, core Status to ftcomm exceptions, and it releases the GIL around every
// call that may block. Buffers arrive as (address, element count, dtype code) triples prepared
// by ftcomm/core/buffers.py, which owns the numpy/torch/CuPy specifics. The core's enums (status
// codes, dtypes, ops, input problems, fault kinds, message tags) are exported here, so that Python
// reads every code from the C++ definition instead of a copy.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mpi.h>
#include <mpi4py/mpi4py.h>

#include <memory>
#include <tuple>
#include <vector>

#include "collectives/allreduce_step.h"
#include "collectives/reduce_scatter_step.h"
#include "collectives/exchange.h"
#include "core/communicator.h"
#include "core/liveness.h"
#include "core/mpi_compat.h"
#include "core/mpi_serial.h"
#include "core/settings.h"
#include "core/tags.h"
#include "core/watchdog.h"
#include "fault/injection.h"

namespace py = pybind11;
using ftcomm::Communicator;
using ftcomm::Status;
using ftcomm::StatusCode;

namespace {

// liveness::ActivityScope as a Python context manager, for waits that Python code runs itself
// (the torch backend's inner data-plane groups): entered and left on one thread, as the scope's
// nesting count is per thread.
class PyActivityScope {
 public:
  PyActivityScope(ftcomm::liveness::Activity activity, int64_t step) : activity_(activity), step_(step) {}
  void Enter() { scope_ = std::make_unique<ftcomm::liveness::ActivityScope>(activity_, step_); }
  void Exit() { scope_.reset(); }

 private:
  ftcomm::liveness::Activity activity_;
  int64_t step_;
  std::unique_ptr<ftcomm::liveness::ActivityScope> scope_;
};

// Raises the ftcomm exception for a non-OK status (the classes live in ftcomm/errors.py, the
// mapping from status code to class in ftcomm/core/codes.py).
void ThrowIfError(const Status& s) {
  if (s.ok()) return;
  py::object from_status = py::module_::import("ftcomm.core.codes").attr("exception_from_status");
  py::object exc = from_status(s.code, s.message, s.failed_ranks, s.step);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

MPI_Comm CommFromMpi4py(py::object obj) {
  MPI_Comm* comm = PyMPIComm_Get(obj.ptr());
  if (comm == nullptr) throw py::error_already_set();
  return *comm;
}

// A Python-owned handle around a core communicator.
struct PyCommunicator {
  std::unique_ptr<Communicator> core;
};

using Triple = std::tuple<uintptr_t, size_t, int>;  // (address, count, dtype code)


py::tuple StepTuple(const ftcomm::StepResult& r) {
  return py::make_tuple(r.replayed, r.validate_s, r.ring_s, r.agree_s);
}

std::vector<ftcomm::RingBuffer> ToRingBuffers(const std::vector<Triple>& triples) {
  std::vector<ftcomm::RingBuffer> out;
  out.reserve(triples.size());
  for (const Triple& t : triples) {
    if (!ftcomm::ValidDType(std::get<2>(t))) throw py::value_error("invalid dtype code");
    ftcomm::RingBuffer b;
    b.data = reinterpret_cast<char*>(std::get<0>(t));
    b.count = std::get<1>(t);
    b.dtype = static_cast<ftcomm::DType>(std::get<2>(t));
    out.push_back(b);
  }
  return out;
}

PyCommunicator Create(py::object mpi4py_comm, double timeout_s) {
  MPI_Comm parent = CommFromMpi4py(mpi4py_comm);
  PyCommunicator out;
  Status s;
  {
    py::gil_scoped_release release;
    s = Communicator::Create(parent, timeout_s, &out.core);
  }
  ThrowIfError(s);
  return out;
}

}  // namespace

// Hooks for bindings/cuda_bindings.cpp: the core communicator behind a _C.Communicator, and the
// Status-to-exception conversion.
ftcomm::Communicator& CoreCommunicatorOf(py::handle communicator) {
  return *py::cast<PyCommunicator&>(communicator).core;
}

// The step options of a committed collective from the binding's arguments (also used by
// bindings/cuda_bindings.cpp); chunk_bytes is clamped to [64 B, 1 GiB].
ftcomm::StepOptions StepOptionsFrom(int op, int64_t step, double timeout, size_t chunk_bytes, int problem,
                                    bool checksums = false, bool fingerprints = false) {
  if (!ftcomm::ValidReduceOp(op)) throw py::value_error("invalid op code");
  ftcomm::StepOptions opt;
  opt.op = static_cast<ftcomm::ReduceOp>(op);
  opt.step = step;
  opt.timeout_s = timeout;
  opt.chunk_bytes = std::min<size_t>(std::max<size_t>(chunk_bytes, 64), size_t(1) << 30);
  opt.local_problem = static_cast<ftcomm::InputProblem>(problem);
  opt.checksums = checksums;
  opt.fingerprints = fingerprints;
  return opt;
}
void RaiseIfError(const Status& status) { ThrowIfError(status); }
void RegisterCudaBindings(py::module_& m);  // defined in bindings/cuda_bindings.cpp

namespace {

void RegisterEnums(py::module_& m) {
  py::enum_<StatusCode>(m, "StatusCode", "Outcome of a core call (core/status.h).")
      .value("OK", StatusCode::kOk)
      .value("PROC_FAILED", StatusCode::kProcFailed)
      .value("REVOKED", StatusCode::kRevoked)
      .value("TIMEOUT", StatusCode::kTimeout)
      .value("ULFM_UNAVAILABLE", StatusCode::kUlfmUnavailable)
      .value("INVALID_INPUT", StatusCode::kInvalidInput)
      .value("MPI_ERROR", StatusCode::kMpiError)
      .value("CORRUPTION", StatusCode::kCorruption)
      .value("RESULTS_DIFFER", StatusCode::kResultsDiffer)
      .value("COLLECTIVE_MISMATCH", StatusCode::kCollectiveMismatch);
  py::enum_<ftcomm::DType>(m, "DType", py::arithmetic(), "Element types (collectives/dtype.h).")
      .value("FLOAT32", ftcomm::DType::kFloat32)
      .value("FLOAT64", ftcomm::DType::kFloat64)
      .value("FLOAT16", ftcomm::DType::kFloat16)
      .value("BFLOAT16", ftcomm::DType::kBFloat16)
      .value("INT32", ftcomm::DType::kInt32)
      .value("INT64", ftcomm::DType::kInt64);
  py::enum_<ftcomm::ReduceOp>(m, "ReduceOp", py::arithmetic(), "Reduction ops (collectives/dtype.h).")
      .value("SUM", ftcomm::ReduceOp::kSum)
      .value("AVG", ftcomm::ReduceOp::kAvg)
      .value("MIN", ftcomm::ReduceOp::kMin)
      .value("MAX", ftcomm::ReduceOp::kMax)
      .value("PROD", ftcomm::ReduceOp::kProd);
  py::enum_<ftcomm::InputProblem>(m, "InputProblem", py::arithmetic(),
                                  "Why a rank rejects its own input (collectives/step_protocol.h).")
      .value("NONE", ftcomm::InputProblem::kNone)
      .value("NOT_CONTIGUOUS", ftcomm::InputProblem::kNotContiguous)
      .value("READ_ONLY", ftcomm::InputProblem::kReadOnly)
      .value("UNSUPPORTED_DTYPE", ftcomm::InputProblem::kUnsupportedDType)
      .value("UNSUPPORTED_OP", ftcomm::InputProblem::kUnsupportedOp)
      .value("NOT_A_BUFFER", ftcomm::InputProblem::kNotABuffer)
      .value("MIXED_DEVICES", ftcomm::InputProblem::kMixedDevices)
      .value("STEP_NOT_AFTER_COMMITTED", ftcomm::InputProblem::kStepNotAfterCommitted)
      .value("OUTPUT_SHAPE", ftcomm::InputProblem::kOutputShape)
      .value("BAD_CHUNK_BYTES", ftcomm::InputProblem::kBadChunkBytes)
      .value("UNCOMMITTED_DEVICE", ftcomm::InputProblem::kUncommittedDevice);
  py::enum_<ftcomm::fault::Kind>(m, "FaultKind", py::arithmetic(), "How an injected fault fails a rank.")
      .value("KILL", ftcomm::fault::Kind::kKill)
      .value("EXIT", ftcomm::fault::Kind::kExit)
      .value("HANG", ftcomm::fault::Kind::kHang)
      .value("STOP", ftcomm::fault::Kind::kStop)
      .value("BITFLIP", ftcomm::fault::Kind::kBitflip);
  py::enum_<ftcomm::RoundKind>(m, "RoundKind", py::arithmetic(),
                               "Which min/max round a rank is in (collectives/minmax_round.h).")
      .value("ALLREDUCE", ftcomm::RoundKind::kAllreduce)
      .value("REDUCE_SCATTER", ftcomm::RoundKind::kReduceScatter)
      .value("MIN_MAX", ftcomm::RoundKind::kMinMax)
      .value("ALLGATHER", ftcomm::RoundKind::kAllgather)
      .value("BROADCAST", ftcomm::RoundKind::kBroadcast);
  py::enum_<ftcomm::Tag>(m, "Tag", py::arithmetic(), "MPI message tags of ftcomm's protocols (core/tags.h).")
      .value("RING", ftcomm::Tag::kRing)
      .value("RING_SUM", ftcomm::Tag::kRingSum)
      .value("VALIDATE", ftcomm::Tag::kValidate)
      .value("REDUCE_SCATTER", ftcomm::Tag::kReduceScatter)
      .value("ALLGATHER", ftcomm::Tag::kAllgather)
      .value("BROADCAST", ftcomm::Tag::kBroadcast)
      .value("ALLTOALL", ftcomm::Tag::kAllToAll)
      .value("MONITORED_BARRIER", ftcomm::Tag::kMonitoredBarrier)
      .value("SUBGROUP", ftcomm::Tag::kSubgroup)
      .value("REPLICA", ftcomm::Tag::kReplica)
      .value("RESHARD", ftcomm::Tag::kReshard)
      .value("SPARE_WAKE", ftcomm::Tag::kSpareWake);
  m.def("input_problem_text", [](ftcomm::InputProblem p) { return std::string(ftcomm::InputProblemText(p)); },
        py::arg("problem"), "What an input problem means, in words.");
  m.def("element_size", [](ftcomm::DType d) { return ftcomm::ElementSize(d); }, py::arg("dtype"),
        "Bytes per element of a dtype.");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ftcomm core: ULFM communicators and fault-aware collectives";
  if (import_mpi4py() < 0) throw py::error_already_set();

  m.def("ft_compiled_in", &ftcomm::FtCompiledIn, "True if built against an MPI with ULFM");
  m.def("ft_enabled", &ftcomm::FtEnabled,
        "True if this job runs with ULFM switched on (Open MPI: MPIX_FT; MPICH: MPIR_CVAR_ENABLE_FT)");
  m.def("ft_status", &ftcomm::FtStatus, "Why ft_enabled() says what it says, in words");
  m.def("skip_finalize_fence", &ftcomm::SkipFinalizeFence,
        "MPI_Finalize without its closing runtime fence (Open MPI with ULFM on); True if it will skip it");
  m.def("mpi_family", &ftcomm::MpiFamily, "'Open MPI', 'MPICH' or 'MPI': the library's family");
  m.def("mpi_library_version", &ftcomm::MpiLibraryVersion);
  RegisterEnums(m);
  m.def("configure",
        [](double fence_timeout_s, const std::string& run_dir, bool profile, bool late_rank_fence) {
          ftcomm::CoreSettings settings;
          settings.fence_timeout_s = fence_timeout_s;
          settings.run_dir = run_dir;
          settings.profile = profile;
          settings.late_rank_fence = late_rank_fence;
          ftcomm::Configure(settings);
        },
        py::arg("fence_timeout_s"), py::arg("run_dir"), py::arg("profile"), py::arg("late_rank_fence"),
        "Hands the core its settings (core/settings.h); called once by ftcomm.core.runtime.");
  m.def("set_late_rank_fence", &ftcomm::SetLateRankFence, py::arg("fence"),
        "Changes the late-rank policy (read by each wait when its deadline passes)");

  // The lock every MPI call of the core holds (core/mpi_serial.h), for the Python code that calls
  // mpi4py from a thread of its own. Taken without the GIL: its holder may be waiting for it. The
  // holder takes the GIL back while holding it, so no binding may wait for it holding the GIL:
  // every binding that reaches an MPI call releases the GIL first.
  m.def("mpi_call_lock", [] {
        py::gil_scoped_release release;
        ftcomm::MpiCallMutex().lock();
      },
      "Takes the process's MPI-call lock (recursive); pair with mpi_call_unlock in the same thread");
  m.def("mpi_call_unlock", [] { ftcomm::MpiCallMutex().unlock(); }, "Releases the MPI-call lock");

  py::class_<PyCommunicator>(m, "Communicator")
      .def_static("create", &Create, py::arg("mpi4py_comm"), py::arg("timeout"))
      .def_property_readonly("rank", [](const PyCommunicator& c) { return c.core->rank(); })
      .def_property_readonly("size", [](const PyCommunicator& c) { return c.core->size(); })
      .def_property_readonly("world_ranks",
                             [](const PyCommunicator& c) { return c.core->world_ranks(); })
      .def_property_readonly("ft_enabled",
                             [](const PyCommunicator& c) { return c.core->ft_enabled(); })
      .def_property_readonly("is_revoked",
                             [](const PyCommunicator& c) {
                               py::gil_scoped_release release;  // takes the MPI-call lock
                               return c.core->IsRevoked();
                             })
      .def_property("last_committed_step",
                    [](const PyCommunicator& c) { return c.core->last_committed_step(); },
                    [](PyCommunicator& c, int64_t s) { c.core->set_last_committed_step(s); })
      .def_property_readonly("has_recovered",
                             [](const PyCommunicator& c) { return c.core->has_recovered(); })
      .def("mpi_comm",
           [](PyCommunicator& c) {
             PyObject* obj = PyMPIComm_New(c.core->handle());
             if (obj == nullptr) throw py::error_already_set();
             return py::reinterpret_steal<py::object>(obj);
           })
      .def("revoke",
           [](PyCommunicator& c) {
             ftcomm::Status s;
             {
               py::gil_scoped_release release;  // takes the MPI-call lock
               s = c.core->Revoke();
             }
             ThrowIfError(s);
           })
      .def("failed_ranks",
           [](PyCommunicator& c) {
             std::vector<int> out;
             ftcomm::Status s;
             {
               py::gil_scoped_release release;  // takes the MPI-call lock
               s = c.core->FailedRanks(&out);
             }
             ThrowIfError(s);
             return out;
           })
      .def("barrier",
           [](PyCommunicator& c, double timeout) {
             Status s;
             {
               py::gil_scoped_release release;
               s = c.core->Barrier(timeout);
             }
             ThrowIfError(s);
           })
      .def("agree",
           [](PyCommunicator& c, int flag, double timeout) {
             Status s;
             bool saw_failure = false;
             {
               py::gil_scoped_release release;
               s = c.core->Agree(&flag, timeout, &saw_failure);
             }
             ThrowIfError(s);
             return std::make_tuple(flag, saw_failure);
           })
      .def("shrink",
           [](PyCommunicator& c, double timeout) {
             PyCommunicator out;
             std::vector<int> old_to_new;
             Status s;
             {
               py::gil_scoped_release release;
               s = c.core->Shrink(timeout, &out.core, &old_to_new);
             }
             ThrowIfError(s);
             return std::make_tuple(std::move(out), old_to_new);
           })
      .def("split",
           [](PyCommunicator& c, int color, int key, double timeout) {
             PyCommunicator out;
             Status s;
             {
               py::gil_scoped_release release;
               s = c.core->Split(color, key, timeout, &out.core);
             }
             ThrowIfError(s);
             return out.core ? py::cast(std::move(out)) : py::none();
           },
           py::arg("color"), py::arg("key"), py::arg("timeout"))
      .def("wait_signal",
           [](PyCommunicator& c, int tag, double timeout) {
             int value = 0, source = -1;
             Status s;
             {
               py::gil_scoped_release release;
               s = c.core->WaitSignal(tag, timeout, &value, &source);
             }
             ThrowIfError(s);
             return std::make_tuple(value, source);
           },
           py::arg("tag"), py::arg("timeout"))
      .def("signal",
           [](PyCommunicator& c, int peer, int tag, int value, double timeout) {
             if (peer < 0 || peer >= c.core->size()) throw py::value_error("signal: peer out of range");
             Status s;
             {
               py::gil_scoped_release release;
               s = c.core->Signal(peer, tag, value, timeout);
             }
             ThrowIfError(s);
           },
           py::arg("peer"), py::arg("tag"), py::arg("value"), py::arg("timeout"))
      .def("take_recovered",
           [](PyCommunicator& c) {
             PyCommunicator out;
             std::vector<int> old_to_new;
             out.core = c.core->TakeRecovered(&old_to_new);
             return std::make_tuple(std::move(out), old_to_new);
           })
      .def("allreduce",
           [](PyCommunicator& c, const std::vector<Triple>& buffers, int op, int64_t step,
              double timeout, size_t chunk_bytes, int problem, bool checksums, bool fingerprints, bool commit) {
             std::vector<ftcomm::RingBuffer> rings = ToRingBuffers(buffers);
             ftcomm::StepOptions opt =
                 StepOptionsFrom(op, step, timeout, chunk_bytes, problem, checksums, fingerprints);
             opt.commit = commit;
             ftcomm::StepResult result;
             Status s;
             {
               py::gil_scoped_release release;
               s = ftcomm::AllreduceStep(*c.core, rings, opt, &result);
             }
             ThrowIfError(s);
             return StepTuple(result);
           },
           py::arg("buffers"), py::arg("op"), py::arg("step"), py::arg("timeout"),
           py::arg("chunk_bytes"), py::arg("problem"), py::arg("checksums") = false,
           py::arg("fingerprints") = false, py::arg("commit") = true,
           "One allreduce step (committed unless commit is false); returns (replayed, validate_s, ring_s, agree_s).")
      .def("reduce_scatter",
           [](PyCommunicator& c, const Triple& input, const Triple& output, int op, int64_t step,
              double timeout, size_t chunk_bytes, int problem, bool checksums) {
             std::vector<ftcomm::RingBuffer> in = ToRingBuffers({input}), out = ToRingBuffers({output});
             ftcomm::StepOptions opt = StepOptionsFrom(op, step, timeout, chunk_bytes, problem, checksums);
             ftcomm::StepResult result;
             Status s;
             {
               py::gil_scoped_release release;
               s = ftcomm::ReduceScatterStep(*c.core, in[0], out[0], opt, &result);
             }
             ThrowIfError(s);
             return StepTuple(result);
           },
           py::arg("input"), py::arg("output"), py::arg("op"), py::arg("step"), py::arg("timeout"),
           py::arg("chunk_bytes"), py::arg("problem"), py::arg("checksums") = false,
           "One committed ring reduce-scatter step; returns (replayed, validate_s, ring_s, agree_s).");

  m.def("exchange",
        [](PyCommunicator& c, const std::vector<std::tuple<int, uintptr_t, size_t>>& sends,
           const std::vector<std::tuple<int, uintptr_t, size_t>>& recvs, int tag, double timeout) {
          auto convert = [](const std::vector<std::tuple<int, uintptr_t, size_t>>& in) {
            std::vector<ftcomm::Transfer> out;
            for (const auto& t : in) {
              ftcomm::Transfer x;
              x.peer = std::get<0>(t);
              x.data = reinterpret_cast<char*>(std::get<1>(t));
              x.bytes = std::get<2>(t);
              out.push_back(x);
            }
            return out;
          };
          std::vector<ftcomm::Transfer> s_in = convert(sends), r_in = convert(recvs);
          Status s;
          {
            py::gil_scoped_release release;
            s = ftcomm::Exchange(*c.core, s_in, r_in, tag, timeout);
          }
          ThrowIfError(s);
        },
        py::arg("comm"), py::arg("sends"), py::arg("recvs"), py::arg("tag"), py::arg("timeout"));

  m.def("minmax",
        [](PyCommunicator& c, const std::vector<int64_t>& values, double timeout, ftcomm::RoundKind kind,
           bool values_rejected) {
          std::vector<int64_t> mins, maxs;
          Status s;
          {
            py::gil_scoped_release release;
            s = ftcomm::MinMaxAcrossRanks(*c.core, kind, values, &mins, &maxs, timeout, values_rejected);
          }
          ThrowIfError(s);
          return std::make_tuple(mins, maxs);
        },
        py::arg("comm"), py::arg("values"), py::arg("timeout"), py::arg("kind") = ftcomm::RoundKind::kMinMax,
        py::arg("values_rejected") = false);

  m.def("fault_add",
        [](const std::string& point, int world_rank, int64_t step, int ring_step, int chunk,
           ftcomm::fault::Kind kind) {
          ftcomm::fault::Spec spec;
          spec.point = point;
          spec.world_rank = world_rank;
          spec.step = step;
          spec.ring_step = ring_step;
          spec.chunk = chunk;
          spec.kind = kind;
          ftcomm::fault::Add(spec);
        });
  m.def("fault_clear", &ftcomm::fault::Clear);
  m.def("fault_point",
        [](const std::string& point, int world_rank, int64_t step, int ring_step, int chunk) {
          ftcomm::fault::Point(point.c_str(), world_rank, step, ring_step, chunk);
        },
        py::arg("point"), py::arg("world_rank"), py::arg("step"), py::arg("ring_step") = -1,
        py::arg("chunk") = -1);
  m.def("fault_flip",
        [](const std::string& point, int world_rank, int64_t step, uintptr_t address, size_t nbytes) {
          return ftcomm::fault::Flip(point.c_str(), world_rank, step, -1, -1, reinterpret_cast<void*>(address), nbytes);
        },
        py::arg("point"), py::arg("world_rank"), py::arg("step"), py::arg("address"), py::arg("nbytes"),
        "Flips one bit of the nbytes at address if a bitflip spec matches (once); returns whether it did.");

  m.def("watchdog_arm",
        [](double seconds, const std::string& what, bool exit_clean) {
          return ftcomm::watchdog::Arm(seconds, what,
                                       exit_clean ? ftcomm::watchdog::Action::kExitClean
                                                  : ftcomm::watchdog::Action::kKillSelf);
        });
  m.def("watchdog_disarm", &ftcomm::watchdog::Disarm);
  // Hang detection and fencing (core/liveness.h).
  m.def("liveness_mark_exiting", &ftcomm::liveness::MarkExiting,
        "This rank is shutting down cleanly: peers must not fence it.");
  m.def("liveness_finished", &ftcomm::liveness::Finished, py::arg("world_rank"),
        "True when the rank is exiting, fenced, gone, or not tracked on this host");
  m.def("fence_silent", &ftcomm::liveness::FenceSilent, py::arg("world_ranks"), py::arg("max_silence_s"),
        "SIGKILLs the listed ranks on this host that are silent for longer than max_silence_s");
  m.def("liveness_describe", &ftcomm::liveness::Describe, py::arg("world_rank"),
        "One line naming a rank and what it is doing (for error messages).");
  m.def("fence_timeout", &ftcomm::liveness::FenceTimeout,
        "Seconds of silence after which a waiting peer fences a rank.");
  m.def("liveness_beat", &ftcomm::liveness::Beat,
        "Refreshes this rank's progress beat: it is polling inside its current call.");
  m.def("liveness_judge",
        [](const std::vector<int>& world_ranks) {
          ftcomm::liveness::Verdict verdict = ftcomm::liveness::Judge(world_ranks, ftcomm::LateRankFence());
          return std::make_tuple(verdict.fenced, verdict.why);
        },
        py::arg("world_ranks"),
        "After a deadline: judges the listed ranks on this host that kept this rank waiting "
        "(fences the stopped ones, and the late or hung ones under the late-rank policy \"fence\"); "
        "returns (fenced world ranks, why in words).");
  py::enum_<ftcomm::liveness::Activity>(m, "Activity")
      .value("ALLREDUCE", ftcomm::liveness::Activity::kAllreduce)
      .value("ALLGATHER", ftcomm::liveness::Activity::kAllgather);
  py::class_<PyActivityScope>(m, "ActivityScope",
                              "Publishes what this rank is doing (a call and its step) for the life of a with block.")
      .def(py::init<ftcomm::liveness::Activity, int64_t>(), py::arg("activity"), py::arg("step"))
      .def("__enter__", [](PyActivityScope& self) { self.Enter(); return &self; },
           py::return_value_policy::reference)
      .def("__exit__", [](PyActivityScope& self, py::args) { self.Exit(); return false; });

  RegisterCudaBindings(m);  // CUDA kernels and the staged device allreduce (or stubs)
}
