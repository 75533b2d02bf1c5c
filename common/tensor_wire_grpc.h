// How gRPC carries tensor payloads without copying them: a sender hands
// gRPC the tensor's own buffer as one slice beside a small serialised
// header; a receiver reads the header and leaves the data in the slices it
// arrived in (a Payload that keeps them alive).
//
// The bytes are ordinary protobuf: a PushRequest built here parses with any
// protobuf library, and a PushRequest from any client decodes here.
#ifndef SEGPS_COMMON_TENSOR_WIRE_GRPC_H_
#define SEGPS_COMMON_TENSOR_WIRE_GRPC_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/tensor_wire.h"
#include "google/protobuf/message_lite.h"
#include "segps/v1/parameter_server.pb.h"

namespace segps {

// The gRPC method paths of the calls that carry tensors.
inline constexpr char kPullMethod[] = "/segps.v1.ParameterServer/Pull";
inline constexpr char kPushMethod[] = "/segps.v1.ParameterServer/Push";
inline constexpr char kPushStreamMethod[] = "/segps.v1.ParameterServer/PushStream";
inline constexpr char kPullStreamMethod[] = "/segps.v1.ParameterServer/PullStream";

// `values` copied into a new slice as elements of `dtype` (a dtype
// DTypeBytes knows), for gRPC to send.
grpc::Slice EncodeValues(absl::Span<const float> values, v1::DType dtype);

// `header` (which leaves field `tensor_field` unset) followed by `tensor`
// (whose data is unset) in field `tensor_field`, with `data` as the tensor's
// data. `data` is referenced, not copied.
grpc::ByteBuffer EncodeTensorMessage(const google::protobuf::MessageLite& header, int tensor_field,
                                     const v1::TensorSlice& tensor, const grpc::Slice& data);

// The same with `data`'s pieces as the tensor's data, each referenced and
// keeping the payload's owner alive (copied where it has none).
grpc::ByteBuffer EncodeTensorMessage(const google::protobuf::MessageLite& header, int tensor_field,
                                     const v1::TensorSlice& tensor, const Payload& data);

// The inverse: parses every field but `tensor_field` into `header`, the
// tensor's fields but data into `tensor`, and its data into `payload`, which
// keeps the buffer's slices alive rather than copying them. INVALID_ARGUMENT
// on bytes that are not such a message.
absl::Status DecodeTensorMessage(const grpc::ByteBuffer& buffer, int tensor_field, google::protobuf::MessageLite* header,
                                 v1::TensorSlice* tensor, Payload* payload);

}  // namespace segps

#endif  // SEGPS_COMMON_TENSOR_WIRE_GRPC_H_
