// Tensor payloads on the wire: a TensorSlice's data travels as packed
// little-endian float32 (or bfloat16 or float16, half the bytes) and is
// never copied on its way through protobuf and gRPC. A sender hands gRPC the
// tensor's own buffer as one slice beside a small serialised header; a
// receiver reads the header and leaves the data in the slices it arrived in,
// reading it from there once. A sparse slice (gradients only) adds the
// positions of its values; the rest of it reads as zeros (DenseView).
//
// The bytes are ordinary protobuf: a PushRequest built here parses with any
// protobuf library, and a PushRequest from any client decodes here.
#ifndef SEGPS_COMMON_TENSOR_WIRE_H_
#define SEGPS_COMMON_TENSOR_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/half_float.h"
#include "google/protobuf/message_lite.h"
#include "segps/v1/parameter_server.pb.h"

namespace segps {

// The gRPC method paths of the calls that carry tensors.
inline constexpr char kPullMethod[] = "/segps.v1.ParameterServer/Pull";
inline constexpr char kPushMethod[] = "/segps.v1.ParameterServer/Push";
inline constexpr char kPushStreamMethod[] = "/segps.v1.ParameterServer/PushStream";
inline constexpr char kPullStreamMethod[] = "/segps.v1.ParameterServer/PullStream";

// The data of a tensor slice: byte pieces in order, held in the gRPC slices
// they arrived in (kept alive here) or borrowed from the caller.
class Payload {
 public:
  Payload() = default;
  // Borrows `bytes`: the caller keeps them alive while the payload is used.
  static Payload Borrow(absl::string_view bytes);

  size_t size() const { return size_; }

  // Calls fn(first, block) over consecutive blocks of whole elements of
  // `dtype` (a dtype DTypeBytes knows) as float32 (first: index of the block's
  // first element), covering a payload of whole elements. Aligned float32
  // pieces are read in place; the rest pass through a cache-sized aligned
  // buffer (slices split elements anywhere; two-byte dtypes widen there).
  void ForEachFloatBlock(v1::DType dtype,
                         absl::FunctionRef<void(size_t first, absl::Span<const float> block)> fn) const;
  // The same over elements [begin, end) only (first counts from the payload's start).
  void ForEachFloatBlock(v1::DType dtype, size_t begin, size_t end,
                         absl::FunctionRef<void(size_t first, absl::Span<const float> block)> fn) const;

  // Copies the payload, elements of `dtype`, into `out` as float32.
  void CopyTo(v1::DType dtype, absl::Span<float> out) const;

  // Whether an element of a two-byte `dtype` (FLOAT16, BFLOAT16) is
  // infinity or NaN, read from the bits where they lie, without widening.
  bool HasNonFinite16(v1::DType dtype) const;

 private:
  friend absl::Status DecodeTensorMessage(const grpc::ByteBuffer&, int, google::protobuf::MessageLite*,
                                          v1::TensorSlice*, Payload*);
  // Calls fn(first, p, n) over consecutive runs, covering elements [begin,
  // end), of n (<= a block) whole elements of `width` bytes at p, the first
  // of them element `first`; an element split between pieces comes alone,
  // from a copy.
  void ForEachRun(size_t width, size_t begin, size_t end,
                  absl::FunctionRef<void(size_t first, const char* p, size_t n)> fn) const;
  // Whole elements of `width` bytes held (none for an unknown dtype's 0).
  size_t Elements(size_t width) const { return width == 0 ? 0 : size_ / width; }

  std::vector<grpc::Slice> owners_;
  std::vector<absl::string_view> pieces_;
  size_t size_ = 0;
};

// Bytes per element of the dtypes this version reads and writes (FLOAT32,
// BFLOAT16, FLOAT16); 0 for any other.
size_t DTypeBytes(v1::DType dtype);

// `values` copied into a new slice as elements of `dtype` (a dtype
// DTypeBytes knows), for gRPC to send.
grpc::Slice EncodeValues(absl::Span<const float> values, v1::DType dtype);

// `header` (which leaves field `tensor_field` unset) followed by `tensor`
// (whose data is unset) in field `tensor_field`, with `data` as the tensor's
// data. `data` is referenced, not copied.
grpc::ByteBuffer EncodeTensorMessage(const google::protobuf::MessageLite& header, int tensor_field,
                                     const v1::TensorSlice& tensor, const grpc::Slice& data);

// The inverse: parses every field but `tensor_field` into `header`, the
// tensor's fields but data into `tensor`, and its data into `payload`, which
// keeps the buffer's slices alive rather than copying them. INVALID_ARGUMENT
// on bytes that are not such a message.
absl::Status DecodeTensorMessage(const grpc::ByteBuffer& buffer, int tensor_field, google::protobuf::MessageLite* header,
                                 v1::TensorSlice* tensor, Payload* payload);

// Checks that `slice` has a dtype DTypeBytes knows, lies within
// [range_offset, range_offset + range_count), and that `payload_bytes` holds
// exactly its elements (for a sparse slice: one per index, the indices
// ascending and within the count). `what` names the slice in the error.
absl::Status ValidateTensorSlice(const v1::TensorSlice& slice, size_t payload_bytes, uint64_t range_offset,
                                 uint64_t range_count, const char* what);

// The position of the first value that is not finite (infinity or NaN), if any.
std::optional<size_t> FirstNonFinite(absl::Span<const float> values);

// The elements of a validated tensor slice, dense, as float32: the payload's
// values, or for a sparse slice, its values at their indices and zeros
// elsewhere. Refers to `data`, which must outlive it.
class DenseView {
 public:
  DenseView(const v1::TensorSlice& slice, const Payload& data);

  uint64_t count() const { return count_; }
  // As Payload::ForEachFloatBlock, over elements [begin, end) of the
  // count() (a sparse slice's entries found by bisection).
  void ForEachFloatBlock(uint64_t begin, uint64_t end,
                         absl::FunctionRef<void(size_t first, absl::Span<const float> block)> fn) const;

  // The first element that is not finite (its position in the slice and
  // value), if any. A sparse slice's zeros are not read.
  struct Element {
    uint64_t at;
    float value;
  };
  std::optional<Element> FirstNonFinite() const;

 private:
  const Payload& data_;
  v1::DType dtype_;
  uint64_t count_;
  bool sparse_;
  std::vector<uint32_t> indices_;  // sparse only: positions and their values, widened
  std::vector<float> values_;
};

// Plain-protobuf helpers for callers that build whole messages (tools, tests).
void EncodeFloat32(absl::Span<const float> values, uint64_t offset, v1::TensorSlice* slice);
void DecodeFloat32(const v1::TensorSlice& slice, absl::Span<float> out);

}  // namespace segps

#endif  // SEGPS_COMMON_TENSOR_WIRE_H_
