#include "core/mpi_serial.h"

namespace ftcomm {

std::recursive_mutex& MpiCallMutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

}  // namespace ftcomm
