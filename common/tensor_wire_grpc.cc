#include "common/tensor_wire_grpc.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace segps {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kTensorDataField = v1::TensorSlice::kDataFieldNumber;

// Reads a sequence of gRPC slices without copying them.
class SliceInputStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SliceInputStream(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    while (index_ < slices_.size() && used_ == slices_[index_].size()) {
      ++index_;
      used_ = 0;
    }
    if (index_ == slices_.size()) return false;
    const grpc::Slice& s = slices_[index_];
    *data = s.begin() + used_;
    *size = static_cast<int>(s.size() - used_);
    position_ += s.size() - used_;
    used_ = s.size();
    return true;
  }
  void BackUp(int count) override {
    used_ -= count;
    position_ -= count;
  }
  bool Skip(int count) override {
    const void* data;
    int size;
    while (count > 0) {
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return static_cast<int64_t>(position_); }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0, used_ = 0, position_ = 0;
};

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void AppendLengthTag(int field, uint64_t length, std::string* out) {
  AppendVarint(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), out);
  AppendVarint(length, out);
}

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed message: ", why));
}

// The message's bytes before its tensor's data of `data_size` bytes.
std::string TensorMessageHead(const google::protobuf::MessageLite& header, int tensor_field,
                              const v1::TensorSlice& tensor, size_t data_size) {
  std::string head = header.SerializeAsString();
  std::string tensor_head = tensor.SerializeAsString();
  std::string data_tag;
  AppendLengthTag(kTensorDataField, data_size, &data_tag);
  AppendLengthTag(tensor_field, tensor_head.size() + data_tag.size() + data_size, &head);
  head += tensor_head;
  head += data_tag;
  return head;
}

}  // namespace

grpc::Slice EncodeValues(absl::Span<const float> values, v1::DType dtype) {
  const size_t bytes = values.size() * DTypeBytes(dtype);
  float* out = new float[(bytes + sizeof(float) - 1) / sizeof(float)];
  EncodeValuesTo(values, dtype, reinterpret_cast<char*>(out));
  return grpc::Slice(out, bytes, [](void* p) { delete[] static_cast<float*>(p); });
}

grpc::ByteBuffer EncodeTensorMessage(const google::protobuf::MessageLite& header, int tensor_field,
                                     const v1::TensorSlice& tensor, const grpc::Slice& data) {
  const grpc::Slice slices[2] = {grpc::Slice(TensorMessageHead(header, tensor_field, tensor, data.size())), data};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer EncodeTensorMessage(const google::protobuf::MessageLite& header, int tensor_field,
                                     const v1::TensorSlice& tensor, const Payload& data) {
  std::vector<grpc::Slice> slices;
  slices.reserve(data.pieces().size() + 1);
  slices.emplace_back(TensorMessageHead(header, tensor_field, tensor, data.size()));
  using Owner = std::shared_ptr<const void>;
  const Owner owner = data.owner();
  for (absl::string_view piece : data.pieces()) {
    if (owner == nullptr) {
      slices.emplace_back(piece.data(), piece.size());
    } else {
      slices.emplace_back(const_cast<char*>(piece.data()), piece.size(),
                          [](void* p) { delete static_cast<Owner*>(p); }, new Owner(owner));
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status DecodeTensorMessage(const grpc::ByteBuffer& buffer, int tensor_field, google::protobuf::MessageLite* header,
                                 v1::TensorSlice* tensor, Payload* payload) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buffer.Valid() || !buffer.Dump(slices.get()).ok()) return Malformed("unreadable buffer");
  const size_t total = buffer.Length();
  SliceInputStream stream(*slices);
  google::protobuf::io::CodedInputStream input(&stream);
  input.SetTotalBytesLimit(INT32_MAX);
  std::string header_bytes, tensor_bytes;
  google::protobuf::io::StringOutputStream header_out(&header_bytes), tensor_out(&tensor_bytes);
  size_t data_at = 0, data_size = 0;
  {
    google::protobuf::io::CodedOutputStream header_fields(&header_out), tensor_fields(&tensor_out);
    while (uint32_t tag = input.ReadTag()) {
      if (WireFormatLite::GetTagFieldNumber(tag) != tensor_field ||
          WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        if (!WireFormatLite::SkipField(&input, tag, &header_fields)) return Malformed("bad field");
        continue;
      }
      uint32_t length = 0;
      if (!input.ReadVarint32(&length)) return Malformed("bad tensor length");
      const auto limit = input.PushLimit(static_cast<int>(length));
      while (uint32_t inner = input.ReadTag()) {
        if (WireFormatLite::GetTagFieldNumber(inner) != kTensorDataField ||
            WireFormatLite::GetTagWireType(inner) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
          if (!WireFormatLite::SkipField(&input, inner, &tensor_fields)) return Malformed("bad tensor field");
          continue;
        }
        uint32_t size = 0;
        if (!input.ReadVarint32(&size)) return Malformed("bad data length");
        data_at = static_cast<size_t>(input.CurrentPosition());
        data_size = size;
        if (!input.Skip(static_cast<int>(size))) return Malformed("tensor data runs past the end");
      }
      // ReadTag returns 0 both at a clean end and on a bad tag: tell them apart.
      if (!input.ConsumedEntireMessage() || input.BytesUntilLimit() != 0) return Malformed("bad tensor field");
      input.PopLimit(limit);
    }
    if (!input.ConsumedEntireMessage()) return Malformed("bad field");
  }
  if (static_cast<size_t>(input.CurrentPosition()) != total) return Malformed("trailing bytes");
  if (!header->ParseFromString(header_bytes)) return Malformed("bad header fields");
  if (!tensor->ParseFromString(tensor_bytes)) return Malformed("bad tensor fields");

  std::vector<absl::string_view> pieces;
  size_t at = 0;
  for (const grpc::Slice& s : *slices) {
    const size_t begin = std::max(at, data_at), end = std::min(at + s.size(), data_at + data_size);
    if (begin < end) {
      pieces.emplace_back(reinterpret_cast<const char*>(s.begin()) + (begin - at), end - begin);
    }
    at += s.size();
  }
  *payload = Payload::FromPieces(std::move(pieces), std::move(slices));
  return absl::OkStatus();
}

}  // namespace segps
