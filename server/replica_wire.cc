#include "server/replica_wire.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tensor_wire_grpc.h"

namespace segps {

std::unique_ptr<ReplicateStream> OpenReplicate(grpc::Channel* channel, grpc::ClientContext* context) {
  const grpc::internal::RpcMethod method(kReplicateMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
  return std::unique_ptr<ReplicateStream>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel, method,
                                                                                            context));
}

grpc::ByteBuffer EncodeRecord(const ReplicaChange& change) {
  const v1::ReplicaRecord& record = change.record;
  if (!record.has_push()) {
    grpc::Slice bytes(record.SerializeAsString());
    return grpc::ByteBuffer(&bytes, 1);
  }
  // The gradient's fields, its bytes apart.
  v1::ReplicaRecord head = record;
  v1::TensorSlice tensor = std::move(*head.mutable_gradient());
  head.clear_gradient();
  return EncodeTensorMessage(head, v1::ReplicaRecord::kGradientFieldNumber, tensor, change.gradient);
}

absl::Status DecodeRecord(const grpc::ByteBuffer& bytes, v1::ReplicaRecord* record, Payload* gradient) {
  v1::TensorSlice tensor;
  absl::Status decoded =
      DecodeTensorMessage(bytes, v1::ReplicaRecord::kGradientFieldNumber, record, &tensor, gradient);
  if (!decoded.ok()) return absl::InvalidArgumentError(absl::StrCat("Replicate: ", decoded.message()));
  if (record->has_push()) *record->mutable_gradient() = std::move(tensor);
  return absl::OkStatus();
}

grpc::ByteBuffer EncodeAck(const v1::ReplicaAck& ack) {
  grpc::Slice bytes(ack.SerializeAsString());
  return grpc::ByteBuffer(&bytes, 1);
}

bool DecodeAck(grpc::ByteBuffer* bytes, v1::ReplicaAck* ack) {
  return grpc::SerializationTraits<v1::ReplicaAck>::Deserialize(bytes, ack).ok();
}

}  // namespace segps
