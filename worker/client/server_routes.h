// How a client reaches each server (common/server_route.h): at its own
// address, or, with cluster.replicas, through its first backup, naming it in
// the segps-server header, once that backup took its ranges over
// (server/failover.h). A call that finds a server gone (UNAVAILABLE, or
// past its deadline) one way makes the client's next try go the other
// (Failed): the servers refuse a way that does not serve the ranges
// (UNAVAILABLE, naming why), so the client needs no view of its own.
//
// Thread safety: every method may be called concurrently; a Way stays
// valid as long as the routes.
#ifndef SEGPS_WORKER_CLIENT_SERVER_ROUTES_H_
#define SEGPS_WORKER_CLIENT_SERVER_ROUTES_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/shard_map.h"
#include "segps/v1/parameter_server.grpc.pb.h"

namespace segps {

class ServerRoutes {
 public:
  struct Way {
    std::shared_ptr<v1::ParameterServer::Stub> stub;
    std::shared_ptr<grpc::GenericStub> generic;
    std::string name;  // "server 1 (host:port)", or "server 1 (through server 2 at host:port)"
    std::string header;  // the segps-server header's value; empty on the server's own way
    // How long a try may wait for the server to be reached this way before
    // the other way is tried: a lease where there is another.
    absl::Duration patience = absl::InfiniteDuration();
    // Names the server in `context` where the way goes through a backup.
    void Prepare(grpc::ClientContext* context) const;
    // A server's own way, over `channel`.
    static Way Own(std::shared_ptr<grpc::Channel> channel, std::string name);
  };

  // One way to each server: its own.
  explicit ServerRoutes(std::vector<Way> own);

  // With cluster.replicas >= 2 (`map`'s), server i's other way goes
  // through its first backup, and a try waits up to `lease` either way.
  ServerRoutes(const ShardMap& map, const std::vector<std::string>& addresses,
               const std::shared_ptr<grpc::ChannelCredentials>& credentials, const grpc::ChannelArguments& args,
               absl::Duration lease);

  size_t size() const { return ways_.size(); }
  // Server i's way now.
  const Way& way(size_t i) const;
  // A call to server i failed as calls to a server that is gone do: the
  // next goes the other way (none other with one copy).
  void Failed(size_t i);
  // The longest wait between tries: a 20th of a lease where a server's
  // ranges may move to its backup (so a client finds them there within
  // about that of the take-over), else a second.
  absl::Duration retry_cap() const { return retry_cap_; }

 private:
  std::vector<std::vector<Way>> ways_;  // per server: its own, then through its first backup
  std::unique_ptr<std::atomic<size_t>[]> current_;
  absl::Duration retry_cap_ = absl::Seconds(1);
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_SERVER_ROUTES_H_
