// One thread that drives a gRPC completion queue for a client: every tag
// on the queue is a Handler, run on that thread when its operation
// completes. Work from other threads enters through Post, as an alarm that
// fires at once. Handlers do not block: they start the next operation and
// return, so no lock is held across a call and no thread sleeps in a retry.
//
// Thread safety: Post from any thread. The owners of handlers make sure
// that none is outstanding before the loop is destroyed.
#ifndef SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_
#define SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "common/sync.h"

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
  // Runs `work` on the loop's thread, soon, after the work posted before it.
  void Post(absl::AnyInvocable<void() &&> work);
  // Runs the work posted so far, oldest first (on the loop's thread).
  void RunPosted();
  bool InLoop() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> posted_ ABSL_GUARDED_BY(mu_);
  grpc::CompletionQueue cq_;
  std::thread thread_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_COMPLETION_LOOP_H_
