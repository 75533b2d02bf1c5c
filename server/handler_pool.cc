#include "server/handler_pool.h"

#include <algorithm>

namespace segps {

HandlerPool::HandlerPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

HandlerPool::~HandlerPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    changed_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

void HandlerPool::Post(absl::AnyInvocable<void() &&> task) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  changed_.SignalAll();
}

void HandlerPool::Loop() {
  while (true) {
    absl::AnyInvocable<void() &&> task;
    {
      MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) changed_.Wait(&mu_);
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace segps
