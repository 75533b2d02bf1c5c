// Time as the servers and a worker's recovery see it, injectable: leases,
// deadlines, waits and backoffs read a Clock, so that tests step time by
// hand instead of sleeping.
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
  // Waits for `d` as this clock counts time.
  virtual void SleepFor(absl::Duration d) = 0;
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
  // A sleep on a fake clock moves it on at once: a backoff costs no real time.
  void SleepFor(absl::Duration d) override { Advance(d); }

 private:
  Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

inline Clock* Clock::Real() {
  class RealClock final : public Clock {
   public:
    absl::Time Now() override { return absl::Now(); }
    void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
  };
  static RealClock* const clock = new RealClock;
  return clock;
}

}  // namespace segps

#endif  // SEGPS_COMMON_CLOCK_H_
