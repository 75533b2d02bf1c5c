#ifndef SEGPS_COMMON_SANITIZERS_H_
#define SEGPS_COMMON_SANITIZERS_H_

// Which sanitizer instruments this translation unit, alike under GCC (which
// defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__) and clang (which
// answers __has_feature): SEGPS_ASAN and SEGPS_TSAN are defined, or not.

#if defined(__SANITIZE_ADDRESS__)
#define SEGPS_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define SEGPS_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(SEGPS_ASAN)
#define SEGPS_ASAN 1
#endif
#if __has_feature(thread_sanitizer) && !defined(SEGPS_TSAN)
#define SEGPS_TSAN 1
#endif
#endif

#endif  // SEGPS_COMMON_SANITIZERS_H_
