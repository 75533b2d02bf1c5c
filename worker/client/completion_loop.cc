#include "worker/client/completion_loop.h"

#include <chrono>

namespace segps {
namespace {

// How long a poll waits before the poller looks again at whether it
// should go on: the loop's thread, whether it is still held; a caller
// alone on the queue, whether its call is done (its reply comes to it, so
// a longer wait costs nothing but a few wake-ups a second while its call
// waits on the bound).
constexpr std::chrono::milliseconds kLoopPoll(20), kCallerPoll(10);

}  // namespace

CompletionLoop::CompletionLoop() : thread_([this] { Loop(); }) {}

CompletionLoop::~CompletionLoop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  cq_.Shutdown();
  thread_.join();
}

void CompletionLoop::Dispatch(void* tag, bool ok) {
#if defined(SEGPS_TSAN)
  __tsan_acquire(tag);  // see Tag
#endif
  static_cast<Handler*>(tag)->OnComplete(ok);
}

void CompletionLoop::Loop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      while (holds_ == 0 && !stopping_) changed_.Wait(&mu_);
      if (stopping_) break;
    }
    void* tag = nullptr;
    bool ok = false;
    const auto status = cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + kLoopPoll);
    if (status == grpc::CompletionQueue::SHUTDOWN) return;
    if (status == grpc::CompletionQueue::GOT_EVENT) {
      Dispatch(tag, ok);
      MutexLock lock(&mu_);
      changed_.SignalAll();  // a caller waiting in Drive looks at its call
    }
  }
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) Dispatch(tag, ok);
}

void CompletionLoop::Hold() {
  MutexLock lock(&mu_);
  if (holds_++ == 0) changed_.SignalAll();
}

void CompletionLoop::Release() {
  MutexLock lock(&mu_);
  if (--holds_ == 0) changed_.SignalAll();  // a caller waiting in Drive drives again
}

void CompletionLoop::Drive(absl::FunctionRef<bool()> done) {
  while (true) {
    {
      // While the loop's thread polls (held), it takes any of the queue's
      // events, the caller's reply among them, and wakes the caller after
      // each: the caller waits for that rather than polling beside it,
      // which left a reply the loop took unseen until the caller's next poll.
      MutexLock lock(&mu_);
      while (holds_ > 0 && !stopping_ && !done()) changed_.Wait(&mu_);
      if (done()) return;
    }
    void* tag = nullptr;
    bool ok = false;
    const auto status = cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + kCallerPoll);
    if (status == grpc::CompletionQueue::SHUTDOWN) return;
    if (status == grpc::CompletionQueue::GOT_EVENT) Dispatch(tag, ok);
  }
}

}  // namespace segps
