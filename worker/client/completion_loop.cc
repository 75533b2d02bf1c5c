#include "worker/client/completion_loop.h"

namespace segps {

CompletionLoop::CompletionLoop()
    : thread_([this] {
        void* tag = nullptr;
        bool ok = false;
        while (cq_.Next(&tag, &ok)) {
#if defined(__SANITIZE_THREAD__)
          __tsan_acquire(tag);  // see Tag
#endif
          static_cast<Handler*>(tag)->OnComplete(ok);
        }
      }) {}

CompletionLoop::~CompletionLoop() {
  cq_.Shutdown();
  thread_.join();
}

}  // namespace segps
