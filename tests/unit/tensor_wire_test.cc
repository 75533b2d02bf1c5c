#include "common/tensor_wire.h"
#include "common/tensor_wire_grpc.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace segps {
namespace {

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.5f * static_cast<float>(i) - 3.0f;
  return v;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

// `bytes` as a buffer of slices of 1 to 7 bytes: every element split every way.
grpc::ByteBuffer Shattered(const std::string& bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size();) {
    const size_t n = std::min<size_t>(1 + rng() % 7, bytes.size() - at);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer Whole(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

v1::PushRequest PlainPush(const std::vector<float>& values) {
  v1::PushRequest push;
  push.set_segment(3);
  push.set_worker_id(77);
  push.set_clock(12);
  EncodeFloat32(values, 100, push.mutable_gradient());
  return push;
}

std::vector<float> Blocks(const Payload& payload, size_t n, v1::DType dtype = v1::FLOAT32) {
  std::vector<float> out(n, NAN);
  size_t expected_first = 0;
  payload.ForEachFloatBlock(dtype, [&](size_t first, absl::Span<const float> block) {
    EXPECT_EQ(first, expected_first);
    std::copy(block.begin(), block.end(), out.begin() + static_cast<ptrdiff_t>(first));
    expected_first = first + block.size();
  });
  EXPECT_EQ(expected_first, n);
  return out;
}

// What the blocks of elements [begin, end) read, in order and contiguous.
template <typename Source>
std::vector<float> BlocksIn(const Source& read, size_t begin, size_t end) {
  std::vector<float> out;
  size_t expected_first = begin;
  read(begin, end, [&](size_t first, absl::Span<const float> block) {
    EXPECT_EQ(first, expected_first);
    out.insert(out.end(), block.begin(), block.end());
    expected_first = first + block.size();
  });
  EXPECT_EQ(expected_first, end);
  return out;
}

TEST(TensorWire, EncodedMessageIsOrdinaryProtobuf) {
  const std::vector<float> values = Ramp(1000);
  const grpc::Slice slice = EncodeValues(values, v1::FLOAT32);
  v1::PushRequest header = PlainPush({});
  header.clear_gradient();
  v1::TensorSlice tensor;
  tensor.set_offset(100);
  tensor.set_count(values.size());
  tensor.set_dtype(v1::FLOAT32);
  const grpc::ByteBuffer buffer = EncodeTensorMessage(header, v1::PushRequest::kGradientFieldNumber, tensor, slice);

  v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.SerializeAsString(), PlainPush(values).SerializeAsString());
}

TEST(TensorWire, DecodesPlainProtobufSplitAnywhere) {
  const std::vector<float> values = Ramp(20000);  // more than one block
  const std::string bytes = PlainPush(values).SerializeAsString();
  for (uint32_t seed : {1u, 2u, 3u}) {
    v1::PushRequest header;
    v1::TensorSlice tensor;
    Payload payload;
    ASSERT_TRUE(DecodeTensorMessage(Shattered(bytes, seed), v1::PushRequest::kGradientFieldNumber, &header, &tensor,
                                    &payload)
                    .ok());
    EXPECT_EQ(header.segment(), 3u);
    EXPECT_EQ(header.worker_id(), 77u);
    EXPECT_EQ(header.clock(), 12u);
    EXPECT_FALSE(header.has_gradient());
    EXPECT_EQ(tensor.offset(), 100u);
    EXPECT_EQ(tensor.count(), values.size());
    EXPECT_TRUE(tensor.data().empty());
    ASSERT_EQ(payload.size(), values.size() * sizeof(float));
    EXPECT_EQ(Blocks(payload, values.size()), values);
    std::vector<float> copied(values.size());
    payload.CopyTo(v1::FLOAT32, absl::MakeSpan(copied));
    EXPECT_EQ(copied, values);
    auto read = [&](size_t begin, size_t end, auto fn) { payload.ForEachFloatBlock(v1::FLOAT32, begin, end, fn); };
    for (auto [begin, end] : std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 8195}, {10000, 20000}}) {
      EXPECT_EQ(BlocksIn(read, begin, end), std::vector<float>(values.begin() + begin, values.begin() + end));
    }
  }
}

