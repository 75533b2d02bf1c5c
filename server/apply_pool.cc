#include "server/apply_pool.h"

#include <algorithm>

namespace segps {

ApplyPool::ApplyPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) helpers_.emplace_back([this] { Help(); });
}

ApplyPool::~ApplyPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    changed_.SignalAll();
  }
  for (std::thread& t : helpers_) t.join();
}

void ApplyPool::Run(size_t parts, absl::FunctionRef<void(size_t)> fn) {
  if (parts <= 1 || helpers_.empty() || !run_mu_.TryLock()) {
    for (size_t part = 0; part < parts; ++part) fn(part);
    return;
  }
  {
    MutexLock lock(&mu_);
    job_ = &fn;
    parts_ = parts;
    next_part_ = 0;
    unfinished_ = parts;
    changed_.SignalAll();
  }
  Work();
  {
    MutexLock lock(&mu_);
    while (unfinished_ > 0) changed_.Wait(&mu_);
    job_ = nullptr;
  }
  run_mu_.Unlock();
}

void ApplyPool::Help() {
  while (true) {
    {
      MutexLock lock(&mu_);
      while (!stop_ && (job_ == nullptr || next_part_ == parts_)) changed_.Wait(&mu_);
      if (stop_) return;
    }
    Work();
  }
}

void ApplyPool::Work() {
  while (true) {
    const absl::FunctionRef<void(size_t)>* job;
    size_t part;
    {
      MutexLock lock(&mu_);
      if (job_ == nullptr || next_part_ == parts_) return;
      job = job_;
      part = next_part_++;
    }
    (*job)(part);
    MutexLock lock(&mu_);
    if (--unfinished_ == 0) changed_.SignalAll();
  }
}

}  // namespace segps
