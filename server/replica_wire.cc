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

grpc::ByteBuffer EncodeRecord(std::shared_ptr<const v1::ReplicaRecord> record) {
  if (!record->has_push()) {
    grpc::Slice bytes(record->SerializeAsString());
    return grpc::ByteBuffer(&bytes, 1);
  }
  // A push record holds no state: every other field is here.
  v1::ReplicaRecord head;
  if (record->has_hello()) *head.mutable_hello() = record->hello();
  head.set_segment(record->segment());
  head.set_range(record->range());
  head.set_seq(record->seq());
  *head.mutable_push() = record->push();
  const v1::TensorSlice& gradient = record->gradient();
  v1::TensorSlice tensor;
  tensor.set_offset(gradient.offset());
  tensor.set_count(gradient.count());
  tensor.set_dtype(gradient.dtype());
  const std::string& data = gradient.data();
  auto* owner = new std::shared_ptr<const v1::ReplicaRecord>(std::move(record));
  const grpc::Slice slice(const_cast<char*>(data.data()), data.size(),
                          [](void* p) { delete static_cast<std::shared_ptr<const v1::ReplicaRecord>*>(p); }, owner);
  return EncodeTensorMessage(head, v1::ReplicaRecord::kGradientFieldNumber, tensor, slice);
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