TEST(TensorWire, AcceptsAnyFieldOrderAndUnknownFields) {
  const std::vector<float> values = Ramp(5);
  // Gradient first, header fields after it, and a field this version does not know.
  v1::PushRequest gradient_only;
  EncodeFloat32(values, 100, gradient_only.mutable_gradient());
  v1::PushRequest rest = PlainPush({});
  rest.clear_gradient();
  std::string bytes = gradient_only.SerializeAsString() + rest.SerializeAsString();
  bytes += std::string("\xa0\x06\x2a", 3);  // field 100, varint 42
  v1::PushRequest header;
  v1::TensorSlice tensor;
  Payload payload;
  ASSERT_TRUE(
      DecodeTensorMessage(Whole(bytes), v1::PushRequest::kGradientFieldNumber, &header, &tensor, &payload).ok());
  EXPECT_EQ(header.clock(), 12u);
  EXPECT_EQ(tensor.count(), 5u);
  EXPECT_EQ(Blocks(payload, values.size()), values);
}

TEST(TensorWire, RejectsMalformedBytes) {
  const std::string good = PlainPush(Ramp(16)).SerializeAsString();
  const std::vector<std::string> bad = {
      good.substr(0, good.size() - 1),  // data runs past the end
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
      good + "\x0a",  // a tag without its value
      std::string("\xff", 1),  // a tag cut short
  };
  for (const std::string& bytes : bad) {
    v1::PushRequest header;
    v1::TensorSlice tensor;
    Payload payload;
    absl::Status status =
        DecodeTensorMessage(Whole(bytes), v1::PushRequest::kGradientFieldNumber, &header, &tensor, &payload);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(status.message()).find("malformed message"), std::string::npos) << status;
  }
}

TEST(TensorWire, ValidatesChunksAgainstTheShard) {
  v1::TensorSlice slice;
  slice.set_dtype(v1::FLOAT32);
  slice.set_offset(10);
  slice.set_count(5);
  EXPECT_TRUE(ValidateTensorSlice(slice, 20, 10, 5, "x").ok());
  EXPECT_TRUE(ValidateTensorSlice(slice, 20, 0, 15, "x").ok());   // a chunk at the end of the shard
  EXPECT_FALSE(ValidateTensorSlice(slice, 20, 0, 14, "x").ok());  // runs past it
  EXPECT_FALSE(ValidateTensorSlice(slice, 20, 11, 40, "x").ok()); // starts before it
  EXPECT_FALSE(ValidateTensorSlice(slice, 19, 10, 5, "x").ok());  // wrong byte count
  slice.set_dtype(v1::BFLOAT16);  // two bytes an element
  EXPECT_TRUE(ValidateTensorSlice(slice, 10, 10, 5, "x").ok());
  EXPECT_FALSE(ValidateTensorSlice(slice, 20, 10, 5, "x").ok());
  slice.set_dtype(v1::FLOAT16);
  EXPECT_TRUE(ValidateTensorSlice(slice, 10, 10, 5, "x").ok());
  slice.set_dtype(static_cast<v1::DType>(42));
  EXPECT_NE(std::string(ValidateTensorSlice(slice, 10, 10, 5, "x").message()).find("unknown dtype 42"),
            std::string::npos);
}

std::string Indices(const std::vector<uint32_t>& indices) {
  return std::string(reinterpret_cast<const char*>(indices.data()), indices.size() * sizeof(uint32_t));
}

TEST(TensorWire, ValidatesSparseSlices) {
  v1::TensorSlice slice;
  slice.set_dtype(v1::FLOAT32);
  slice.set_offset(10);
  slice.set_count(5);
  slice.set_indices(Indices({0, 2, 4}));
  EXPECT_TRUE(ValidateTensorSlice(slice, 12, 10, 5, "x").ok());
  EXPECT_FALSE(ValidateTensorSlice(slice, 20, 10, 5, "x").ok());  // a dense slice's bytes
  slice.set_indices("");                                          // present and empty: all zeros
  EXPECT_TRUE(ValidateTensorSlice(slice, 0, 10, 5, "x").ok());
  const std::pair<std::string, const char*> bad[] = {
      {Indices({0, 2, 4}).substr(1), "expected 4 per index"},
      {Indices({2, 0, 4}), "sparse index 1 is 0"},
      {Indices({0, 2, 2}), "sparse index 2 is 2"},
      {Indices({0, 2, 5}), "stay below the count 5"},
  };
  for (const auto& [indices, message] : bad) {
    slice.set_indices(indices);
    absl::Status status = ValidateTensorSlice(slice, 12, 10, 5, "x");
    EXPECT_NE(std::string(status.message()).find(message), std::string::npos) << status;
  }
}

