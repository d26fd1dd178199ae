#include "core/mpi_compat.h"

namespace ftcomm {

bool FtCompiledIn() { return FTCOMM_HAVE_ULFM != 0; }

bool FtEnabled() {
#if FTCOMM_HAVE_ULFM
  void* value = nullptr;
  int found = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPIX_FT, &value, &found) != MPI_SUCCESS) return false;
  // Open MPI stores the attribute as a pointer to a C int (0 or 1).
  return found && value != nullptr && *static_cast<int*>(value) != 0;
#else
  return false;
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

}  // namespace ftcomm
