#include "common/tensor_wire.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/vector_clones.h"

namespace segps {

static_assert(sizeof(float) == 4, "float32 payloads need 4-byte floats");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "segps encodes payloads by memcpy and needs a little-endian host"
#endif

namespace {

// 32 KiB: stays in L1/L2 between the copy and the consumer's read.
constexpr size_t kBlockFloats = 8192;

}  // namespace

Payload Payload::FromPieces(std::vector<absl::string_view> pieces, std::shared_ptr<const void> owner) {
  Payload payload;
  for (absl::string_view piece : pieces) payload.size_ += piece.size();
  payload.pieces_ = std::move(pieces);
  payload.owner_ = std::move(owner);
  return payload;
}

Payload Payload::Mapped(absl::string_view bytes, std::shared_ptr<const void> owner) {
  Payload payload = FromPieces({bytes}, std::move(owner));
  payload.mapped_ = true;
  return payload;
}

Payload Payload::Borrow(absl::string_view bytes) {
  Payload payload;
  payload.pieces_.push_back(bytes);
  payload.size_ = bytes.size();
  return payload;
}

size_t DTypeBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return 4;
    case v1::BFLOAT16:
    case v1::FLOAT16:
      return 2;
    default:
      return 0;
  }
}

namespace {

// Two-byte elements of `dtype` widened to float32.
void Widen(v1::DType dtype, const uint16_t* in, absl::Span<float> out) {
  if (dtype == v1::FLOAT16) {
    FromFloat16(in, out);
  } else {
    FromBfloat16(in, out);
  }
}

// `n` two-byte elements at `p` as an aligned array: in place when `p` is
// aligned, else copied into `*scratch` (kBlockFloats elements, allocated on
// first use).
const uint16_t* Halves(const char* p, size_t n, std::unique_ptr<uint16_t[]>* scratch) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(uint16_t) == 0) return reinterpret_cast<const uint16_t*>(p);
  if (!*scratch) *scratch = std::make_unique<uint16_t[]>(kBlockFloats);
  std::memcpy(scratch->get(), p, n * sizeof(uint16_t));
  return scratch->get();
}

// 1 when some element of `halves` has every bit of `exponent` set; one
// branch-free pass (vectorised at -O3).
uint32_t AnyExponentAllOnes(const char* halves, size_t count, uint16_t exponent) {
  uint32_t found = 0;
  for (size_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, halves + i * sizeof(h), sizeof(h));
    found |= static_cast<uint32_t>((h & exponent) == exponent);
  }
  return found;
}

}  // namespace

bool Payload::HasNonFinite16(v1::DType dtype) const {
  const uint16_t exponent = dtype == v1::BFLOAT16 ? 0x7f80 : 0x7c00;
  uint32_t found = 0;
  char carry[sizeof(uint16_t)];  // an element split between pieces
  bool carried = false;
  for (absl::string_view piece : pieces_) {
    const char* p = piece.data();
    size_t left = piece.size();
    if (carried && left > 0) {
      carry[1] = *p++;
      --left;
      found |= AnyExponentAllOnes(carry, 1, exponent);
      carried = false;
    }
    found |= AnyExponentAllOnes(p, left / sizeof(uint16_t), exponent);
    if (left % sizeof(uint16_t) != 0) {
      carry[0] = p[left - 1];
      carried = true;
    }
  }
  return found != 0;
}

void Payload::ForEachRun(size_t width, size_t begin, size_t end,
                         absl::FunctionRef<void(size_t, const char*, size_t)> fn) const {
  size_t done = begin;         // the next element to hand to fn
  size_t skip = begin * width;  // bytes before it not yet passed
  char carry[sizeof(float)];    // an element split between pieces
  size_t carried = 0;
  for (absl::string_view piece : pieces_) {
    if (done >= end) return;
    if (skip >= piece.size()) {
      skip -= piece.size();
      continue;
    }
    const char* p = piece.data() + skip;
    size_t left = piece.size() - skip;
    skip = 0;
    if (carried > 0) {
      const size_t take = std::min(left, width - carried);
      std::memcpy(carry + carried, p, take);
      carried += take;
      p += take;
      left -= take;
      if (carried < width) continue;
      fn(done++, carry, 1);
      carried = 0;
    }
    while (left >= width && done < end) {
      const size_t n = std::min({left / width, kBlockFloats, end - done});
      fn(done, p, n);
      done += n;
      p += n * width;
      left -= n * width;
    }
    if (done >= end) return;
    std::memcpy(carry, p, left);
    carried = left;
  }
}

void Payload::ForEachFloatBlock(v1::DType dtype,
                                absl::FunctionRef<void(size_t, absl::Span<const float>)> fn) const {
  const size_t width = DTypeBytes(dtype);
  ForEachFloatBlock(dtype, 0, Elements(width), fn);
}

