// training.early_stopping on segps-local clusters of separate processes:
// a segment whose validation loss stops improving ends at its best epoch's
// parameters, exactly those of a run that trained only that far, and the
// other ranks of the segment stop with it.
#include <gtest/gtest.h>

#include <regex>

#include "absl/strings/str_cat.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

// The teacher job on 6,000 samples for 6 epochs, with a validation set,
// `workers` a segment at staleness `staleness`, and `training_extra` in
// its training block.
std::string Job(int workers, int staleness, const std::string& training_extra) {
  return absl::StrCat(R"pb(
    name: "early"
    seed: 7
    cluster { num_servers: 2 lease_ms: 10000 }
    model {
      input_width: 50
      num_classes: 10
      segments {
        name: "relu64"
        layers { units: 64 activation: RELU }
        layers { units: 10 activation: SOFTMAX }
      }
      segments {
        name: "tanh128"
        layers { units: 128 activation: TANH }
        layers { units: 10 activation: SOFTMAX }
      }
    }
    optimizer { kind: ADAM learning_rate: 0.003 }
    training { batch_size: 64 staleness: )pb",
                      staleness, " workers_per_segment: ", workers, " ", training_extra, R"pb( }
    data {
      source: SYNTHETIC_TEACHER
      data_seed: 1
      train_samples: 6000
      test_samples: 1000
      teacher_hidden: 32
      validation_fraction: 0.1
      split: SAME
    }
  )pb");
}

struct LocalRun {
  std::string output, report, dir;
};

LocalRun Local(const std::string& job) {
  LocalRun run;
  run.dir = MakeTempDir();
  WriteFile(run.dir + "/job.pbtxt", job);
  std::unique_ptr<Subprocess> p =
      Subprocess::Start({BinaryPath("segps-local"), "--config", run.dir + "/job.pbtxt", "--report",
                         run.dir + "/report.json", "--params_dir", run.dir, "--verbose"});
  const std::optional<int> status = p->Wait(absl::Minutes(3));
  run.output = p->output();
  EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << run.output;
  run.report = ReadFile(run.dir + "/report.json");
  return run;
}

// A min_delta no loss can fall by: epoch 1 stays the best, and with a
// patience of 2 the segments stop after epoch 3 at epoch 1's parameters,
// byte for byte those of a run of 1 epoch (one worker a segment at
// staleness 0: the same steps in the same order).
TEST(EarlyStopping, ASegmentEndsAtItsBestEpochsParametersExactly) {
  const LocalRun stopped = Local(Job(1, 0, "epochs: 6 early_stopping { patience: 2 min_delta: 100 }"));
  const LocalRun one_epoch = Local(Job(1, 0, "epochs: 1"));
  for (const std::string segment : {"relu64", "tanh128"}) {
    SCOPED_TRACE(segment);
    EXPECT_NE(stopped.output.find(segment + "/0: stopped early after epoch 3: the validation loss has not fallen by "
                                            "more than 100 for 2 epochs; the segment ends at epoch 1's parameters"),
              std::string::npos)
        << stopped.output;
    EXPECT_EQ(stopped.output.find(segment + "/0: epoch 4 "), std::string::npos) << "trained past the stop";
    const std::string params = ReadFile(stopped.dir + "/" + segment + ".npy");
    ASSERT_GT(params.size(), 1000u);
    EXPECT_TRUE(params == ReadFile(one_epoch.dir + "/" + segment + ".npy")) << "not epoch 1's parameters";
  }
  EXPECT_NE(stopped.report.find("\"best_epoch\":1"), std::string::npos) << stopped.report;
  EXPECT_NE(stopped.output.find("stopped early at its checkpoint of clock"), std::string::npos) << stopped.output;
}

// Two workers a segment at staleness 2: rank 0 decides, rank 1 is told by
// the servers and stops too; every process exits 0 and the segments end at
// epoch 2 (patience 1 after it).
TEST(EarlyStopping, TheOtherRanksOfTheSegmentStopWithItsRankZero) {
  const LocalRun stopped = Local(Job(2, 2, "epochs: 6 early_stopping { patience: 1 min_delta: 100 }"));
  for (const std::string segment : {"relu64", "tanh128"}) {
    SCOPED_TRACE(segment);
    EXPECT_NE(stopped.output.find(segment + "/0: stopped early after epoch 2"), std::string::npos) << stopped.output;
    EXPECT_NE(stopped.output.find(segment + "/1: its segment stopped early (its rank 0 ended it at the best epoch's "
                                            "checkpoint), so it stops too"),
              std::string::npos)
        << stopped.output;
  }
  std::smatch m;
  EXPECT_TRUE(std::regex_search(stopped.output, m, std::regex("ENSEMBLE.* accuracy *([0-9.]+)%"))) << stopped.output;
}

}  // namespace
}  // namespace segps
