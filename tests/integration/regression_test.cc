// model.loss MSE end to end with separate processes: a regression task,
// written as .npy files and as CSV, trains through segps-local to an RMSE
// well below the baseline of predicting the mean; its export, run by
// segps-predict, writes one prediction a line, those segps-eval scored.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/support/subprocess.h"
#include "worker/data/dataset.h"
#include "worker/data/npy.h"

namespace segps {
namespace {

constexpr int kWidth = 8;

// y = a linear map of x plus sin(2 x0) and a little noise, x standard
// normal: `rows` of them from `seed`, as dir/NAME_x.npy and NAME_y.npy and
// as dir/NAME.csv (columns f0..f7, target).
void WriteTask(const std::string& dir, const std::string& name, size_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * kWidth), y(rows);
  std::FILE* csv = std::fopen((dir + "/" + name + ".csv").c_str(), "w");
  ASSERT_NE(csv, nullptr);
  std::fprintf(csv, "f0,f1,f2,f3,f4,f5,f6,f7,target\n");
  for (size_t i = 0; i < rows; ++i) {
    float target = 0;
    for (int j = 0; j < kWidth; ++j) {
      x[i * kWidth + j] = normal(rng);
      target += (-1.0f + 2.0f * j / (kWidth - 1)) * x[i * kWidth + j];
      std::fprintf(csv, "%.9g,", x[i * kWidth + j]);
    }
    y[i] = target + std::sin(2 * x[i * kWidth]) + 0.1f * normal(rng);
    std::fprintf(csv, "%.9g\n", y[i]);
  }
  std::fclose(csv);
  ASSERT_TRUE(WriteNpyFloat32(dir + "/" + name + "_x.npy", x.data(), {rows, kWidth}).ok());
  ASSERT_TRUE(WriteNpyFloat32(dir + "/" + name + "_y.npy", y.data(), {rows}).ok());
}

std::string Job(const std::string& data) {
  return absl::StrCat(R"pb(
    name: "regression"
    seed: 1
    cluster { num_servers: 2 }
    model {
      input_width: 8
      num_classes: 1
      loss: MSE
      segments { name: "tanh32" layers { units: 32 activation: TANH } layers { units: 1 activation: IDENTITY } }
      segments { name: "relu64" layers { units: 64 activation: RELU } layers { units: 1 activation: IDENTITY } }
    }
    optimizer { kind: ADAM learning_rate: 0.003 }
    training { batch_size: 64 epochs: 10 }
    data { split: SAME )pb",
                      data, " }\n");
}

// The ensemble's RMSE and the baseline's in a report.
std::pair<double, double> Rmse(const std::string& report) {
  std::smatch ensemble, baseline;
  std::regex_search(report, ensemble, std::regex("\"ensemble\": \\{[^}]*\"rmse\": ([0-9.]+)"));
  std::regex_search(report, baseline, std::regex("\"baseline_rmse\": ([0-9.]+)"));
  return {ensemble.empty() ? -1 : std::stod(ensemble[1]), baseline.empty() ? -1 : std::stod(baseline[1])};
}

std::string Train(const std::string& dir, const std::string& data, const std::vector<std::string>& extra) {
  WriteFile(dir + "/job.pbtxt", Job(data));
  std::vector<std::string> argv = {BinaryPath("segps-local"), "--config", dir + "/job.pbtxt", "--report",
                                   dir + "/report.json", "--no_checkpoints"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::unique_ptr<Subprocess> local = Subprocess::Start(argv);
  const std::optional<int> status = local->Wait(absl::Minutes(3));
  EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << local->output();
  return local->output();
}

TEST(Regression, NpyFilesTrainToAnRmseFarBelowTheMeansAndPredictWritesThePredictions) {
  const std::string dir = MakeTempDir();
  WriteTask(dir, "train", 5000, 1);
  WriteTask(dir, "test", 1000, 2);
  const std::string output =
      Train(dir, "source: NPY train_x: \"train_x.npy\" train_y: \"train_y.npy\" test_x: \"test_x.npy\" "
                 "test_y: \"test_y.npy\" validation_fraction: 0.1",
            {"--export", dir + "/model.safetensors", "--probabilities_out", dir + "/eval.npy", "--plot",
             dir + "/plots"});
  EXPECT_NE(output.find("wrote " + dir + "/plots/learning_curves.png"), std::string::npos) << output;
  EXPECT_NE(output.find("tanh32/0: epoch 10 validation loss "), std::string::npos) << output;
  EXPECT_TRUE(std::regex_search(output, std::regex("ENSEMBLE \\(average of the predictions\\) rmse [0-9.]+  mae")))
      << output;
  const auto [rmse, baseline] = Rmse(ReadFile(dir + "/report.json"));
  EXPECT_GT(baseline, 1.5) << ReadFile(dir + "/report.json");
  EXPECT_LT(rmse, baseline / 3) << ReadFile(dir + "/report.json");

  std::unique_ptr<Subprocess> predict =
      Subprocess::Start({BinaryPath("segps-predict"), "--model", dir + "/model.safetensors", "--input",
                         dir + "/test_x.npy", "--out", dir + "/predictions.txt"});
  ASSERT_TRUE(ExitedOk(predict->Wait(absl::Minutes(1)).value_or(-1))) << predict->output();
  const std::vector<std::string> lines =
      absl::StrSplit(ReadFile(dir + "/predictions.txt"), '\n', absl::SkipEmpty());
  const std::string eval_bytes = ReadFile(dir + "/eval.npy");
  absl::StatusOr<NpyHeader> h = ReadNpyHeader(dir + "/eval.npy");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(lines.size(), 1000u);
  ASSERT_EQ(h->elements(), 1000u);
  for (size_t i = 0; i < lines.size(); ++i) {
    float scored = 0;
    std::memcpy(&scored, eval_bytes.data() + h->data_offset + 4 * i, 4);
    ASSERT_NEAR(std::stod(lines[i]), scored, 1e-5) << "row " << i;
  }
}

TEST(Regression, CsvTablesTrainToTheSameBar) {
  const std::string dir = MakeTempDir();
  WriteTask(dir, "train", 5000, 1);
  WriteTask(dir, "test", 1000, 2);
  Train(dir, "source: CSV train_csv: \"train.csv\" test_csv: \"test.csv\" label_column: \"target\"", {});
  const auto [rmse, baseline] = Rmse(ReadFile(dir + "/report.json"));
  EXPECT_LT(rmse, baseline / 3) << ReadFile(dir + "/report.json");
  EXPECT_GT(baseline, 1.5);
}

// A chain's last stage ends in the squared error: the whole network
// regresses, scored as one.
TEST(Regression, AChainOfTwoStagesRegressesAsOneNetwork) {
  const std::string dir = MakeTempDir();
  WriteTask(dir, "train", 5000, 1);
  WriteTask(dir, "test", 1000, 2);
  std::string job = Job("source: NPY train_x: \"train_x.npy\" train_y: \"train_y.npy\" test_x: \"test_x.npy\" "
                        "test_y: \"test_y.npy\"");
  job.replace(job.find("segments {"), job.find("optimizer") - job.find("segments {"),
              "combine: CHAIN\n segments { name: \"s0\" layers { units: 64 activation: RELU } }\n"
              " segments { name: \"s1\" input_width: 64 layers { units: 1 activation: IDENTITY } }\n }\n ");
  WriteFile(dir + "/job.pbtxt", job);
  std::unique_ptr<Subprocess> local = Subprocess::Start({BinaryPath("segps-local"), "--config", dir + "/job.pbtxt",
                                                         "--report", dir + "/report.json", "--no_checkpoints"});
  ASSERT_TRUE(ExitedOk(local->Wait(absl::Minutes(3)).value_or(-1))) << local->output();
  EXPECT_NE(local->output().find("ENSEMBLE (one network: a chain) rmse "), std::string::npos) << local->output();
  const auto [rmse, baseline] = Rmse(ReadFile(dir + "/report.json"));
  EXPECT_LT(rmse, baseline / 3) << ReadFile(dir + "/report.json");
}

// Class indices where targets are due stop the job before anything starts,
// naming the file and what it needs.
TEST(Regression, IntegerLabelsAreRefusedNamingTheFile) {
  const std::string dir = MakeTempDir();
  WriteTask(dir, "train", 100, 1);
  std::vector<int32_t> classes(100, 1);
  ASSERT_TRUE(WriteNpy(dir + "/int_y.npy", "<i4", classes.data(), classes.size() * 4, {100}).ok());
  WriteFile(dir + "/job.pbtxt", Job("source: NPY train_x: \"train_x.npy\" train_y: \"int_y.npy\""));
  std::unique_ptr<Subprocess> local =
      Subprocess::Start({BinaryPath("segps-local"), "--config", dir + "/job.pbtxt", "--no_checkpoints"});
  const std::optional<int> status = local->Wait(absl::Minutes(1));
  ASSERT_TRUE(status.has_value());
  EXPECT_FALSE(ExitedOk(*status));
  EXPECT_NE(local->output().find(dir + "/int_y.npy"), std::string::npos) << local->output();
  EXPECT_NE(local->output().find("they must be float32 or float64 (model.loss MSE)"), std::string::npos)
      << local->output();
}

}  // namespace
}  // namespace segps