void Payload::ForEachFloatBlock(v1::DType dtype, size_t begin, size_t end,
                                absl::FunctionRef<void(size_t, absl::Span<const float>)> fn) const {
  const size_t width = DTypeBytes(dtype);
  std::unique_ptr<float[]> floats;
  std::unique_ptr<uint16_t[]> halves;
  ForEachRun(width, begin, end, [&](size_t first, const char* p, size_t n) {
    if (width == sizeof(float) && reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
      fn(first, absl::Span<const float>(reinterpret_cast<const float*>(p), n));
      return;
    }
    if (!floats) floats = std::make_unique<float[]>(kBlockFloats);
    const absl::Span<float> block(floats.get(), n);
    if (width == sizeof(float)) {
      std::memcpy(floats.get(), p, n * sizeof(float));
    } else {
      Widen(dtype, Halves(p, n, &halves), block);
    }
    fn(first, block);
  });
}

void Payload::CopyTo(v1::DType dtype, absl::Span<float> out) const {
  if (dtype != v1::FLOAT32) {
    // Widened straight into `out`: a pull lands in one pass over its bytes.
    std::unique_ptr<uint16_t[]> halves;
    const size_t width = DTypeBytes(dtype);
    ForEachRun(width, 0, Elements(width), [&](size_t first, const char* p, size_t n) {
      Widen(dtype, Halves(p, n, &halves), out.subspan(first, n));
    });
    return;
  }
  char* dest = reinterpret_cast<char*>(out.data());
  for (absl::string_view piece : pieces_) {
    if (piece.empty()) continue;
    std::memcpy(dest, piece.data(), piece.size());
    dest += piece.size();
  }
}

void EncodeValuesTo(absl::Span<const float> values, v1::DType dtype, char* out) {
  if (dtype == v1::FLOAT32) {
    std::memcpy(out, values.data(), values.size() * sizeof(float));
    return;
  }
  // Aligned when `out` is (new[] and std::string data are): else via blocks.
  if (reinterpret_cast<uintptr_t>(out) % alignof(uint16_t) == 0) {
    uint16_t* halves = reinterpret_cast<uint16_t*>(out);
    dtype == v1::FLOAT16 ? ToFloat16(values, halves) : ToBfloat16(values, halves);
    return;
  }
  std::vector<uint16_t> block(std::min(values.size(), kBlockFloats));
  for (size_t at = 0; at < values.size(); at += block.size()) {
    const absl::Span<const float> part = values.subspan(at, block.size());
    dtype == v1::FLOAT16 ? ToFloat16(part, block.data()) : ToBfloat16(part, block.data());
    std::memcpy(out + at * sizeof(uint16_t), block.data(), part.size() * sizeof(uint16_t));
  }
}

namespace {

absl::Status ValidateSparse(const v1::TensorSlice& slice, size_t payload_bytes, size_t width, const char* what) {
  const std::string& indices = slice.indices();
  if (indices.size() % sizeof(uint32_t) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", indices.size(), " bytes of indices; expected 4 per index"));
  }
  const size_t entries = indices.size() / sizeof(uint32_t);
  if (payload_bytes != entries * width) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", payload_bytes, " bytes for ", entries, " ",
                                                   v1::DType_Name(slice.dtype()), " sparse entries; expected ",
                                                   entries * width));
  }
  int64_t previous = -1;
  for (size_t i = 0; i < entries; ++i) {
    uint32_t index;
    std::memcpy(&index, indices.data() + i * sizeof(uint32_t), sizeof(index));
    if (index >= slice.count() || static_cast<int64_t>(index) <= previous) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": sparse index ", i, " is ", index,
                                                     "; indices must ascend strictly and stay below the count ",
                                                     slice.count()));
    }
    previous = index;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTensorSlice(const v1::TensorSlice& slice, size_t payload_bytes, uint64_t range_offset,
                                 uint64_t range_count, const char* what) {
  const size_t width = DTypeBytes(slice.dtype());
  if (width == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown dtype ", static_cast<int>(slice.dtype()),
                                                   "; send FLOAT32, BFLOAT16 or FLOAT16"));
  }
  if (slice.offset() < range_offset || slice.count() > range_count ||
      slice.offset() - range_offset > range_count - slice.count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": range [", slice.offset(), ", ", slice.offset() + slice.count(),
        ") is not within this server's shard [", range_offset, ", ", range_offset + range_count, ")"));
  }
  if (slice.has_indices()) return ValidateSparse(slice, payload_bytes, width, what);
  if (payload_bytes != slice.count() * width) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", payload_bytes, " bytes for ", slice.count(), " ",
                                                   v1::DType_Name(slice.dtype()), " elements; expected ",
                                                   slice.count() * width));
  }
  return absl::OkStatus();
}

