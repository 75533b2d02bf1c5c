#include "common/tensor_bytes.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace segps {

static_assert(sizeof(float) == 4, "float32 payloads need 4-byte floats");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "segps encodes payloads by memcpy and needs a little-endian host"
#endif

void EncodeFloat32(absl::Span<const float> values, uint64_t offset, v1::TensorSlice* slice) {
  slice->set_offset(offset);
  slice->set_count(values.size());
  slice->set_dtype(v1::FLOAT32);
  std::string* data = slice->mutable_data();
  data->resize(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(data->data(), values.data(), data->size());
}

absl::Status ValidateFloat32Slice(const v1::TensorSlice& slice, uint64_t offset, uint64_t count,
                                  const char* what) {
  if (slice.dtype() != v1::FLOAT32) {
    if (slice.dtype() == v1::FLOAT16 || slice.dtype() == v1::BFLOAT16) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": dtype ", v1::DType_Name(slice.dtype()), " is not supported yet; send FLOAT32"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown dtype ", static_cast<int>(slice.dtype()), "; send FLOAT32"));
  }
  if (slice.offset() != offset || slice.count() != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": range [", slice.offset(), ", ", slice.offset() + slice.count(),
        ") does not match this server's shard [", offset, ", ", offset + count, ")"));
  }
  if (slice.data().size() != count * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", slice.data().size(),
                                                   " bytes for ", count,
                                                   " float32 elements; expected ",
                                                   count * sizeof(float)));
  }
  return absl::OkStatus();
}

void DecodeFloat32(const v1::TensorSlice& slice, absl::Span<float> out) {
  if (!out.empty()) std::memcpy(out.data(), slice.data().data(), out.size() * sizeof(float));
}

absl::Span<const float> Float32View(const v1::TensorSlice& slice, std::string* scratch) {
  const std::string& bytes = slice.data();
  const size_t n = bytes.size() / sizeof(float);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0) {
    return absl::Span<const float>(reinterpret_cast<const float*>(bytes.data()), n);
  }
  scratch->assign(bytes);  // std::string storage is max-aligned
  return absl::Span<const float>(reinterpret_cast<const float*>(scratch->data()), n);
}

}  // namespace segps
