#include "core/mpi_compat.h"

#include <mutex>

namespace ftcomm {
namespace {

// The value of the line "NAME: value" in MPI_Get_library_version's text (MPICH writes one
// property per line), or "" when there is none.
std::string LibraryProperty(const std::string& text, const std::string& name) {
  size_t at = text.find(name + ":");
  if (at == std::string::npos) return "";
  at += name.size() + 1;
  size_t end = text.find('\n', at);
  std::string value = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
  const size_t first = value.find_first_not_of(" \t");
  const size_t last = value.find_last_not_of(" \t\r");
  return first == std::string::npos ? "" : value.substr(first, last - first + 1);
}

// "Open MPI v5.0.8", "MPICH 5.0.2 (device ch4:ucx ofi)": the library in a few words.
std::string LibraryName() {
  const std::string text = MpiLibraryVersion();
  if (MpiFamily() == "MPICH") {
    std::string name = "MPICH " + LibraryProperty(text, "MPICH Version");
    const std::string device = LibraryProperty(text, "MPICH Device");
    return device.empty() ? name : name + " (device " + device + ")";
  }
  std::string first = text.substr(0, text.find_first_of(",\n"));
  return first.empty() ? MpiFamily() : first;
}

#if FTCOMM_ULFM_MPICH
// MPICH's switch for fault tolerance, MPIR_CVAR_ENABLE_FT, read through the MPI tool interface.
bool MpichFtCvar() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return false;
  int value = 0, index = 0, count = 0;
  MPI_T_cvar_handle handle;
  if (MPI_T_cvar_get_index("MPIR_CVAR_ENABLE_FT", &index) == MPI_SUCCESS &&
      MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
    if (count != 1 || MPI_T_cvar_read(handle, &value) != MPI_SUCCESS) value = 0;
    MPI_T_cvar_handle_free(&handle);
  }
  MPI_T_finalize();
  return value != 0;
}
#endif

bool ProbeFt() {
#if FTCOMM_ULFM_OPENMPI
  void* value = nullptr;
  int found = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPIX_FT, &value, &found) != MPI_SUCCESS) return false;
  // Open MPI stores the attribute as a pointer to a C int (0 or 1).
  return found && value != nullptr && *static_cast<int*>(value) != 0;
#elif FTCOMM_ULFM_MPICH
  return MpichFtCvar();
#else
  return false;
#endif
}

}  // namespace

bool FtCompiledIn() { return FTCOMM_HAVE_ULFM != 0; }

bool FtEnabled() {
  static std::once_flag once;
  static bool enabled = false;
  std::call_once(once, [] { enabled = ProbeFt(); });
  return enabled;
}

std::string MpiFamily() {
#if defined(OPEN_MPI)
  return "Open MPI";
#elif defined(MPICH)
  return "MPICH";
#else
  return "MPI";
#endif
}

#if FTCOMM_ULFM_OPENMPI
// Open MPI's own switch (ompi/runtime/params.h), exported by libmpi; the MCA parameter
// async_mpi_finalize sets it too, but only where the launcher passes it: set here, it holds
// however the job was started.
extern "C" bool ompi_async_mpi_finalize;
#endif

bool SkipFinalizeFence() {
#if FTCOMM_ULFM_OPENMPI
  if (!FtEnabled()) return false;
  ompi_async_mpi_finalize = true;
  return true;
#else
  return false;
#endif
}

std::string FtStatus() {
  const std::string library = LibraryName();
  const std::string need = "recovery needs an MPI with ULFM: Open MPI 5 (the default install), "
                           "launched by ftcomm-run";
  if (!FtCompiledIn()) {
    return library + ": ftcomm was built against an MPI without the ULFM extension; failure-free "
           "runs work, a rank failure ends the job; " + need;
  }
  const bool enabled = FtEnabled();
#if FTCOMM_ULFM_OPENMPI
  if (enabled) return library + " runs with ULFM on (MPIX_FT)";
  return library + " runs without ULFM: launch with `ftcomm-run -n N ...` (mpirun --with-ft ulfm); "
         "failure-free runs work, a rank failure ends the job";
#else  // MPICH
  const std::string device = LibraryProperty(MpiLibraryVersion(), "MPICH Device");
  if (enabled) {
    return library + " runs with MPIR_CVAR_ENABLE_FT=1; ftcomm's recovery on MPICH has never run "
           "(no MPICH that survives a process failure was available to test it)";
  }
  if (device.rfind("ch4", 0) == 0 || device.empty()) {
    return library + " has no fault tolerance: its ch4 device cannot run with MPIR_CVAR_ENABLE_FT "
           "(MPI_Init asserts); failure-free runs work, a rank failure ends the job; " + need;
  }
  return library + " runs without fault tolerance (MPIR_CVAR_ENABLE_FT is off); failure-free runs "
         "work, a rank failure ends the job; " + need;
#endif
}

