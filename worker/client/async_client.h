// A worker's pulls and pushes as the training loop uses them: the next
// step's parameters and the last steps' gradients travel while a batch
// computes, at most max_pushes pushes outstanding, each call's time and
// bytes reported to the worker's metrics. The calls themselves are the
// client's (ParameterClient's completions); this adds the bound, the first
// push failure that stops further pushes, and the bookkeeping.
//
// Thread safety: meant for one training thread; completions arrive on the
// thread driving the client's queue.
#ifndef SEGPS_WORKER_CLIENT_ASYNC_CLIENT_H_
#define SEGPS_WORKER_CLIENT_ASYNC_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sync.h"
#include "worker/client/completion.h"
#include "worker/client/ps_client.h"

namespace segps {

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
  // Waits for the calls still outstanding (a pull abandoned at the end of
  // training: the server answers it or its deadline ends it).
  ~AsyncClient();

  // Starts pulling the parameters for `clock` into `dest` (segment-sized,
  // untouched by the caller until done): the clock they reflect.
  Completion<PulledAt> StartPull(uint64_t clock, absl::Span<float> dest);
  // Starts a push after those started before it, first waiting while
  // max_pushes are outstanding. Fails at once once a push has failed.
  absl::Status StartPush(std::shared_ptr<const EncodedPush> push);
  // Once every call has ended (it waits for them): the pushes started that
  // not every server acknowledged (failed, or cut short), in clock order.
  // A recovery sends them again where a server lost them.
  std::vector<std::shared_ptr<const EncodedPush>> Unacknowledged();
  // Waits until every push started is acknowledged; the first failure.
  absl::Status DrainPushes();

  // Blocking: a pull, and a synchronous step's round (the push, after those
  // started, and the pull for its clock + 1 in the same messages).
  PulledAt Pull(uint64_t clock, absl::Span<float> dest);
  PulledAt PushAndPull(std::unique_ptr<EncodedPush> push, absl::Span<float> dest);

 private:
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !error_.ok() || pushes_ < max_pushes_; }
  // A call ended: `push` says which kind; `status` its result.
  void Ended(bool push, const absl::Status& status);

  ParameterClient* const client_;
  const int segment_;
  const uint32_t max_pushes_;
  CallObserver* const metrics_;
  const uint64_t pull_bytes_, push_bytes_;
  Mutex mu_;
  CondVar changed_;
  uint32_t pushes_ ABSL_GUARDED_BY(mu_) = 0;  // outstanding
  uint32_t calls_ ABSL_GUARDED_BY(mu_) = 0;   // outstanding, pulls included
  absl::Status error_ ABSL_GUARDED_BY(mu_);   // the first push failure
  // The pushes started and not yet acknowledged by every server, by clock.
  std::map<uint64_t, std::shared_ptr<const EncodedPush>> unacknowledged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_ASYNC_CLIENT_H_
