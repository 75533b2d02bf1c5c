// The gRPC face of a ParameterServer: serves segps.v1.ParameterServer on an
// address and converts statuses at the edge. Start it as many times as you
// like in one process (port 0 picks a free port).
#ifndef SEGPS_SERVER_GRPC_SERVICE_H_
#define SEGPS_SERVER_GRPC_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/failover.h"
#include "server/parameter_server.h"

namespace segps {

class RunningServer {
 public:
  virtual ~RunningServer() = default;
  // host:port actually bound (the port resolved when 0 was asked for).
  virtual const std::string& address() const = 0;
  // Stops accepting calls, cancels waiting pulls within `grace`, and returns
  // when every handler has finished.
  virtual void Shutdown(absl::Duration grace) = 0;
};

// Serves `server` (which must outlive the result) on `listen` ("host:port")
// on gRPC's callback API. Pushes and pulls of 256 KiB or more are served on
// `handler_threads` threads of the service's own (server/handler_pool.h).
// With cluster.replicas, `failover` (which must outlive the result; none:
// the server takes no range over) also serves calls for the primaries whose
// ranges it took over, and the backup's side of replication.
absl::StatusOr<std::unique_ptr<RunningServer>> StartGrpcServer(ParameterServer* server, const std::string& listen,
                                                               int handler_threads = 2, Failover* failover = nullptr);

}  // namespace segps

#endif  // SEGPS_SERVER_GRPC_SERVICE_H_