TEST(TensorWire, SparseSliceReadsAsZerosAndItsValues) {
  const uint64_t count = 20000;  // several blocks
  const std::vector<uint32_t> indices = {0, 8191, 8192, 12345, 19999};
  const std::vector<float> values = {1.5f, -2.0f, 3.0f, 4.25f, -5.0f};
  v1::TensorSlice slice;
  slice.set_dtype(v1::FLOAT32);
  slice.set_count(count);
  slice.set_indices(Indices(indices));
  const std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  ASSERT_TRUE(ValidateTensorSlice(slice, bytes.size(), 0, count, "x").ok());
  const Payload payload = Payload::Borrow(bytes);
  const DenseView view(slice, payload);
  std::vector<float> dense(count, NAN), expected(count, 0.0f);
  for (size_t i = 0; i < indices.size(); ++i) expected[indices[i]] = values[i];
  size_t next = 0;
  view.ForEachFloatBlock(0, count, [&](size_t first, absl::Span<const float> block) {
    EXPECT_EQ(first, next);
    std::copy(block.begin(), block.end(), dense.begin() + static_cast<ptrdiff_t>(first));
    next = first + block.size();
  });
  EXPECT_EQ(next, count);
  EXPECT_EQ(dense, expected);
  // Any sub-range reads as the same elements.
  auto read = [&](uint64_t begin, uint64_t end, auto fn) { view.ForEachFloatBlock(begin, end, fn); };
  for (auto [begin, end] : std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 8192}, {8191, 8193}, {12345, 20000},
                                                                  {5000, 5000}, {100, 19000}}) {
    EXPECT_EQ(BlocksIn(read, begin, end), std::vector<float>(expected.begin() + begin, expected.begin() + end))
        << begin << ".." << end;
  }
}

// Row gradients are copied out of a shared region and checked in one pass:
// every value lands, and the first non-finite one of the copy is named.
TEST(TensorWire, CopyFiniteCopiesEveryValueAndNamesTheFirstNonFinite) {
  const size_t n = 1000;
  for (const size_t at : {size_t{0}, size_t{1}, size_t{517}, n - 1, n}) {  // n: none
    for (const float special : {INFINITY, -INFINITY, NAN}) {
      std::vector<float> from = Ramp(n);
      from[3] = 3.4e38f;  // the largest finite magnitudes
      from[4] = -3.4e38f;
      if (at < n) from[at] = special;
      if (at + 1 < n) from[at + 1] = NAN;  // only the first is named
      std::vector<float> to(n, -1.0f);
      const std::optional<size_t> found = CopyFinite(from, to.data());
      const std::string where = absl::StrCat("at ", at, " ", special);
      EXPECT_EQ(std::memcmp(from.data(), to.data(), n * sizeof(float)), 0) << where;
      if (at == n) {
        EXPECT_FALSE(found.has_value()) << where;
      } else {
        EXPECT_EQ(found, std::optional<size_t>(at)) << where;
      }
    }
  }
}

// A push's check for infinities and NaNs, in every wire type, with the
// payload split every way: the first one is found, with its position and
// value, wherever it lies (first and last element, block boundaries), and
// large finite values are not mistaken for one.
TEST(TensorWire, FindsTheFirstNonFiniteElementInEveryDtype) {
  const size_t n = 20000;  // more than two blocks
  for (v1::DType dtype : {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16}) {
    for (const size_t at : {size_t{0}, size_t{1}, size_t{8191}, size_t{8192}, n - 1, n}) {  // n: none
      for (const float special : {INFINITY, -INFINITY, NAN}) {
        std::vector<float> values = Ramp(n);
        values[7] = dtype == v1::BFLOAT16 ? 3e38f : 65504.0f;  // the largest finite magnitudes
        values[9] = dtype == v1::BFLOAT16 ? -3e38f : -65504.0f;
        if (at < n) values[at] = special;
        if (at < n && at + 1 < n) values[at + 1] = NAN;  // only the first is named
        const grpc::Slice data = EncodeValues(values, dtype);
        const std::string bytes(reinterpret_cast<const char*>(data.begin()), data.size());
        v1::TensorSlice tensor;
        tensor.set_count(n);
        tensor.set_dtype(dtype);
        for (uint32_t seed : {1u, 2u}) {
          v1::PushRequest header;
          v1::TensorSlice decoded;
          Payload payload;
          const grpc::ByteBuffer message =
              EncodeTensorMessage(header, v1::PushRequest::kGradientFieldNumber, tensor, grpc::Slice(bytes));
          ASSERT_TRUE(DecodeTensorMessage(Shattered(Flatten(message), seed), v1::PushRequest::kGradientFieldNumber,
                                          &header, &decoded, &payload)
                          .ok());
          const std::optional<DenseView::Element> found = DenseView(decoded, payload).FirstNonFinite();
          const std::string where = absl::StrCat(v1::DType_Name(dtype), " at ", at, " ", special, " seed ", seed);
          if (at == n) {
            EXPECT_FALSE(found.has_value()) << where << ": " << found->at;
            continue;
          }
          ASSERT_TRUE(found.has_value()) << where;
          EXPECT_EQ(found->at, at) << where;
          if (std::isnan(special)) {
            EXPECT_TRUE(std::isnan(found->value)) << where;
          } else {
            EXPECT_EQ(found->value, special) << where;
          }
        }
      }
    }
  }
}

