// The gRPC completion queue of a client and the thread that drives it:
// every tag on the queue is a Handler, run when its operation (a stream's
// message, an alarm) completes. Handlers do not block: they start the next
// operation and return, so no lock is held across a call and no thread
// sleeps in a retry (a retry waits on an alarm).
//
// The loop's thread polls while calls that nobody waits for are in flight
// (Hold, Release: a prefetched pull, a push in the background). A caller
// that waits for its own call with nothing else in flight drives the queue
// itself (Drive), as a synchronous round did before: its replies reach it
// without a hand-off between threads, which on a busy 2-core machine cost
// a synchronous 4 MB round a tenth of its speed. With calls in the
// background, the loop's thread handles every event and wakes the caller.
//
// Thread safety: operations may be started, and the queue driven, from any
// thread. The owners of handlers make sure that none is outstanding before
// the loop is destroyed.
#ifndef SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_
#define SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "common/sanitizers.h"
#include "common/sync.h"

#if defined(SEGPS_TSAN)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace segps {

class CompletionLoop {
 public:
  // A tag on the queue.
  class Handler {
   public:
    virtual void OnComplete(bool ok) = 0;

   protected:
    ~Handler() = default;
  };

  CompletionLoop();
  ~CompletionLoop();  // shuts the queue down and joins the thread
  CompletionLoop(const CompletionLoop&) = delete;
  CompletionLoop& operator=(const CompletionLoop&) = delete;

  grpc::CompletionQueue* queue() { return &cq_; }
  // While held (a count), the loop's thread polls the queue.
  void Hold();
  void Release();
  // Handles completions on the calling thread until `done` holds.
  void Drive(absl::FunctionRef<bool()> done);

  // `handler` as the tag of an operation started on the queue now, from any
  // thread. ThreadSanitizer cannot see the synchronisation inside Debian's
  // uninstrumented gRPC, so the hand-off to the loop's thread is announced
  // to it: a release here, an acquire when the tag comes off the queue.
  static void* Tag(Handler* handler) {
#if defined(SEGPS_TSAN)
    __tsan_release(handler);
#endif
    return handler;
  }

 private:
  void Loop();
  static void Dispatch(void* tag, bool ok);

  Mutex mu_;
  CondVar changed_;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::CompletionQueue cq_;
  std::thread thread_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_
