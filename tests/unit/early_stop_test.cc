// EarlyStop: when a segment's rank 0 stops, and which epoch it keeps.
#include "worker/train/early_stop.h"

#include <gtest/gtest.h>

namespace segps {
namespace {

v1::EarlyStopping Patience(uint32_t patience, float min_delta = 0) {
  v1::EarlyStopping config;
  config.set_patience(patience);
  config.set_min_delta(min_delta);
  return config;
}

TEST(EarlyStop, StopsOncePatienceEpochsPassWithoutABetterLoss) {
  EarlyStop stop(Patience(2));
  EXPECT_FALSE(stop.Observe(1, 0.9));
  EXPECT_FALSE(stop.Observe(2, 0.5));
  EXPECT_FALSE(stop.Observe(3, 0.6));  // one epoch without improvement
  EXPECT_FALSE(stop.Observe(4, 0.45));  // a new best: the count starts again
  EXPECT_FALSE(stop.Observe(5, 0.45));  // equal is no improvement
  EXPECT_TRUE(stop.Observe(6, 0.47));
  EXPECT_EQ(stop.best_epoch(), 4u);
  EXPECT_DOUBLE_EQ(stop.best_loss(), 0.45);
}

TEST(EarlyStop, AFallOfAtMostMinDeltaIsNoImprovement) {
  EarlyStop stop(Patience(1, 0.05f));
  EXPECT_FALSE(stop.Observe(1, 1.0));
  EXPECT_FALSE(stop.Observe(2, 0.9));  // fell by 0.1: better
  EXPECT_TRUE(stop.Observe(3, 0.86));  // fell by 0.04 only
  EXPECT_EQ(stop.best_epoch(), 2u);
}

// A rollback computes epochs again: their new scores replace the old, and
// the later ones are forgotten.
TEST(EarlyStop, AnEpochScoredAgainReplacesItsScoreAndForgetsTheLaterOnes) {
  EarlyStop stop(Patience(2));
  EXPECT_FALSE(stop.Observe(1, 0.5));
  EXPECT_FALSE(stop.Observe(2, 0.6));
  EXPECT_FALSE(stop.Observe(2, 0.4));  // again, better this time
  EXPECT_EQ(stop.best_epoch(), 2u);
  EXPECT_FALSE(stop.Observe(3, 0.41));
  EXPECT_TRUE(stop.Observe(4, 0.42));
  EXPECT_EQ(stop.best_epoch(), 2u);
}

}  // namespace
}  // namespace segps
