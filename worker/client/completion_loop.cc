#include "worker/client/completion_loop.h"

#include <chrono>
#include <utility>

namespace segps {
namespace {

// A wake-up for posted work: an alarm due now, deleted once it has fired.
// Alarms due at once may fire in any order, so the work itself waits in a
// queue that the first wake-up drains, oldest first.
class Wakeup final : public CompletionLoop::Handler {
 public:
  explicit Wakeup(CompletionLoop* loop) : loop_(loop) {}
  void Start(grpc::CompletionQueue* cq) { alarm_.Set(cq, std::chrono::system_clock::now(), this); }
  void OnComplete(bool) override {
    loop_->RunPosted();
    delete this;
  }

 private:
  CompletionLoop* const loop_;
  grpc::Alarm alarm_;
};

}  // namespace

CompletionLoop::CompletionLoop()
    : thread_([this] {
        void* tag = nullptr;
        bool ok = false;
        while (cq_.Next(&tag, &ok)) static_cast<Handler*>(tag)->OnComplete(ok);
      }) {}

CompletionLoop::~CompletionLoop() {
  cq_.Shutdown();
  thread_.join();
}

void CompletionLoop::Post(absl::AnyInvocable<void() &&> work) {
  {
    MutexLock lock(&mu_);
    posted_.push_back(std::move(work));
  }
  (new Wakeup(this))->Start(&cq_);
}

void CompletionLoop::RunPosted() {
  std::deque<absl::AnyInvocable<void() &&>> work;
  {
    MutexLock lock(&mu_);
    work.swap(posted_);
  }
  for (auto& w : work) std::move(w)();
}

}  // namespace segps