int CudaAwareMpi() {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() ? 1 : 0;
#else
  return -1;
#endif
}

std::string MpiLibraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  return std::string(text, static_cast<size_t>(len));
}

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

int MpiErrorClass(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls;
}

namespace ulfm {

#if FTCOMM_ULFM_OPENMPI
int ErrProcFailed() { return MPI_ERR_PROC_FAILED; }
int ErrProcFailedPending() { return MPI_ERR_PROC_FAILED_PENDING; }
int ErrRevoked() { return MPI_ERR_REVOKED; }
int Revoke(MPI_Comm comm) { return MPIX_Comm_revoke(comm); }
int IsRevoked(MPI_Comm comm, int* flag, bool* supported) {
  *supported = true;
  return MPIX_Comm_is_revoked(comm, flag);
}
int Shrink(MPI_Comm comm, MPI_Comm* out) { return MPIX_Comm_shrink(comm, out); }
int AckFailed(MPI_Comm comm, int size) {
  int acked = 0;
  return MPIX_Comm_ack_failed(comm, size, &acked);
}
int GetFailed(MPI_Comm comm, MPI_Group* out) { return MPIX_Comm_get_failed(comm, out); }
bool HasIagree() { return true; }
int Iagree(MPI_Comm comm, int* flag, MPI_Request* request) { return MPIX_Comm_iagree(comm, flag, request); }
int Agree(MPI_Comm comm, int* flag) { return MPIX_Comm_agree(comm, flag); }
#elif FTCOMM_ULFM_MPICH
int ErrProcFailed() { return MPIX_ERR_PROC_FAILED; }
int ErrProcFailedPending() { return MPIX_ERR_PROC_FAILED_PENDING; }
int ErrRevoked() { return MPIX_ERR_REVOKED; }
int Revoke(MPI_Comm comm) { return MPIX_Comm_revoke(comm); }
int IsRevoked(MPI_Comm, int* flag, bool* supported) {
  *flag = 0;
  *supported = false;
  return MPI_SUCCESS;
}
int Shrink(MPI_Comm comm, MPI_Comm* out) { return MPIX_Comm_shrink(comm, out); }
int AckFailed(MPI_Comm comm, int) { return MPIX_Comm_failure_ack(comm); }
int GetFailed(MPI_Comm comm, MPI_Group* out) { return MPIX_Comm_failure_get_acked(comm, out); }
bool HasIagree() { return false; }
int Iagree(MPI_Comm, int*, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return MPI_ERR_UNSUPPORTED_OPERATION;
}
int Agree(MPI_Comm comm, int* flag) { return MPIX_Comm_agree(comm, flag); }
#else
// Without ULFM: error classes above every real one, so that no comparison matches.
constexpr int kNoClass = 1 << 30;
int ErrProcFailed() { return kNoClass; }
int ErrProcFailedPending() { return kNoClass + 1; }
int ErrRevoked() { return kNoClass + 2; }
int Revoke(MPI_Comm) { return MPI_ERR_UNSUPPORTED_OPERATION; }
int IsRevoked(MPI_Comm, int* flag, bool* supported) {
  *flag = 0;
  *supported = false;
  return MPI_ERR_UNSUPPORTED_OPERATION;
}
int Shrink(MPI_Comm, MPI_Comm* out) {
  *out = MPI_COMM_NULL;
  return MPI_ERR_UNSUPPORTED_OPERATION;
}
int AckFailed(MPI_Comm, int) { return MPI_ERR_UNSUPPORTED_OPERATION; }
int GetFailed(MPI_Comm, MPI_Group* out) {
  *out = MPI_GROUP_EMPTY;
  return MPI_ERR_UNSUPPORTED_OPERATION;
}
bool HasIagree() { return false; }
int Iagree(MPI_Comm, int*, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  return MPI_ERR_UNSUPPORTED_OPERATION;
}
int Agree(MPI_Comm, int*) { return MPI_ERR_UNSUPPORTED_OPERATION; }
#endif

}  // namespace ulfm
}  // namespace ftcomm
