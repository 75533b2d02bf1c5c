// One thread that drives a gRPC completion queue for a client: every tag
// on the queue is a Handler, run on that thread when its operation (a
// stream's message, an alarm) completes. Handlers do not block: they start
// the next operation and return, so no lock is held across a call and no
// thread sleeps in a retry (a retry waits on an alarm).
//
// Thread safety: operations may be started on the queue from any thread.
// The owners of handlers make sure that none is outstanding before the
// loop is destroyed.
#ifndef SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_
#define SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_

#include <grpcpp/grpcpp.h>

#include <thread>

#if defined(__SANITIZE_THREAD__)
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
  // `handler` as the tag of an operation started on the queue now, from any
  // thread. ThreadSanitizer cannot see the synchronisation inside Debian's
  // uninstrumented gRPC, so the hand-off to the loop's thread is announced
  // to it: a release here, an acquire when the tag comes off the queue.
  static void* Tag(Handler* handler) {
#if defined(__SANITIZE_THREAD__)
    __tsan_release(handler);
#endif
    return handler;
  }

 private:
  grpc::CompletionQueue cq_;
  std::thread thread_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_
