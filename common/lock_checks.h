// Process-wide lock checking for segps daemons.
#ifndef SEGPS_COMMON_LOCK_CHECKS_H_
#define SEGPS_COMMON_LOCK_CHECKS_H_

namespace segps {

// Debian builds Abseil without NDEBUG, which leaves absl::Mutex's deadlock
// detection on: every lock (gRPC's own included, as gRPC locks through
// absl::Mutex) records its order in a process-wide graph behind a global
// lock. That bookkeeping was ~3% of the CPU of a small push+pull round. The
// servers, workers and evaluator turn it off first thing in main; tests keep
// it on, so that a lock-order inversion still fails them.
void SkipMutexDeadlockDetection();

}  // namespace segps

#endif  // SEGPS_COMMON_LOCK_CHECKS_H_