TEST(TensorWire, Float16RoundsToNearestEvenAndKeepsSpecials) {
  // binary16 keeps 10 mantissa bits: one step above 1 is 2^-10; its smallest
  // subnormal is 2^-24 and its largest finite value 65504.
  const float values[] = {1.0f,      -2.5f,         -0.0f,         1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                          65504.0f,  65519.0f,      65520.0f,      0x1p-14f,        0x1p-24f,
                          0x1p-25f,  3 * 0x1p-25f,  1e-9f,         INFINITY,        -INFINITY,
                          NAN,       1e-3f};
  constexpr size_t n = sizeof(values) / sizeof(values[0]);
  uint16_t halves[n];
  ToFloat16(values, halves);
  float back[n];
  FromFloat16(halves, absl::MakeSpan(back));
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_TRUE(back[2] == 0.0f && std::signbit(back[2]));
  EXPECT_EQ(back[3], 1.0f);              // a tie: to the even neighbour, below
  EXPECT_EQ(back[4], 1.0f + 0x1p-9f);    // a tie: to the even neighbour, above
  EXPECT_EQ(back[5], 65504.0f);
  EXPECT_EQ(back[6], 65504.0f);          // below half a step beyond the largest
  EXPECT_EQ(back[7], INFINITY);          // half a step beyond: overflows
  EXPECT_EQ(back[8], 0x1p-14f);          // the smallest normal
  EXPECT_EQ(back[9], 0x1p-24f);          // the smallest subnormal
  EXPECT_EQ(back[10], 0.0f);             // a tie between 0 and it: to 0
  EXPECT_EQ(back[11], 0x1p-23f);         // a tie: to the even neighbour, above
  EXPECT_EQ(back[12], 0.0f);
  EXPECT_EQ(back[13], INFINITY);
  EXPECT_EQ(back[14], -INFINITY);
  EXPECT_TRUE(std::isnan(back[15]));
  EXPECT_NEAR(back[16], 1e-3f, 1e-3f * 0x1p-11f);  // within half a step
}

TEST(TensorWire, Float16WidensEveryValueExactly) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    float wide;
    FromFloat16(&half, absl::MakeSpan(&wide, 1));
    uint16_t again;
    ToFloat16(absl::MakeConstSpan(&wide, 1), &again);
    if (std::isnan(wide)) {
      EXPECT_EQ(again & 0x7c00, 0x7c00) << h;
      EXPECT_NE(again & 0x3ff, 0) << h;
    } else {
      ASSERT_EQ(again, half) << "0x" << std::hex << h << " widened to " << wide;
    }
  }
}

TEST(TensorWire, Bfloat16RoundsToNearestEvenAndKeepsSpecials) {
  // bfloat16 keeps 7 mantissa bits: one step above 1 is 1/128.
  const float values[] = {1.0f,          -2.5f,    0.0f,     1.0f + 1.0f / 256, 1.0f + 3.0f / 256,
                          1.0f + 3.0f / 512, 1.0f + 1.0f / 512, INFINITY, NAN,     3.4e38f};
  constexpr size_t n = sizeof(values) / sizeof(values[0]);
  uint16_t halves[n];
  ToBfloat16(values, halves);
  float back[n];
  FromBfloat16(halves, absl::MakeSpan(back));
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_EQ(back[2], 0.0f);
  EXPECT_EQ(back[3], 1.0f);               // a tie: to the even neighbour, below
  EXPECT_EQ(back[4], 1.0f + 2.0f / 128);  // a tie: to the even neighbour, above
  EXPECT_EQ(back[5], 1.0f + 1.0f / 128);  // above half a step: up
  EXPECT_EQ(back[6], 1.0f);               // below half a step: down
  EXPECT_EQ(back[7], INFINITY);
  EXPECT_TRUE(std::isnan(back[8]));
  EXPECT_TRUE(std::isinf(back[9]));  // beyond bfloat16's largest finite value
}

