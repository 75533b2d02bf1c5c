#include "common/lock_checks.h"

#include "absl/synchronization/mutex.h"

namespace segps {

void SkipMutexDeadlockDetection() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace segps
