// The result of a call started without waiting for it: a worker's pulls and
// pushes return one at once and complete on the thread driving the client's
// completion queue while the caller computes. Copies share the result.
//
// Thread safety: any thread may wait, poll or add a callback; the result is
// set once.
#ifndef SEGPS_WORKER_CLIENT_COMPLETION_H_
#define SEGPS_WORKER_CLIENT_COMPLETION_H_

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "common/sync.h"

namespace segps {

template <typename T>
class Completion {
 public:
  Completion() : state_(std::make_shared<State>()) {}
  // One that is already complete.
  static Completion Done(T value) {
    Completion c;
    c.Set(std::move(value));
    return c;
  }

  bool done() const {
    MutexLock lock(&state_->mu);
    return state_->value.has_value();
  }
  // Waits until the call completes; its result.
  T Wait() const {
    MutexLock lock(&state_->mu);
    while (!state_->value.has_value()) state_->set.Wait(&state_->mu);
    return *state_->value;
  }
  // Runs `then` with the result once there is one: on the thread that sets
  // it, or at once on this one if it is set already. It must not block.
  void OnDone(absl::AnyInvocable<void(const T&) &&> then) const {
    {
      MutexLock lock(&state_->mu);
      if (!state_->value.has_value()) {
        state_->then.push_back(std::move(then));
        return;
      }
    }
    std::move(then)(*state_->value);  // set once, never changed after
  }
  void Set(T value) const {
    std::vector<absl::AnyInvocable<void(const T&) &&>> then;
    {
      MutexLock lock(&state_->mu);
      state_->value = std::move(value);
      then.swap(state_->then);
      state_->set.SignalAll();
    }
    for (auto& f : then) std::move(f)(*state_->value);
  }

 private:
  struct State {
    Mutex mu;
    CondVar set;
    std::optional<T> value;  // guarded by mu until set, read-only after
    std::vector<absl::AnyInvocable<void(const T&) &&>> then ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_COMPLETION_H_
