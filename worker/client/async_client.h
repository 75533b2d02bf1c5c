// A worker's pulls and pushes as calls that return completions, so that
// the next step's parameters and the last steps' gradients travel while a
// batch computes; blocking forms on top. Over a ParameterClient whose calls
// block, one lane per direction runs them in the order they were started:
// on a thread of its own, or on the caller's when the lane is idle and the
// caller waits anyway (a synchronous round then costs no thread hand-off).
//
// Thread safety: meant for one training thread; the lanes are its helpers.
#ifndef SEGPS_WORKER_CLIENT_ASYNC_CLIENT_H_
#define SEGPS_WORKER_CLIENT_ASYNC_CLIENT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sync.h"
#include "worker/client/ps_client.h"

namespace segps {

// The result of a call started without waiting for it. Copies share it.
template <typename T>
class Completion {
 public:
  Completion() : state_(std::make_shared<State>()) {}
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
  void Set(T value) const {
    MutexLock lock(&state_->mu);
    state_->value = std::move(value);
    state_->set.SignalAll();
  }

 private:
  struct State {
    Mutex mu;
    CondVar set;
    std::optional<T> value ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

// Runs calls one at a time, in the order they were posted.
class Lane {
 public:
  Lane();
  ~Lane();  // runs what is queued, then stops
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  void Post(absl::AnyInvocable<void() &&> call);
  // Runs `call` on the calling thread once every posted call has run.
  void RunHere(absl::FunctionRef<void()> call);

 private:
  void Loop();
  Mutex mu_;
  CondVar changed_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Where a client's calls report their time and bytes (the worker's metrics).
class CallObserver {
 public:
  virtual ~CallObserver() = default;
  virtual void ObservePull(double seconds, uint64_t bytes) = 0;
  virtual void ObservePush(double seconds, uint64_t bytes) = 0;
};

class AsyncClient {
 public:
  // `client` is registered for `segment` and outlives this. At most
  // `max_pushes` pushes are outstanding. `metrics` may be null; the byte
  // counts are what a pull and a push carry on the wire.
  AsyncClient(ParameterClient* client, int segment, uint32_t max_pushes, CallObserver* metrics,
              uint64_t pull_bytes, uint64_t push_bytes);

  // Starts pulling the parameters for `clock` into `dest` (segment-sized,
  // untouched by the caller until done): the clock they reflect.
  Completion<absl::StatusOr<uint64_t>> StartPull(uint64_t clock, absl::Span<float> dest);
  // Starts a push after those started before it, first waiting while
  // max_pushes are outstanding. Fails at once once a push has failed.
  absl::Status StartPush(std::unique_ptr<EncodedPush> push);
  // Waits until every push started is acknowledged; the first failure.
  absl::Status DrainPushes();

  // Blocking: a pull, and a synchronous step's round (the push, after those
  // started, and the pull for its clock + 1 in the same calls).
  absl::StatusOr<uint64_t> Pull(uint64_t clock, absl::Span<float> dest);
  absl::StatusOr<uint64_t> PushAndPull(std::unique_ptr<EncodedPush> push, absl::Span<float> dest);

 private:
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !error_.ok() || in_flight_ < max_pushes_; }
  void Acknowledge(const absl::Status& status);

  ParameterClient* const client_;
  const int segment_;
  const uint32_t max_pushes_;
  CallObserver* const metrics_;
  const uint64_t pull_bytes_, push_bytes_;
  Mutex mu_;
  CondVar changed_;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // Declared last: destroyed first, finishing their calls while the rest is alive.
  Lane pushes_, pulls_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_ASYNC_CLIENT_H_
