// The Replicate stream's messages as gRPC bytes
// (proto/segps/v1/replication.proto). A push record's gradient goes out as
// the primary's record holds it and comes in as the transport's slices:
// its bytes are copied neither way, as a worker's push's are
// (common/tensor_wire_grpc.h).
#ifndef SEGPS_SERVER_REPLICA_WIRE_H_
#define SEGPS_SERVER_REPLICA_WIRE_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/sync_stream.h>

#include <memory>

#include "absl/status/status.h"
#include "common/tensor_wire.h"
#include "segps/v1/replication.pb.h"
#include "server/replica_log.h"

namespace segps {

inline constexpr char kReplicateMethod[] = "/segps.v1.Replication/Replicate";

// A primary's side of a Replicate stream on `channel`, records out and
// acknowledgements in, as bytes.
using ReplicateStream = grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
std::unique_ptr<ReplicateStream> OpenReplicate(grpc::Channel* channel, grpc::ClientContext* context);

// `change` as bytes; a push's gradient bytes are referenced (the buffer
// keeps them alive), not copied.
grpc::ByteBuffer EncodeRecord(const ReplicaChange& change);
// The inverse: every field into `record` but the gradient's data, which
// `gradient` holds in the buffer's own slices. INVALID_ARGUMENT on bytes
// that are not a record.
absl::Status DecodeRecord(const grpc::ByteBuffer& bytes, v1::ReplicaRecord* record, Payload* gradient);

grpc::ByteBuffer EncodeAck(const v1::ReplicaAck& ack);
// False on bytes that are not an acknowledgement.
bool DecodeAck(grpc::ByteBuffer* bytes, v1::ReplicaAck* ack);

}  // namespace segps

#endif  // SEGPS_SERVER_REPLICA_WIRE_H_
