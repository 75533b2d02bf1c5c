#include "common/balance.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

namespace segps {
namespace {

uint64_t Sum(const std::vector<uint32_t>& v) { return std::accumulate(v.begin(), v.end(), uint64_t{0}); }

TEST(Balance, SharesMoveHalfwayToTheirThroughputAndKeepTheirTotal) {
  std::optional<std::vector<uint32_t>> next = Rebalance({32, 32, 32, 32}, {300, 300, 300, 100}, 3, 1);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(Sum(*next), 128u);
  // Targets 38.4 x 3 and 12.8: halfway, 35.2 x 3 and 22.4, in whole samples.
  EXPECT_EQ(*next, (std::vector<uint32_t>{35, 35, 35, 23}));
  // At the same throughput the shares keep closing in on the targets.
  std::vector<uint32_t> shares = *next;
  for (int i = 0; i < 8; ++i) {
    if (std::optional<std::vector<uint32_t>> again = Rebalance(shares, {300, 300, 300, 100}, 3, 1)) shares = *again;
  }
  EXPECT_EQ(Sum(shares), 128u);
  EXPECT_NEAR(shares[3], 12.8, 1.5);  // whole samples: halving stops within a sample or so
}

TEST(Balance, ALeastShareHoldsAndTheRestSplitsByThroughput) {
  std::vector<uint32_t> shares = {32, 32};
  for (int i = 0; i < 10; ++i) {
    if (std::optional<std::vector<uint32_t>> next = Rebalance(shares, {1000, 1}, 6, 1)) shares = *next;
  }
  EXPECT_EQ(shares, (std::vector<uint32_t>{58, 6}));
}

TEST(Balance, SmallMovesAndUnmeasuredRanksChangeNothing) {
  EXPECT_FALSE(Rebalance({32, 32}, {100, 110}, 3, 2).has_value());  // targets 30.5 / 33.5: 1.5 samples away
  EXPECT_FALSE(Rebalance({32, 32}, {100, 0}, 3, 1).has_value());    // only one rank measured
  // An unmeasured rank keeps its share; the measured ones split theirs.
  const std::optional<std::vector<uint32_t>> next = Rebalance({32, 32, 32}, {100, 0, 300}, 3, 1);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, (std::vector<uint32_t>{24, 32, 40}));  // targets 16 and 48
}

TEST(Balance, SharesTileAClockAndAShortLastClock) {
  const std::vector<uint32_t> shares = {40, 13, 11};  // 64 a clock
  for (uint64_t samples : {64u, 63u, 17u, 2u, 1u}) {
    uint64_t at = 0;
    for (uint32_t r = 0; r < shares.size(); ++r) {
      const Range part = ShareOf(shares, r, samples);
      EXPECT_EQ(part.offset, at) << samples << " samples, rank " << r;
      at = part.end();
    }
    EXPECT_EQ(at, samples);
  }
  EXPECT_EQ(ShareOf(shares, 1, 64).count, 13u);
}

// Whatever the shares of each clock, the ranks' parts of an epoch's clocks
// cover each of its samples exactly once.
TEST(Balance, AnEpochWithShiftingSharesCoversEverySampleOnce) {
  const uint64_t n = 1000, per_clock = 96;  // 3 workers of batch 32; the last clock has 40
  std::mt19937 rng(7);
  std::vector<int> seen(n, 0);
  std::vector<uint32_t> shares = {32, 32, 32};
  for (uint64_t begin = 0; begin < n; begin += per_clock) {
    std::vector<double> speed = {1.0 + rng() % 5, 1.0 + rng() % 5, 1.0 + rng() % 5};
    if (std::optional<std::vector<uint32_t>> next = Rebalance(shares, speed, 3, 1)) shares = *next;
    ASSERT_EQ(Sum(shares), per_clock);
    const uint64_t samples = std::min(per_clock, n - begin);
    for (uint32_t r = 0; r < 3; ++r) {
      const Range part = ShareOf(shares, r, samples);
      for (uint64_t i = part.offset; i < part.end(); ++i) seen[begin + i] += 1;
    }
  }
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "sample " << i;
}

TEST(Balance, AReplyReplacesWhatAWorkerKnewFromItsFirstClockOn) {
  v1::SharePlan known;
  auto add = [](v1::SharePlan* plan, uint64_t from, std::vector<uint32_t> samples) {
    v1::Shares* entry = plan->add_shares();
    entry->set_from_clock(from);
    for (uint32_t s : samples) entry->add_samples(s);
  };
  add(&known, 0, {32, 32});
  add(&known, 40, {40, 24});
  known.set_final_through(45);
  v1::SharePlan reply;  // after a rollback to clock 30, server 0 decided again
  add(&reply, 0, {32, 32});
  add(&reply, 36, {36, 28});
  reply.set_final_through(37);
  MergePlan(reply, &known);
  ASSERT_EQ(known.shares_size(), 2);
  EXPECT_EQ(SharesAt(known, 39)->samples(0), 36u);
  EXPECT_EQ(SharesAt(known, 35)->samples(0), 32u);
  EXPECT_EQ(known.final_through(), 45u);
  EXPECT_EQ(SharesAt(v1::SharePlan(), 3), nullptr);
}

}  // namespace
}  // namespace segps
