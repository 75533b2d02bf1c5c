// The threads a server does heavy request work on: a push of a large
// gradient (decoding and applying it) or a pull of a large range (encoding
// its values) is handed here by the gRPC service, so that gRPC's own
// threads keep reading the sockets meanwhile (the next chunk's bytes arrive
// while this one applies). Small requests are served where they arrive: a
// hand-off would cost more than they take.
//
// Thread safety: Post may be called from any thread.
#ifndef SEGPS_SERVER_HANDLER_POOL_H_
#define SEGPS_SERVER_HANDLER_POOL_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "common/sync.h"

namespace segps {

class HandlerPool {
 public:
  explicit HandlerPool(int threads);  // at least 1
  ~HandlerPool();                     // runs what is queued, then stops
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Runs `task` on one of the pool's threads, in the order posted.
  void Post(absl::AnyInvocable<void() &&> task);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();
  Mutex mu_;
  CondVar changed_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_HANDLER_POOL_H_
