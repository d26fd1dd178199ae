// The one place that knows whether this MPI has ULFM (Open MPI's mpi-ext.h with FTMPI). Everything
// else asks FtCompiledIn() / FtEnabled() instead of testing macros.
#pragma once

#include <mpi.h>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
#define FTCOMM_HAVE_ULFM 1
#else
#define FTCOMM_HAVE_ULFM 0
#endif

#include <string>

namespace ftcomm {

// True when the MPI library we were compiled against declares the ULFM extension.
bool FtCompiledIn();
// True when fault tolerance is switched on for this job: the MPIX_FT attribute of
// MPI_COMM_WORLD (set by `mpirun --with-ft ulfm`), not a call that happened to succeed.
bool FtEnabled();
// MPI_Get_library_version of the library this extension is linked to.
std::string MpiLibraryVersion();
// The text MPI gives for an error code.
std::string MpiErrorString(int code);
int MpiErrorClass(int code);

}  // namespace ftcomm
