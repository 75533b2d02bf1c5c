// Time as the servers see it, injectable: leases, deadlines and waits read
// a Clock, so that tests step time by hand instead of sleeping.
#ifndef SEGPS_COMMON_CLOCK_H_
#define SEGPS_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace segps {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // The wall clock (absl::Now), shared by every caller.
  static Clock* Real();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 50)) : now_(start) {}
  absl::Time Now() override {
    MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

inline Clock* Clock::Real() {
  class RealClock final : public Clock {
   public:
    absl::Time Now() override { return absl::Now(); }
  };
  static RealClock* const clock = new RealClock;
  return clock;
}

}  // namespace segps

#endif  // SEGPS_COMMON_CLOCK_H_
