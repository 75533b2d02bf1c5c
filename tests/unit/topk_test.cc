#include "worker/client/topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace segps {
namespace {

TEST(TopK, SendsTheLargestMagnitudesInPositionOrder) {
  TopK topk(6, 0.5);
  ASSERT_EQ(topk.k(), 3u);
  const std::vector<float> grad = {0.1f, -5.0f, 0.2f, 3.0f, -0.3f, 4.0f};
  topk.Select(grad);
  EXPECT_EQ(std::vector<uint64_t>(topk.indices().begin(), topk.indices().end()), (std::vector<uint64_t>{1, 3, 5}));
  EXPECT_EQ(std::vector<float>(topk.values().begin(), topk.values().end()), (std::vector<float>{-5.0f, 3.0f, 4.0f}));
  EXPECT_EQ(std::vector<float>(topk.residual().begin(), topk.residual().end()),
            (std::vector<float>{0.1f, 0.0f, 0.2f, 0.0f, -0.3f, 0.0f}));
}

TEST(TopK, WhatWasLeftOutTravelsLater) {
  TopK topk(4, 0.25);  // one entry a step
  topk.Select(std::vector<float>{1.0f, 0.9f, 0.0f, 0.0f});
  EXPECT_EQ(topk.indices()[0], 0u);
  topk.Select(std::vector<float>{0.5f, 0.0f, 0.0f, 0.0f});  // 0.9 left over beats the new 0.5
  EXPECT_EQ(topk.indices()[0], 1u);
  EXPECT_FLOAT_EQ(topk.values()[0], 0.9f);
}

TEST(TopK, ErrorFeedbackLosesNothing) {
  const size_t n = 1000;
  TopK topk(n, 0.03);
  EXPECT_EQ(topk.k(), 30u);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> draw(-64, 64);
  std::vector<double> pushed(n, 0.0), total(n, 0.0);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> grad(n);
    for (size_t i = 0; i < n; ++i) total[i] += grad[i] = draw(rng) / 8.0f;  // exact in float
    topk.Select(grad);
    ASSERT_EQ(topk.indices().size(), topk.k());
    for (size_t e = 0; e < topk.k(); ++e) {
      if (e > 0) {
        ASSERT_LT(topk.indices()[e - 1], topk.indices()[e]);
      }
      pushed[topk.indices()[e]] += topk.values()[e];
    }
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(pushed[i] + topk.residual()[i], total[i]) << i;
}

// The k largest magnitudes, ties by lowest position, ascending: by sorting.
std::vector<uint64_t> Largest(const std::vector<float>& v, size_t k) {
  std::vector<uint64_t> order(v.size());
  for (size_t i = 0; i < v.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

TEST(TopK, LargeGradientsSelectExactlyTheLargest) {
  const size_t n = 100000;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> random(n), comb(n);
  for (size_t i = 0; i < n; ++i) {
    random[i] = normal(rng);
    // Large exactly where a strided sample looks, small elsewhere: the
    // sample's threshold lets too few through and the selection falls back.
    comb[i] = (i % (n / 4096) == 0) ? 100.0f + static_cast<float>(i % 7) : 0.001f * static_cast<float>(i % 13);
  }
  for (double fraction : {0.001, 0.01, 0.1}) {
    for (const std::vector<float>* grad : {&random, &comb}) {
      TopK topk(n, fraction);
      topk.Select(*grad);
      EXPECT_EQ(std::vector<uint64_t>(topk.indices().begin(), topk.indices().end()), Largest(*grad, topk.k()))
          << "fraction " << fraction << (grad == &comb ? " comb" : " random");
    }
  }
}

TEST(TopK, TiesFillFromTheLowestPositions) {
  TopK topk(5, 0.4);
  topk.Select(std::vector<float>{1.0f, -1.0f, 1.0f, 1.0f, 0.5f});
  EXPECT_EQ(std::vector<uint64_t>(topk.indices().begin(), topk.indices().end()), (std::vector<uint64_t>{0, 1}));
}

TEST(TopK, NonFiniteEntriesTravel) {
  TopK topk(4, 0.25);
  topk.Select(std::vector<float>{1.0f, NAN, 2.0f, 0.0f});
  ASSERT_EQ(topk.indices().size(), 1u);
  EXPECT_EQ(topk.indices()[0], 1u);
  EXPECT_TRUE(std::isnan(topk.values()[0]));
}

TEST(TopK, SendsAtLeastOneEntry) {
  TopK topk(10, 0.001);
  EXPECT_EQ(topk.k(), 1u);
}

}  // namespace
}  // namespace segps
