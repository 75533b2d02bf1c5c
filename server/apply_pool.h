// Threads that one optimizer update is split over. A push is applied under
// its shard's lock while the pushing worker waits for the reply, so on a
// server with idle cores the update's memory traffic is the round's critical
// path: parts of it on several cores finish sooner (more bandwidth than one
// core draws).
//
// Thread safety: Run may be called from any thread. One update uses the
// threads at a time; a call that finds them busy runs all its parts itself
// rather than wait.
#ifndef SEGPS_SERVER_APPLY_POOL_H_
#define SEGPS_SERVER_APPLY_POOL_H_

#include <cstddef>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "common/sync.h"

namespace segps {

class ApplyPool {
 public:
  // `threads` (at least 1) includes the caller's: threads - 1 are started.
  explicit ApplyPool(int threads);
  ~ApplyPool();
  ApplyPool(const ApplyPool&) = delete;
  ApplyPool& operator=(const ApplyPool&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Calls fn(part) for every part in [0, parts), on the caller's thread and
  // the pool's, and returns once all calls have returned.
  void Run(size_t parts, absl::FunctionRef<void(size_t part)> fn);

 private:
  void Help();
  // Runs parts of the current job until none is left.
  void Work() ABSL_LOCKS_EXCLUDED(mu_);

  Mutex run_mu_;  // held by the caller whose job the helpers work on
  Mutex mu_;
  CondVar changed_;
  const absl::FunctionRef<void(size_t)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t parts_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_part_ ABSL_GUARDED_BY(mu_) = 0;
  size_t unfinished_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_APPLY_POOL_H_
