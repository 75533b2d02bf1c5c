// Whether a server still accepts connections, and what to do when it does
// not. gRPC (1.51) abandons a listening socket whose accept fails for want
// of file descriptors: once they are free again, connections still queue
// in the kernel, and none is ever served. ListenerWatch reads the accept
// queue of the server's listening port (/proc/net/tcp, tcp6) every period;
// a gRPC listener empties it at once, so connections that stay queued over
// three looks in a row, never fewer, mean an abandoned listener, which is
// restarted (`restart`: the gRPC server built again on the same port, the
// ParameterServer behind it untouched), logged and counted.
//
// Thread safety: the watch runs on its own thread; `restart` runs there.
#ifndef SEGPS_SERVER_LISTENER_WATCH_H_
#define SEGPS_SERVER_LISTENER_WATCH_H_

#include <functional>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace segps {

// Connections waiting to be accepted on the listening sockets of TCP `port`
// (the most on any one); nullopt if /proc cannot be read (no descriptor to
// spare, or no /proc).
std::optional<int> QueuedConnections(int port);

class ListenerWatch {
 public:
  ListenerWatch(int port, absl::Duration period, std::function<absl::Status()> restart);
  ~ListenerWatch();  // stops the thread (a restart under way finishes first)

 private:
  void Run();

  const int port_;
  const absl::Duration period_;
  const std::function<absl::Status()> restart_;
  Mutex mu_;
  CondVar wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_LISTENER_WATCH_H_
