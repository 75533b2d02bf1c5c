// Mutex, condition variable and latch on the C++ standard library's
// primitives, with Abseil's thread-safety annotations.
//
// Why not absl::Mutex: Debian's Abseil is not built for ThreadSanitizer, so
// TSan cannot see its happens-before edges and reports races under correct
// locking. These wrappers sit on pthreads, which TSan intercepts, so the
// sanitizer checks segps for real, and clang's -Wthread-safety still checks
// every ABSL_GUARDED_BY.
#ifndef SEGPS_COMMON_SYNC_H_
#define SEGPS_COMMON_SYNC_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace segps {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Releases `mu` while waiting; it is held again on return. May wake spuriously.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, returning at `deadline` at the latest.
  void WaitWithDeadline(Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (deadline == absl::InfiniteFuture()) return Wait(mu);
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait_until(lock, absl::ToChronoTime(deadline));
    lock.release();
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// Counts down from n; Wait returns once it reaches zero.
class Latch {
 public:
  explicit Latch(int count) : count_(count) {}
  // Waits for the last CountDown to let go of the mutex, so that a waiter
  // may destroy the latch as soon as Wait returns.
  ~Latch() { MutexLock lock(&mu_); }
  void CountDown() {
    MutexLock lock(&mu_);
    if (--count_ == 0) zero_.SignalAll();
  }
  void Wait() {
    MutexLock lock(&mu_);
    while (count_ > 0) zero_.Wait(&mu_);
  }

 private:
  Mutex mu_;
  CondVar zero_;
  int count_ ABSL_GUARDED_BY(mu_);
};

}  // namespace segps

#endif  // SEGPS_COMMON_SYNC_H_
