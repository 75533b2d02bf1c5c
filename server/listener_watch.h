// Whether a server still accepts connections, and what to do when it does
// not. gRPC (1.51) abandons a listening socket whose accept fails for want
// of file descriptors ("Failed accept4: Too many open files"): once they
// are free again, connections still queue in the kernel, and none is ever
// served. ListenerWatch takes gRPC's log (WatchGrpcLog, which prints it as
// gRPC would) to learn of that failure, and once the process can open a
// file again it restarts the listener (`restart`: the gRPC server built
// again on the same port, the ParameterServer behind it untouched; tried
// again a period later if it fails). Nothing else restarts it: a slow
// server whose accept queue is long is left alone.
//
// Thread safety: the watch runs on its own thread; `restart` runs there.
#ifndef SEGPS_SERVER_LISTENER_WATCH_H_
#define SEGPS_SERVER_LISTENER_WATCH_H_

#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace segps {

// Routes gRPC's log through a function that notes a failed accept (and
// prints every line to stderr as gRPC does). Call once, before serving.
void WatchGrpcLog();

class ListenerWatch {
 public:
  ListenerWatch(absl::Duration period, std::function<absl::Status()> restart);
  ~ListenerWatch();  // stops the thread (a restart under way finishes first)

 private:
  void Run();

  const absl::Duration period_;
  const std::function<absl::Status()> restart_;
  Mutex mu_;
  CondVar wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_LISTENER_WATCH_H_