namespace {

// One branch-free pass, so that checking a push costs no more than reading
// it once: the largest magnitude, and whether an exponent is all ones
// (infinity or NaN).
struct Magnitudes {
  float max_abs = 0;
  bool finite = true;
};

// 32 running maxima, so that the vectorised loop keeps four (AVX2) or eight
// (SSE2) registers busy rather than waiting on one: twice as fast on a
// 4 MB push read from cache.
SEGPS_VECTOR_CLONES Magnitudes ScanMagnitudes(absl::Span<const float> values) {
  constexpr size_t kLanes = 32;
  int32_t lanes[kLanes] = {};
  const float* p = values.data();
  const size_t n = values.size(), whole = n - n % kLanes;
  for (size_t i = 0; i < whole; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) lanes[k] = std::max(lanes[k], MagnitudeBits(p[i + k]));
  }
  int32_t most = 0;
  for (const int32_t lane : lanes) most = std::max(most, lane);
  for (size_t i = whole; i < n; ++i) most = std::max(most, MagnitudeBits(p[i]));
  Magnitudes found;
  found.finite = most < kNonFiniteBits;
  std::memcpy(&found.max_abs, &most, sizeof(most));
  return found;
}

}  // namespace

float MaxMagnitude(absl::Span<const float> values) { return ScanMagnitudes(values).max_abs; }

std::optional<size_t> FirstNonFinite(absl::Span<const float> values) {
  if (ScanMagnitudes(values).finite) return std::nullopt;
  return std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); }) - values.begin();
}

std::optional<size_t> CopyFinite(absl::Span<const float> from, float* to) {
  int32_t most = 0;
  for (size_t i = 0; i < from.size(); ++i) {
    to[i] = from[i];
    most = std::max(most, MagnitudeBits(from[i]));
  }
  if (most < kNonFiniteBits) return std::nullopt;
  return FirstNonFinite(absl::MakeConstSpan(to, from.size()));
}

DenseView::DenseView(const v1::TensorSlice& slice, const Payload& data)
    : data_(data), dtype_(slice.dtype()), count_(slice.count()), sparse_(slice.has_indices()) {
  if (!sparse_) return;
  indices_.resize(slice.indices().size() / sizeof(uint32_t));
  if (!indices_.empty()) std::memcpy(indices_.data(), slice.indices().data(), indices_.size() * sizeof(uint32_t));
  values_.resize(indices_.size());
  data.CopyTo(dtype_, absl::MakeSpan(values_));
}

DenseView::Values DenseView::Scan() const {
  Values found;
  auto scan = [&found](size_t first, absl::Span<const float> block) {
    if (found.non_finite.has_value()) return;
    const Magnitudes block_scan = ScanMagnitudes(block);
    if (block_scan.finite) {
      found.max_abs = std::max(found.max_abs, block_scan.max_abs);
    } else if (const std::optional<size_t> i = segps::FirstNonFinite(block)) {
      found.non_finite = Element{first + *i, block[*i]};
    }
  };
  if (sparse_) {
    scan(0, values_);
    if (found.non_finite.has_value()) found.non_finite->at = indices_[found.non_finite->at];
    return found;
  }
  if (dtype_ == v1::FLOAT16 && !data_.HasNonFinite16(dtype_)) {
    found.max_abs = count_ == 0 ? 0.0f : 65504.0f;
    return found;
  }
  data_.ForEachFloatBlock(dtype_, scan);
  return found;
}

void DenseView::ForEachFloatBlock(uint64_t begin, uint64_t end,
                                  absl::FunctionRef<void(size_t first, absl::Span<const float> block)> fn) const {
  if (!sparse_) {
    data_.ForEachFloatBlock(dtype_, begin, end, fn);
    return;
  }
  std::vector<float> block(std::min<uint64_t>(end - begin, kBlockFloats));
  // The first entry not yet placed.
  size_t next = std::lower_bound(indices_.begin(), indices_.end(), begin) - indices_.begin();
  for (uint64_t first = begin; first < end; first += block.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), end - first));
    std::fill_n(block.begin(), n, 0.0f);
    for (; next < indices_.size() && indices_[next] < first + n; ++next) block[indices_[next] - first] = values_[next];
    fn(static_cast<size_t>(first), absl::MakeConstSpan(block.data(), n));
  }
}

void EncodeFloat32(absl::Span<const float> values, uint64_t offset, v1::TensorSlice* slice) {
  slice->set_offset(offset);
  slice->set_count(values.size());
  slice->set_dtype(v1::FLOAT32);
  std::string* data = slice->mutable_data();
  data->resize(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(data->data(), values.data(), data->size());
}

void DecodeFloat32(const v1::TensorSlice& slice, absl::Span<float> out) {
  if (!out.empty()) std::memcpy(out.data(), slice.data().data(), out.size() * sizeof(float));
}

}  // namespace segps
