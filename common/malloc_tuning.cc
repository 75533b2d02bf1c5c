#include "common/malloc_tuning.h"

// Any C library header defines __GLIBC__; without one the test below is
// always false and the tuning silently compiles to nothing.
#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace segps {

void TuneMallocForLargeBuffers() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

}  // namespace segps
