#ifndef SEGPS_COMMON_VECTOR_CLONES_H_
#define SEGPS_COMMON_VECTOR_CLONES_H_

#include "common/sanitizers.h"

// On a hot loop over floats (an update kernel, a push's scan): also
// compiled for AVX2 and picked at run time, so one binary runs everywhere
// and uses 8-wide operations where the CPU has them (the apply bench
// compiles its memory-bound loops the same way). Not under ThreadSanitizer:
// the loader runs the clones' resolver before the sanitizer's runtime is up.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(SEGPS_TSAN)
#define SEGPS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SEGPS_VECTOR_CLONES
#endif

#endif  // SEGPS_COMMON_VECTOR_CLONES_H_
