// Load balancing (training.balance) on separate-process clusters: fixed
// unequal shares give exactly the single-process steps, and a worker slowed
// by --slowdown_factor gets a share that follows its throughput.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "tests/support/reference_training.h"
#include "tests/support/subprocess.h"
#include "worker/data/dataset.h"

namespace segps {
namespace {

std::string WriteJob(const std::string& dir, int hidden, const std::string& optimizer, const std::string& training,
                     int train_samples) {
  const std::string path = dir + "/job.pbtxt";
  WriteFile(path, absl::StrCat(R"pb(
    cluster { num_servers: 2 lease_ms: 5000 }
    model {
      input_width: 50
      num_classes: 10
      segments { name: "s" layers { units: )pb", hidden, R"pb( activation: RELU } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { )pb", optimizer, R"pb( }
    training { log_interval_s: 0.1 workers_per_segment: 2 )pb", training, R"pb( }
    data { source: SYNTHETIC_TEACHER test_samples: 5000 train_samples: )pb", train_samples, " }\n"));
  return path;
}

struct LocalRun {
  bool ok = false;
  std::string output;
  std::string report;
};

LocalRun RunLocal(const std::vector<std::string>& extra, const std::string& config, const std::string& dir) {
  // --verbose: the tests read the workers' registrations and shares.
  std::vector<std::string> args = {BinaryPath("segps-local"), "--config", config, "--report", dir + "/report.json",
                                   "--params_dir", dir, "--verbose"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::unique_ptr<Subprocess> p = Subprocess::Start(args);
  std::optional<int> status = p->Wait(absl::Minutes(5));
  return {status.has_value() && ExitedOk(*status), p->output(), ReadFile(dir + "/report.json")};
}

// Per worker of a one-segment job (rank order), the mean over its last
// `epochs` epoch records in the report of its share and compute throughput.
std::vector<std::pair<double, double>> LastShares(const std::string& report, int epochs_per_worker, int last) {
  const std::regex re("\"mean_share\":([0-9.eE+-]+),\"compute_samples_per_second\":([0-9.eE+-]+)");
  std::vector<std::pair<double, double>> records;
  for (auto it = std::sregex_iterator(report.begin(), report.end(), re); it != std::sregex_iterator(); ++it) {
    records.push_back({std::stod((*it)[1]), std::stod((*it)[2])});
  }
  std::vector<std::pair<double, double>> workers;
  for (size_t first = 0; first + epochs_per_worker <= records.size(); first += epochs_per_worker) {
    std::pair<double, double> mean = {0, 0};
    for (int e = epochs_per_worker - last; e < epochs_per_worker; ++e) {
      mean.first += records[first + e].first / last;
      mean.second += records[first + e].second / last;
    }
    workers.push_back(mean);
  }
  return workers;
}

// Staleness 0, SGD: whatever the shares, a clock's weighted pushes add up to
// one step on the clock's whole batch. 2000 samples in clocks of 64: the
// last clock's 16 are cut 11 / 5.
TEST(Balance, FixedUnequalSharesAtStaleness0GiveTheSingleProcessSteps) {
  const std::string dir = MakeTempDir();
  const std::string config = WriteJob(dir, 32, "kind: SGD learning_rate: 0.05",
                                      "batch_size: 32 epochs: 2 staleness: 0 "
                                      "balance { every_clocks: 0 shares: 44 shares: 20 }",
                                      2000);
  LocalRun run = RunLocal({}, config, dir);
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_NE(run.output.find("s/0: registered at clock 0"), std::string::npos) << run.output;
  const v1::JobConfig job = *LoadConfig(config);
  const std::vector<float> reference = TrainBalancedReference(job, LoadData(job)->train)[0];
  const std::vector<float> trained = ReadNpyFloat32(dir + "/s.npy");
  ASSERT_EQ(trained.size(), reference.size());
  EXPECT_LT(MaxRelativeError(trained, reference), 1e-5);
  // The shares held: 44 and 20 of each full clock, 11 and 5 of the last
  // one's 16, so 1375 and 625 of an epoch's 32 clocks.
  const std::vector<std::pair<double, double>> workers = LastShares(run.report, 2, 2);
  ASSERT_EQ(workers.size(), 2u) << run.report;
  EXPECT_DOUBLE_EQ(workers[0].first, 1375.0 / 32);
  EXPECT_DOUBLE_EQ(workers[1].first, 625.0 / 32);
}

// One of two workers 3x slower: its share falls to follow its throughput
// (the ratio of the shares within 20% of the ratio of the throughputs, as
// the report records them), and the job still reaches the teacher bar.
TEST(Balance, ASlowerWorkersShareFollowsItsThroughputAndTheJobReachesTheBar) {
  const std::string dir = MakeTempDir();
  // Wide enough that a step's compute (milliseconds) outweighs the error of
  // the sleeps that stretch it.
  const std::string config = WriteJob(dir, 512, "kind: ADAM learning_rate: 0.001",
                                      "batch_size: 256 epochs: 8 staleness: 2 balance { every_clocks: 10 }", 30000);
  LocalRun run = RunLocal({"--straggler_factor", "3"}, config, dir);
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_NE(run.output.find("segment 0: shares from clock"), std::string::npos) << run.output;
  // Over the last 4 of 8 epochs (each decision moves a share halfway).
  const std::vector<std::pair<double, double>> workers = LastShares(run.report, 8, 4);
  ASSERT_EQ(workers.size(), 2u) << run.report;
  const auto [fast_share, fast_rate] = workers[0];
  const auto [slow_share, slow_rate] = workers[1];
  EXPECT_LT(slow_share, 256 * 0.8) << "the slower worker's share did not fall";
  const double shares = slow_share / fast_share, speeds = slow_rate / fast_rate;
  std::printf("shares %.1f / %.1f, throughput %.0f / %.0f samples/s: ratio of ratios %.3f\n", slow_share, fast_share,
              slow_rate, fast_rate, shares / speeds);
  EXPECT_NEAR(shares / speeds, 1.0, 0.2) << "shares " << slow_share << " / " << fast_share << ", throughput "
                                          << slow_rate << " / " << fast_rate;
  EXPECT_GT(EnsembleAccuracy(run.report), 0.90) << run.report;
}

}  // namespace
}  // namespace segps
