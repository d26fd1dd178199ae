// The one place that knows which MPI this is and how it spells ULFM. Everything else calls the
// functions below (namespace ulfm) and asks FtEnabled() instead of testing macros.
//
// Open MPI 5: <mpi-ext.h> with OMPI_HAVE_MPI_EXT_FTMPI declares MPIX_Comm_revoke, _is_revoked,
// _shrink, _agree, _iagree, _ack_failed, _get_failed, the error classes MPI_ERR_PROC_FAILED,
// MPI_ERR_PROC_FAILED_PENDING, MPI_ERR_REVOKED and the MPIX_FT attribute of MPI_COMM_WORLD.
// MPICH (3.x to 5.0): <mpi.h> declares MPIX_Comm_revoke, _shrink, _agree, _failure_ack,
// _failure_get_acked and the classes MPIX_ERR_PROC_FAILED, MPIX_ERR_PROC_FAILED_PENDING,
// MPIX_ERR_REVOKED; it has no is_revoked, no iagree and no FT attribute. Fault tolerance is a
// run-time setting (MPIR_CVAR_ENABLE_FT) that only MPICH's old ch3 device accepts: its ch4 device,
// the one of every current release, asserts in MPI_Init with it on.
#pragma once

#include <mpi.h>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
#define FTCOMM_ULFM_OPENMPI 1
#else
#define FTCOMM_ULFM_OPENMPI 0
#endif

#if !FTCOMM_ULFM_OPENMPI && defined(MPICH) && defined(MPIX_ERR_REVOKED)
#define FTCOMM_ULFM_MPICH 1
#else
#define FTCOMM_ULFM_MPICH 0
#endif

#define FTCOMM_HAVE_ULFM (FTCOMM_ULFM_OPENMPI || FTCOMM_ULFM_MPICH)

#include <string>

namespace ftcomm {

// True when the MPI library we were compiled against declares the ULFM functions.
bool FtCompiledIn();
// True when fault tolerance is switched on for this job. Open MPI: the MPIX_FT attribute of
// MPI_COMM_WORLD (set by `mpirun --with-ft ulfm`). MPICH: the control variable
// MPIR_CVAR_ENABLE_FT, read through MPI_T. Not a call that happened to succeed. Found once, the
// first time it is asked after MPI_Init.
bool FtEnabled();
// Why FtEnabled() says what it says, in words: which MPI, and what recovery would need.
std::string FtStatus();
// "Open MPI", "MPICH" or "MPI" (another library): the family of the library we are linked to.
std::string MpiFamily();
// 1: this MPI library passes device pointers (CUDA-aware; Open MPI's MPIX_Query_cuda_support),
// 0: it does not, -1: it cannot say.
int CudaAwareMpi();
// Lets MPI_Finalize skip its closing runtime fence, where the MPI can: Open MPI with ULFM on (its
// ompi_async_mpi_finalize flag). Open MPI 5.0.x's ULFM finalize first agrees on the survivors
// (a shrink of MPI_COMM_WORLD), which already waits for every live rank; the PMIx fence after it
// adds nothing, and after a rank failure it never completed in about one job in 25 here (every
// survivor spinning in ompi_mpi_finalize). Returns whether the fence will be skipped. Call it on
// every rank or on none: a rank that skips it is missing from the others' fence.
bool SkipFinalizeFence();
// MPI_Get_library_version of the library this extension is linked to.
std::string MpiLibraryVersion();
// The text MPI gives for an error code.
std::string MpiErrorString(int code);
int MpiErrorClass(int code);

// ULFM under one spelling. Each returns an MPI return code; without ULFM compiled in, each
// returns MPI_ERR_UNSUPPORTED_OPERATION (callers check FtEnabled() first).
namespace ulfm {

// Error classes; without ULFM, values no MPI error class takes.
int ErrProcFailed();
int ErrProcFailedPending();
int ErrRevoked();

int Revoke(MPI_Comm comm);
// `*supported` is false where this MPI cannot tell (MPICH): the caller keeps its own record.
int IsRevoked(MPI_Comm comm, int* flag, bool* supported);
int Shrink(MPI_Comm comm, MPI_Comm* out);
// Acknowledges every failure this rank knows of in `comm` (`size` ranks), so that later
// agreements and any-source receives do not raise for them.
int AckFailed(MPI_Comm comm, int size);
// The group of failed processes of `comm` this rank has acknowledged or knows of.
int GetFailed(MPI_Comm comm, MPI_Group* out);
// Whether this MPI has a non-blocking agreement (Open MPI's MPIX_Comm_iagree; MPICH has none).
bool HasIagree();
int Iagree(MPI_Comm comm, int* flag, MPI_Request* request);
int Agree(MPI_Comm comm, int* flag);

}  // namespace ulfm
}  // namespace ftcomm
