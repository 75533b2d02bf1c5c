// Tensor payloads, independent of any transport: a TensorSlice's data is
// packed little-endian float32 (or bfloat16 or float16, half the bytes),
// held as byte pieces where the transport received them (Payload) and read
// from there once. A sparse slice (gradients only) adds the positions of its
// values; the rest of it reads as zeros (DenseView). How gRPC carries them
// without a copy is in tensor_wire_grpc.h.
#ifndef SEGPS_COMMON_TENSOR_WIRE_H_
#define SEGPS_COMMON_TENSOR_WIRE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/half_float.h"
#include "segps/v1/parameter_server.pb.h"

namespace segps {

// The data of a tensor slice: byte pieces in order, held in the buffers
// they arrived in (kept alive by an owner shared among copies) or borrowed
// from the caller.
class Payload {
 public:
  Payload() = default;
  // Borrows `bytes`: the caller keeps them alive while the payload is used.
  static Payload Borrow(absl::string_view bytes);
  // `pieces` in order, kept valid and unchanged by `owner` (e.g. the
  // transport's buffers).
  static Payload FromPieces(std::vector<absl::string_view> pieces, std::shared_ptr<const void> owner);
  // `bytes` in memory another process may write meanwhile (a shared
  // region), kept mapped by `owner`.
  static Payload Mapped(absl::string_view bytes, std::shared_ptr<const void> owner);

  size_t size() const { return size_; }
  const std::vector<absl::string_view>& pieces() const { return pieces_; }
  // What keeps the pieces valid and unchanged (FromPieces), so that they
  // may be held beyond the call; null for a borrowed or mapped payload.
  std::shared_ptr<const void> owner() const { return mapped_ ? nullptr : owner_; }

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
  // Calls fn(first, p, n) over consecutive runs, covering elements [begin,
  // end), of n (<= a block) whole elements of `width` bytes at p, the first
  // of them element `first`; an element split between pieces comes alone,
  // from a copy.
  void ForEachRun(size_t width, size_t begin, size_t end,
                  absl::FunctionRef<void(size_t first, const char* p, size_t n)> fn) const;
  // Whole elements of `width` bytes held (none for an unknown dtype's 0).
  size_t Elements(size_t width) const { return width == 0 ? 0 : size_ / width; }

  std::shared_ptr<const void> owner_;
  bool mapped_ = false;
  std::vector<absl::string_view> pieces_;
  size_t size_ = 0;
};

// Bytes per element of the dtypes this version reads and writes (FLOAT32,
// BFLOAT16, FLOAT16); 0 for any other.
size_t DTypeBytes(v1::DType dtype);

// Writes `values` as elements of `dtype` (a dtype DTypeBytes knows) to
// `out`, which has room for values.size() * DTypeBytes(dtype) bytes.
void EncodeValuesTo(absl::Span<const float> values, v1::DType dtype, char* out);

// Checks that `slice` has a dtype DTypeBytes knows, lies within
// [range_offset, range_offset + range_count), and that `payload_bytes` holds
// exactly its elements (for a sparse slice: one per index, the indices
// ascending and within the count). `what` names the slice in the error.
absl::Status ValidateTensorSlice(const v1::TensorSlice& slice, size_t payload_bytes, uint64_t range_offset,
                                 uint64_t range_count, const char* what);

// The position of the first value that is not finite (infinity or NaN), if any.
std::optional<size_t> FirstNonFinite(absl::Span<const float> values);
// A float's bits without its sign, as a non-negative integer: they order as
// the magnitudes do, and those of infinity and NaN (an exponent of all ones)
// are at least kNonFiniteBits. Compared as signed integers, SSE2 takes four
// at a time (a float max it does not vectorise without -ffast-math).
inline int32_t MagnitudeBits(float v) {
  int32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits & 0x7fffffff;
}
inline constexpr int32_t kNonFiniteBits = 0x7f800000;
// Whether every one of `values` is finite: one vectorizable pass, inline
// for short rows checked while they are in cache.
inline bool AllFinite(absl::Span<const float> values) {
  int32_t most = 0;
  for (const float v : values) most = std::max(most, MagnitudeBits(v));
  return most < kNonFiniteBits;
}
// `from` copied to `to` (from.size() floats), checked in the same pass: the
// position of the first copied value that is not finite, if any.
std::optional<size_t> CopyFinite(absl::Span<const float> from, float* to);
// The largest magnitude among `values` (0 if none), in the same vectorised
// pass; infinity or NaN, if present, is above every finite value.
float MaxMagnitude(absl::Span<const float> values);

// The elements of a validated tensor slice, dense, as float32: the payload's
// values, or for a sparse slice, its values at their indices and zeros
// elsewhere. Refers to `data`, which must outlive it.
class DenseView {
 public:
  DenseView(const v1::TensorSlice& slice, const Payload& data);

  uint64_t count() const { return count_; }
  // The payload itself where it is the elements as they are (dense
  // FLOAT32), else null.
  const Payload* float32() const { return !sparse_ && dtype_ == v1::FLOAT32 ? &data_ : nullptr; }
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
  std::optional<Element> FirstNonFinite() const { return Scan().non_finite; }
  // The same, and else the largest magnitude of an element (for FLOAT16,
  // whose bits are not widened to read it, the largest it can hold), in
  // one pass over the values.
  struct Values {
    std::optional<Element> non_finite;
    float max_abs = 0;
  };
  Values Scan() const;

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