TEST(TensorWire, Float16ConversionsAgreeWithThePortableCode) {
  std::mt19937 rng(3);
  std::vector<float> values(100003);  // not a multiple of 8: a tail
  for (float& v : values) {
    const uint32_t bits = rng();
    std::memcpy(&v, &bits, sizeof(v));
    if (rng() % 2 == 0) v = std::ldexp(static_cast<float>(bits % 100000) / 100000.0f, static_cast<int>(rng() % 48) - 30);
  }
  std::vector<uint16_t> fast(values.size()), portable(values.size());
  ToFloat16(values, fast.data());
  internal::ToFloat16Portable(values, portable.data());
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) continue;  // NaN payloads may differ; both stay NaN (tested above)
    ASSERT_EQ(fast[i], portable[i]) << values[i];
  }
  std::vector<float> wide(portable.size()), wide_portable(portable.size());
  FromFloat16(portable.data(), absl::MakeSpan(wide));
  internal::FromFloat16Portable(portable.data(), absl::MakeSpan(wide_portable));
  EXPECT_EQ(0, std::memcmp(wide.data(), wide_portable.data(), wide.size() * sizeof(float)));
}

class HalfPayload : public ::testing::TestWithParam<v1::DType> {};

TEST_P(HalfPayload, SplitAnywhereWidens) {
  const v1::DType dtype = GetParam();
  std::vector<float> values = Ramp(20001);  // odd: a split element at a block's end
  std::vector<uint16_t> halves(values.size());
  std::vector<float> expected(values.size());
  if (dtype == v1::FLOAT16) {
    ToFloat16(values, halves.data());
    FromFloat16(halves.data(), absl::MakeSpan(expected));
  } else {
    ToBfloat16(values, halves.data());
    FromBfloat16(halves.data(), absl::MakeSpan(expected));
  }
  v1::PushRequest push = PlainPush({});
  push.mutable_gradient()->set_dtype(dtype);
  push.mutable_gradient()->set_count(values.size());
  push.mutable_gradient()->set_data(std::string(reinterpret_cast<const char*>(halves.data()), halves.size() * 2));
  // Shattered: elements split every way; whole: runs of a block read in place
  // or, when the data starts at an odd byte, through a copy.
  for (const grpc::ByteBuffer& buffer : {Shattered(push.SerializeAsString(), 9), Whole(push.SerializeAsString())}) {
    v1::PushRequest header;
    v1::TensorSlice tensor;
    Payload payload;
    ASSERT_TRUE(DecodeTensorMessage(buffer, v1::PushRequest::kGradientFieldNumber, &header, &tensor, &payload).ok());
    EXPECT_EQ(Blocks(payload, values.size(), dtype), expected);
    std::vector<float> copied(values.size());
    payload.CopyTo(dtype, absl::MakeSpan(copied));
    EXPECT_EQ(copied, expected);
    // Parts of the payload, as an update split over threads reads them.
    auto read = [&](size_t begin, size_t end, auto fn) { payload.ForEachFloatBlock(dtype, begin, end, fn); };
    for (auto [begin, end] : std::vector<std::pair<size_t, size_t>>{{0, 7}, {7, 8200}, {8191, 16385}, {19999, 20001},
                                                                    {300, 300}}) {
      EXPECT_EQ(BlocksIn(read, begin, end), std::vector<float>(expected.begin() + begin, expected.begin() + end))
          << begin << ".." << end;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfPayload, ::testing::Values(v1::BFLOAT16, v1::FLOAT16),
                         [](const auto& info) { return v1::DType_Name(info.param); });

// The largest magnitude, whatever the sign; infinity and NaN above every
// finite value (the optimizer's bounds then refuse rather than overflow).
TEST(TensorWire, MaxMagnitudeIsTheLargestAbsoluteValue) {
  EXPECT_EQ(MaxMagnitude({}), 0.0f);
  EXPECT_EQ(MaxMagnitude(std::vector<float>{0.5f, -3.0f, 2.0f, -0.0f}), 3.0f);
  std::vector<float> many(1000, 1.0f);
  many[777] = -1e30f;
  EXPECT_EQ(MaxMagnitude(many), 1e30f);
  many[3] = -INFINITY;
  EXPECT_TRUE(std::isinf(MaxMagnitude(many)));
  many[5] = NAN;
  EXPECT_FALSE(MaxMagnitude(many) <= std::numeric_limits<float>::max());
}

}  // namespace
}  // namespace segps
