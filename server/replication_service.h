// The backup's side of replication (cluster.replicas): serves
// segps.v1.Replication, the streams primaries write their ranges' records
// on (proto/segps/v1/replication.proto). Each stream opens with a hello the
// server checks (the job, the ring, and where calls are authenticated the
// servers' seal); every record is then taken by the server's copy of its
// range and acknowledged, in order. A record that is refused ends the
// stream with the reason and changes nothing; the primary opens a new one,
// which starts again from the range's state. Failover (server/failover.h)
// refuses the streams of a primary's run it took over, hands ranges taken
// over back on Fetch, and answers Suspect.
#ifndef SEGPS_SERVER_REPLICATION_SERVICE_H_
#define SEGPS_SERVER_REPLICATION_SERVICE_H_

#include <vector>

#include "common/security.h"
#include "segps/v1/replication.grpc.pb.h"
#include "server/failover.h"
#include "server/parameter_server.h"

namespace segps {

class ReplicationService final : public v1::Replication::Service {
 public:
  // `server` and `failover` outlive the service.
  ReplicationService(ParameterServer* server, Failover* failover, std::vector<Token> tokens);

  // Replicate, served as bytes (server/replica_wire.h) so that a push's
  // gradient is applied from the slices it arrived in.
  using ReplicateBytes = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  grpc::Status ServeReplicate(grpc::ServerContext* context, ReplicateBytes* stream);
  grpc::Status Fetch(grpc::ServerContext* context, const v1::FetchRequest* request,
                     v1::ReplicaRecord* response) override;
  grpc::Status Suspect(grpc::ServerContext* context, const v1::SuspectRequest* request,
                       v1::SuspectResponse* response) override;

 private:
  ParameterServer* const server_;
  Failover* const failover_;
  const std::vector<Token> tokens_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_REPLICATION_SERVICE_H_
