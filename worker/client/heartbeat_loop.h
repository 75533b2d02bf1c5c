// Renews a worker's leases on every server from a thread of its own, every
// `period`, while the worker trains; stops when destroyed. A heartbeat that
// finds the registration dropped on a server interrupts the worker's calls
// in flight, so that it rejoins at once instead of when a call parked on
// another server gives up.
#ifndef SEGPS_WORKER_CLIENT_HEARTBEAT_LOOP_H_
#define SEGPS_WORKER_CLIENT_HEARTBEAT_LOOP_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/sync.h"
#include "worker/client/ps_client.h"

namespace segps {

class HeartbeatLoop {
 public:
  HeartbeatLoop(ParameterClient* client, absl::Duration period) {
    thread_ = std::thread([this, client, period] {
      while (!StopWithin(period)) {
        absl::Status status = client->Heartbeat();
        if (status.ok()) continue;
        SEGPS_LOG_WARNING << "heartbeat: " << status.message();
        // A server dropped the registration (it restarted, or the lease
        // lapsed): the calls in flight fail with that, and the worker rejoins.
        if (absl::IsNotFound(status) || absl::IsFailedPrecondition(status)) client->Interrupt(status);
      }
    });
  }
  ~HeartbeatLoop() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      changed_.SignalAll();
    }
    thread_.join();
  }

 private:
  // True once asked to stop; waits at most `period` for it.
  bool StopWithin(absl::Duration period) {
    MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + period;
    while (!stop_ && absl::Now() < deadline) changed_.WaitWithDeadline(&mu_, deadline);
    return stop_;
  }
  Mutex mu_;
  CondVar changed_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_HEARTBEAT_LOOP_H_
