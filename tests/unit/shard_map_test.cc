#include "common/shard_map.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace segps
