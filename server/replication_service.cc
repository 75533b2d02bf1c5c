#include "server/replication_service.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "server/replica_wire.h"

namespace segps {

ReplicationService::ReplicationService(ParameterServer* server, Failover* failover, std::vector<Token> tokens)
    : server_(server), failover_(failover), tokens_(std::move(tokens)) {
  constexpr int kReplicate = 0;  // the service's first method (replication.proto)
  MarkMethodStreamed(kReplicate, new grpc::internal::BidiStreamingHandler<ReplicationService, grpc::ByteBuffer,
                                                                          grpc::ByteBuffer>(
                                     &ReplicationService::ServeReplicate, this));
}

grpc::Status ReplicationService::ServeReplicate(grpc::ServerContext* context, ReplicateBytes* stream) {
  const Caller caller = CallerOf(*context, tokens_);
  if (absl::Status allowed = AuthorizeCall(caller, true, "Replicate"); !allowed.ok()) return ToGrpcStatus(allowed);
  grpc::ByteBuffer bytes;
  v1::ReplicaRecord record;
  Payload gradient;
  auto read = [&] {
    if (!stream->Read(&bytes)) return absl::CancelledError("the stream ended");
    return DecodeRecord(bytes, &record, &gradient);
  };
  if (absl::Status first = read(); !first.ok()) {
    return absl::IsCancelled(first) ? grpc::Status::OK : ToGrpcStatus(first);
  }
  if (!record.has_hello()) {
    return ToGrpcStatus(absl::InvalidArgumentError("Replicate: the first record must carry the primary's hello"));
  }
  if (absl::Status hello = server_->CheckHello(record.hello()); !hello.ok()) {
    SEGPS_LOG_WARNING << "server " << server_->index() << ": refused a replication stream from "
                      << context->peer() << ": " << hello.message();
    return ToGrpcStatus(hello);
  }
  const v1::ReplicaHello hello = record.hello();
  const uint32_t from = hello.from_server();
  absl::StatusOr<uint64_t> opened = failover_->Opened(hello, [context] { context->TryCancel(); });
  if (!opened.ok()) return ToGrpcStatus(opened.status());
  // Closed before the context goes.
  const absl::Cleanup closed = [&] { failover_->Closed(from, *opened); };
  SEGPS_LOG_INFO << "server " << server_->index() << ": backing server " << from << "'s ranges";
  for (absl::Status next = read(); !absl::IsCancelled(next); next = read()) {
    if (!next.ok()) return ToGrpcStatus(next);
    if (absl::Status taken = failover_->Take(hello, record, gradient); !taken.ok()) {
      SEGPS_LOG_WARNING << "server " << server_->index() << ": " << taken.message();
      return ToGrpcStatus(taken);
    }
    v1::ReplicaAck ack;
    ack.set_segment(record.segment());
    ack.set_range(record.range());
    ack.set_seq(record.seq());
    if (!stream->Write(EncodeAck(ack))) break;
  }
  return grpc::Status::OK;
}

grpc::Status ReplicationService::Fetch(grpc::ServerContext* context, const v1::FetchRequest* request,
                                       v1::ReplicaRecord* response) {
  const Caller caller = CallerOf(*context, tokens_);
  if (absl::Status allowed = AuthorizeCall(caller, true, "Fetch"); !allowed.ok()) return ToGrpcStatus(allowed);
  absl::StatusOr<v1::ReplicaRecord> copy = failover_->Fetch(*request);
  if (!copy.ok()) return ToGrpcStatus(copy.status());
  *response = *std::move(copy);
  return grpc::Status::OK;
}

grpc::Status ReplicationService::Suspect(grpc::ServerContext* context, const v1::SuspectRequest* request,
                                        v1::SuspectResponse* response) {
  const Caller caller = CallerOf(*context, tokens_);
  if (absl::Status allowed = AuthorizeCall(caller, true, "Suspect"); !allowed.ok()) return ToGrpcStatus(allowed);
  if (absl::Status hello = server_->CheckPeer(request->hello(), "Suspect"); !hello.ok()) return ToGrpcStatus(hello);
  *response = failover_->Suspect(*request);
  return grpc::Status::OK;
}

}  // namespace segps
