#include "common/shard_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace segps {
namespace {

v1::ModelConfig Model(std::vector<std::vector<uint32_t>> segments, uint32_t input = 50) {
  v1::ModelConfig m;
  m.set_input_width(input);
  m.set_num_classes(10);
  int k = 0;
  for (const auto& units : segments) {
    auto* s = m.add_segments();
    s->set_name("s" + std::to_string(k++));
    for (uint32_t u : units) {
      auto* l = s->add_layers();
      l->set_units(u);
      l->set_activation(v1::RELU);
    }
  }
  return m;
}

TEST(ShardMap, SeedModelHas3914ParametersPerSegment) {
  ShardMap map = *ShardMap::Create(Model({{64, 10}, {64, 10}}), 2);
  EXPECT_EQ(map.segment_size(0), 3914u);
  EXPECT_EQ(map.range(0, 0).count, 1957u);
  EXPECT_EQ(map.range(0, 1).offset, 1957u);
  ASSERT_EQ(map.tensors(0).size(), 4u);
  EXPECT_EQ(map.tensors(0)[1].offset, 3200u);  // first bias after the 50x64 kernel
}

TEST(BalancedRange, CoversWithoutOverlapAndBalances) {
  for (uint64_t n : {0ull, 1ull, 2ull, 7ull, 100ull, 3914ull, 1000003ull}) {
    for (uint32_t parts = 1; parts <= 17; ++parts) {
      uint64_t next = 0;
      const uint64_t ceil = (n + parts - 1) / parts;
      for (uint32_t i = 0; i < parts; ++i) {
        Range r = BalancedRange(n, parts, i);
        EXPECT_EQ(r.offset, next) << n << "/" << parts << "#" << i;
        EXPECT_LE(r.count, ceil);
        EXPECT_GE(r.count + 1, ceil ? ceil : 1);  // never more than one element below the max
        next = r.end();
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(ShardMap, DeterministicAndFingerprinted) {
  const v1::ModelConfig model = Model({{64, 10}, {128, 32, 10}});
  ShardMap a = *ShardMap::Create(model, 3), b = *ShardMap::Create(model, 3);
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  for (int k = 0; k < 2; ++k) {
    for (uint32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(a.range(k, i).offset, b.range(k, i).offset);
      EXPECT_EQ(a.range(k, i).count, b.range(k, i).count);
    }
  }
  EXPECT_NE(a.fingerprint(), ShardMap::Create(model, 4)->fingerprint());
  EXPECT_NE(a.fingerprint(), ShardMap::Create(Model({{64, 10}, {128, 33, 10}}), 3)->fingerprint());
}

TEST(ShardMap, ZeroServersIsAnError) {
  EXPECT_FALSE(ShardMap::Create(Model({{10}}), 0).ok());
}

TEST(InitializeRange, SameModelWhateverTheServerCount) {
  const v1::ModelConfig model = Model({{64, 10}, {33, 7, 10}});
  ShardMap one = *ShardMap::Create(model, 1);
  for (int k = 0; k < 2; ++k) {
    std::vector<float> whole(one.segment_size(k));
    InitializeRange(one, k, 0, 42, whole.data(), whole.size());
    for (uint32_t servers : {2u, 3u, 5u, 64u}) {
      ShardMap map = *ShardMap::Create(model, servers);
      std::vector<float> stitched(map.segment_size(k));
      for (uint32_t i = 0; i < servers; ++i) {
        Range r = map.range(k, i);
        InitializeRange(map, k, r.offset, 42, stitched.data() + r.offset, r.count);
      }
      EXPECT_EQ(whole, stitched) << "segment " << k << " servers " << servers;
    }
  }
}

TEST(InitializeRange, GlorotUniformKernelsAndZeroBiases) {
  ShardMap map = *ShardMap::Create(Model({{64, 10}}), 1);
  std::vector<float> w(map.segment_size(0));
  InitializeRange(map, 0, 0, 7, w.data(), w.size());
  const double limit = std::sqrt(6.0 / (50 + 64));
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < 50 * 64; ++i) {
    ASSERT_LE(std::abs(w[i]), limit);
    sum += w[i];
    sum_sq += w[i] * w[i];
  }
  const double n = 50 * 64;
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(sum_sq / n, limit * limit / 3, 0.01);  // variance of U(-l, l)
  for (int i = 3200; i < 3264; ++i) EXPECT_EQ(w[i], 0.0f);
  std::vector<float> other(w.size());
  InitializeRange(map, 0, 0, 8, other.data(), other.size());
  EXPECT_NE(w, other);  // the seed matters
}

// A segment declared by its tensors: laid out in order, row-major, named
// and shaped as declared, and initialised as each tensor says.
TEST(ShardMap, DeclaredTensorsAreLaidOutNamedAndInitialisedAsDeclared) {
  v1::ModelConfig model;
  v1::SegmentConfig* segment = model.add_segments();
  segment->set_name("cnn");
  v1::TensorConfig* weight = segment->add_tensors();
  weight->set_name("0.weight");
  for (uint64_t d : {4, 1, 3, 3}) weight->add_shape(d);
  v1::TensorConfig* bias = segment->add_tensors();
  bias->set_name("0.bias");
  bias->add_shape(4);
  bias->set_uniform(0.25f);
  v1::TensorConfig* scale = segment->add_tensors();
  scale->set_name("1.weight");
  scale->add_shape(4);
  scale->set_constant(1.0f);
  ShardMap map = *ShardMap::Create(model, 3);
  ASSERT_EQ(map.segment_size(0), 36u + 4 + 4);
  ASSERT_EQ(map.tensors(0).size(), 3u);
  EXPECT_EQ(TensorName(model, 0, map.tensors(0)[0]), "cnn/0.weight");
  EXPECT_EQ(TensorShape(map.tensors(0)[0]), (std::vector<uint64_t>{4, 1, 3, 3}));
  EXPECT_EQ(map.tensors(0)[1].offset, 36u);
  EXPECT_EQ(map.tensors(0)[2].offset, 40u);
  std::vector<float> values(map.segment_size(0));
  for (uint32_t i = 0; i < 3; ++i) {
    const Range r = map.range(0, i);
    InitializeRange(map, 0, r.offset, 42, values.data() + r.offset, r.count);
  }
  const double fan_in_bound = 1 / std::sqrt(9.0);  // PyTorch's default: 1/sqrt(in x kernel)
  double largest = 0;
  for (int i = 0; i < 36; ++i) largest = std::max(largest, std::abs(static_cast<double>(values[i])));
  EXPECT_LE(largest, fan_in_bound);
  EXPECT_GT(largest, 0.8 * fan_in_bound);
  for (int i = 36; i < 40; ++i) EXPECT_LE(std::abs(values[i]), 0.25f);
  for (int i = 40; i < 44; ++i) EXPECT_EQ(values[i], 1.0f);
}

}  // namespace
}  // namespace segps
