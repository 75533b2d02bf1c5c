// The run's history on disk: each rank 0's test-set probabilities are kept
// from the first epoch it scored, and the ensemble's history has exactly
// the epochs every segment's rank 0 scored, each under its own number.
#include "worker/train/run_history.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/subprocess.h"

namespace segps {
namespace {

// Probabilities [4 rows x 2 classes] whose argmax is `labels`.
std::vector<float> Predicting(const std::vector<int>& labels) {
  std::vector<float> p;
  for (int label : labels) {
    p.push_back(label == 0 ? 0.9f : 0.1f);
    p.push_back(label == 0 ? 0.1f : 0.9f);
  }
  return p;
}

class RunHistoryTest : public ::testing::Test {
 protected:
  RunHistoryTest() {
    config_.mutable_model()->set_num_classes(2);
    for (const char* name : {"a", "b"}) {
      v1::SegmentConfig* segment = config_.mutable_model()->add_segments();
      segment->set_name(name);
      segment->set_workers(1);
    }
    test_.width = 1;
    test_.classes = 2;
    test_.x.assign(4, 0.0f);
    test_.y = {0, 1, 0, 1};
  }

  void Write(const std::string& segment, uint32_t first, const std::vector<std::vector<float>>& probs) {
    v1::WorkerHistory history;
    history.set_segment(segment);
    history.set_rank(0);
    history.set_first_scored_epoch(first);
    for (uint32_t e = first; e < first + probs.size(); ++e) history.add_epochs()->set_epoch(e);
    ASSERT_TRUE(WriteHistory(dir_, history, probs, 2).ok());
  }

  const std::string dir_ = MakeTempDir();
  v1::JobConfig config_;
  Dataset test_;
};

// Segment a scored epochs 1-3; b's rank 0 started again during epoch 2 and
// scored epochs 2-3. The ensemble has epochs 2 (all right) and 3 (half
// right), never a's epoch 1 beside b's epoch 2.
TEST_F(RunHistoryTest, TheEnsembleHasTheEpochsEverySegmentScoredUnderTheirNumbers) {
  const std::vector<float> right = Predicting({0, 1, 0, 1}), wrong = Predicting({1, 0, 1, 0}),
                           half = Predicting({0, 1, 1, 0});
  Write("a", 1, {wrong, right, half});
  Write("b", 2, {right, half});
  absl::StatusOr<v1::RunHistory> history = ReadHistory(dir_, config_, test_);
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ(history->workers_size(), 2);
  ASSERT_EQ(history->ensemble_size(), 2) << history->DebugString();
  EXPECT_EQ(history->ensemble(0).epoch(), 2u);
  EXPECT_DOUBLE_EQ(history->ensemble(0).test_accuracy(), 1.0);
  EXPECT_EQ(history->ensemble(1).epoch(), 3u);
  EXPECT_DOUBLE_EQ(history->ensemble(1).test_accuracy(), 0.5);
}

// A segment whose rank 0 left no history: no ensemble history, and the
// other segment's probabilities are not read past their end.
TEST_F(RunHistoryTest, ASegmentWithoutItsRankZerosHistoryLeavesTheEnsembleWithout) {
  Write("a", 1, {Predicting({0, 1, 0, 1})});
  absl::StatusOr<v1::RunHistory> history = ReadHistory(dir_, config_, test_);
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ(history->workers_size(), 1);
  EXPECT_EQ(history->ensemble_size(), 0);
}

}  // namespace
}  // namespace segps
