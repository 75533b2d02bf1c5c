// A user's own data and a trained model taken out, end to end with separate
// processes: the teacher task written as .npy files and as CSV trains to the
// teacher bar through segps-local; its export, read by segps-predict and by
// python/segps_model.py (Debian's /usr/bin/python3), reproduces segps-eval;
// a data set larger than a worker's address-space limit trains through
// memory mapping; bad data stops the job before anything starts.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/sanitizers.h"
#include "tests/support/subprocess.h"
#include "worker/data/dataset.h"
#include "worker/data/npy.h"

namespace segps {
namespace {

const std::string kSource = SEGPS_SOURCE_DIR;

struct Finished {
  bool ok = false;
  std::string output;
};

Finished RunToEnd(const std::vector<std::string>& argv, absl::Duration timeout) {
  std::unique_ptr<Subprocess> p = Subprocess::Start(argv);
  std::optional<int> status = p->Wait(timeout);
  return {status.has_value() && ExitedOk(*status), p->output()};
}

// The teacher config with `data` in place of its data section.
std::string TeacherWith(const std::string& dir, const std::string& data) {
  std::string text = ReadFile(kSource + "/deploy/configs/teacher.pbtxt");
  text = text.substr(0, text.find("data {")) + "data { " + data + " split: SAME }\n";
  const std::string path = dir + "/job.pbtxt";
  WriteFile(path, text);
  return path;
}

// The teacher task's training and test sets as dir/{train,test}_{x,y}.npy.
void WriteTeacherNpy(const std::string& dir) {
  Finished data = RunToEnd({BinaryPath("segps-data"), "--config", kSource + "/deploy/configs/teacher.pbtxt", "--out", dir},
                      absl::Seconds(60));
  ASSERT_TRUE(data.ok) << data.output;
}

std::vector<float> ReadNpyFloats(const std::string& path) {
  const std::string bytes = ReadFile(path);
  absl::StatusOr<NpyHeader> h = ReadNpyHeader(path);
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return {};
  std::vector<float> v(h->elements());
  std::memcpy(v.data(), bytes.data() + h->data_offset, v.size() * sizeof(float));
  return v;
}

// Standardised, so that the export's preprocessing is checked everywhere too.
TEST(OwnData, NpyFilesTrainAndTheExportReproducesTheEvaluatorElsewhere) {
  const std::string dir = MakeTempDir();
  WriteTeacherNpy(dir);
  const std::string config = TeacherWith(dir,
                                         "source: NPY train_x: \"train_x.npy\" train_y: \"train_y.npy\" "
                                         "test_x: \"test_x.npy\" test_y: \"test_y.npy\" normalize: STANDARDIZE");
  Finished run = RunToEnd({BinaryPath("segps-local"), "--config", config, "--report", dir + "/report.json", "--export",
                      dir + "/model.safetensors", "--onnx", dir + "/model.onnx", "--probabilities_out",
                      dir + "/eval_probs.npy", "--checkpoint_dir", dir + "/checkpoints"},
                     absl::Minutes(5));
  ASSERT_TRUE(run.ok) << run.output;
  const std::string report = ReadFile(dir + "/report.json");
  EXPECT_GT(EnsembleAccuracy(report), 0.90) << report;  // the built-in teacher data's bar

  Finished predict = RunToEnd({BinaryPath("segps-predict"), "--model", dir + "/model.safetensors", "--input",
                          dir + "/test_x.npy", "--out", dir + "/predict_probs.npy"},
                         absl::Seconds(60));
  ASSERT_TRUE(predict.ok) << predict.output;
  const std::vector<float> eval = ReadNpyFloats(dir + "/eval_probs.npy");
  const std::vector<float> predicted = ReadNpyFloats(dir + "/predict_probs.npy");
  ASSERT_EQ(eval.size(), 5000u * 10);
  ASSERT_EQ(predicted.size(), eval.size());
  EXPECT_LE(LargestDifference(eval, predicted), 1e-6);

  Finished python = RunToEnd({"/usr/bin/python3", kSource + "/tests/python/check_export.py", dir + "/model.safetensors",
                         dir + "/model.onnx", dir + "/test_x.npy", dir + "/test_y.npy", dir + "/eval_probs.npy",
                         dir + "/report.json"},
                        absl::Minutes(2));
  EXPECT_TRUE(python.ok) << python.output;
  EXPECT_NE(python.output.find("onnx: checker accepts"), std::string::npos) << python.output;
  EXPECT_NE(ReadFile(dir + "/model.safetensors").find("\"segps.normalize\":\"STANDARDIZE\""), std::string::npos);
  std::cout << python.output;
  // The servers' final checkpoints, merged, are the same model, readable elsewhere.
  Finished merge = RunToEnd({BinaryPath("segps-checkpoint"), "merge", "--dir", dir + "/checkpoints", "--out",
                             dir + "/merged.safetensors"},
                            absl::Seconds(60));
  ASSERT_TRUE(merge.ok) << merge.output;
  Finished merged = RunToEnd({"/usr/bin/python3", kSource + "/tests/python/check_checkpoint.py",
                              dir + "/merged.safetensors", dir + "/model.safetensors", dir + "/test_x.npy",
                              dir + "/test_y.npy", dir + "/eval_probs.npy", dir + "/report.json"},
                             absl::Minutes(2));
  EXPECT_TRUE(merged.ok) << merged.output;
  EXPECT_NE(merged.output.find("merged torch"), std::string::npos) << merged.output;
  std::cout << merged.output;
}

// Rows of an .npy float32 file as CSV text with a header f0..fN-1,label.
void NpyToCsv(const std::string& x_path, const std::string& y_path, const std::string& csv_path) {
  absl::StatusOr<NpyHeader> h = ReadNpyHeader(x_path);
  ASSERT_TRUE(h.ok()) << h.status();
  const std::vector<float> x = ReadNpyFloats(x_path);
  const std::string y_bytes = ReadFile(y_path);
  absl::StatusOr<NpyHeader> hy = ReadNpyHeader(y_path);
  ASSERT_TRUE(hy.ok()) << hy.status();
  std::FILE* f = std::fopen(csv_path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  const uint64_t rows = h->shape[0], width = h->shape[1];
  for (uint64_t j = 0; j < width; ++j) std::fprintf(f, "f%llu,", static_cast<unsigned long long>(j));
  std::fprintf(f, "label\n");
  for (uint64_t i = 0; i < rows; ++i) {
    for (uint64_t j = 0; j < width; ++j) std::fprintf(f, "%.9g,", x[i * width + j]);
    int32_t label;
    std::memcpy(&label, y_bytes.data() + hy->data_offset + 4 * i, 4);
    std::fprintf(f, "%d\n", label);
  }
  std::fclose(f);
}

TEST(OwnData, CsvTablesTrainToTheSameBar) {
  const std::string dir = MakeTempDir();
  WriteTeacherNpy(dir);
  NpyToCsv(dir + "/train_x.npy", dir + "/train_y.npy", dir + "/train.csv");
  NpyToCsv(dir + "/test_x.npy", dir + "/test_y.npy", dir + "/test.csv");
  const std::string config =
      TeacherWith(dir, "source: CSV train_csv: \"train.csv\" test_csv: \"test.csv\" label_column: \"label\"");
  Finished run = RunToEnd({BinaryPath("segps-local"), "--config", config, "--report", dir + "/report.json",
                           "--export", dir + "/model.safetensors"},
                          absl::Minutes(5));
  ASSERT_TRUE(run.ok) << run.output;
  EXPECT_NE(run.output.find("data: 30000 training and 5000 test samples of 50 features"), std::string::npos);
  const double accuracy = EnsembleAccuracy(ReadFile(dir + "/report.json"));
  EXPECT_GT(accuracy, 0.90);

  // segps-predict on the test table, label column and all: one class a
  // line, scoring what segps-eval scored; the same table with its columns
  // in another order (found by name) gives the same classes.
  auto predict = [&](const std::string& table, const std::string& classes) {
    return RunToEnd({BinaryPath("segps-predict"), "--model", dir + "/model.safetensors", "--input", table, "--out",
                     classes, "--probabilities", classes + ".npy"},
                    absl::Minutes(1));
  };
  Finished predicted = predict(dir + "/test.csv", dir + "/classes.txt");
  ASSERT_TRUE(predicted.ok) << predicted.output;
  const std::vector<std::string> classes = absl::StrSplit(ReadFile(dir + "/classes.txt"), '\n', absl::SkipEmpty());
  ASSERT_EQ(classes.size(), 5000u);
  const std::vector<float> probs = ReadNpyFloats(dir + "/classes.txt.npy");
  ASSERT_EQ(probs.size(), 5000u * 10);
  std::vector<std::string> lines = absl::StrSplit(ReadFile(dir + "/test.csv"), '\n', absl::SkipEmpty());
  int correct = 0;
  for (size_t i = 0; i < classes.size(); ++i) {
    const auto argmax = std::max_element(&probs[i * 10], &probs[i * 10] + 10) - &probs[i * 10];
    ASSERT_EQ(classes[i], std::to_string(argmax)) << "row " << i;
    correct += classes[i] == lines[i + 1].substr(lines[i + 1].rfind(',') + 1);
  }
  EXPECT_NEAR(correct / 5000.0, accuracy, 2e-4) << "segps-eval and segps-predict score differently";
  // Columns reversed, label first: found by name.
  std::string reversed;
  for (const std::string& line : lines) {
    std::vector<std::string> fields = absl::StrSplit(line, ',');
    std::reverse(fields.begin(), fields.end());
    absl::StrAppend(&reversed, absl::StrJoin(fields, ","), "\n");
  }
  WriteFile(dir + "/reversed.csv", reversed);
  Finished again = predict(dir + "/reversed.csv", dir + "/again.txt");
  ASSERT_TRUE(again.ok) << again.output;
  EXPECT_EQ(ReadFile(dir + "/again.txt"), ReadFile(dir + "/classes.txt"));
  // A table without one of the features: refused naming it.
  WriteFile(dir + "/short.csv", "f0,f1,label\n1,2,3\n");
  Finished missing = predict(dir + "/short.csv", dir + "/none.txt");
  EXPECT_FALSE(missing.ok);
  EXPECT_NE(missing.output.find("short.csv: line 1: no column \"f2\", a feature the model was trained on"),
            std::string::npos)
      << missing.output;
}

TEST(OwnData, BadDataStopsTheJobBeforeAnythingStarts) {
  const std::string dir = MakeTempDir();
  WriteTeacherNpy(dir);
  // One NaN deep in the training inputs: row 20000, column 7.
  std::string x = ReadFile(dir + "/train_x.npy");
  absl::StatusOr<NpyHeader> h = ReadNpyHeader(dir + "/train_x.npy");
  ASSERT_TRUE(h.ok());
  const float nan = std::nanf("");
  std::memcpy(&x[h->data_offset + (20000 * 50 + 7) * sizeof(float)], &nan, sizeof(float));
  WriteFile(dir + "/train_x.npy", x);
  const std::string config = TeacherWith(
      dir, "source: NPY train_x: \"train_x.npy\" train_y: \"train_y.npy\" test_x: \"test_x.npy\" test_y: \"test_y.npy\"");
  Finished run = RunToEnd({BinaryPath("segps-local"), "--config", config, "--report", dir + "/report.json"},
                     absl::Minutes(1));
  EXPECT_FALSE(run.ok);
  EXPECT_NE(run.output.find("segps-local: data: " + dir + "/train_x.npy: row 20000 column 7: feature is nan"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("servers at"), std::string::npos) << "a server started: " << run.output;
}

// An .npy file of `rows` x `width` float32 in [-1, 1), written a row at a
// time; label = (feature 0 > 0).
void WriteSignTask(const std::string& dir, const std::string& name, uint64_t rows, uint64_t width, uint64_t seed) {
  const std::string x_path = dir + "/" + name + "_x.npy";
  ASSERT_TRUE(WriteNpy(x_path, "<f4", nullptr, 0, {rows, width}).ok());
  std::FILE* f = std::fopen(x_path.c_str(), "ab");
  ASSERT_NE(f, nullptr);
  std::vector<float> row(width);
  std::vector<int32_t> labels(rows);
  for (uint64_t i = 0; i < rows; ++i) {
    for (uint64_t j = 0; j < width; ++j) row[j] = static_cast<float>(2 * UniformFromKey(seed, i, j, 0) - 1);
    labels[i] = row[0] > 0;
    ASSERT_EQ(std::fwrite(row.data(), sizeof(float), width, f), width);
  }
  ASSERT_EQ(std::fclose(f), 0);
  ASSERT_TRUE(WriteNpy(dir + "/" + name + "_y.npy", "<i4", labels.data(), rows * 4, {rows}).ok());
}

TEST(OwnData, ADataSetLargerThanAWorkersMemoryLimitTrainsThroughMemoryMapping) {
#if defined(SEGPS_ASAN) || defined(SEGPS_TSAN)
  GTEST_SKIP() << "the sanitizers reserve terabytes of address space: no process starts under ulimit -v";
#endif
  const std::string dir = MakeTempDir();
  constexpr uint64_t kWidth = 512, kRows = 400000;  // 819 MB of inputs
  constexpr uint64_t kLimitKb = 700 * 1024;         // every process's address space: 717 MB
  WriteSignTask(dir, "train", kRows, kWidth, 1);
  WriteSignTask(dir, "test", 2000, kWidth, 2);
  auto job = [&](int workers) {
    const std::string path = absl::StrCat(dir, "/job", workers, ".pbtxt");
    WriteFile(path, absl::StrFormat(R"pb(
      name: "mapped"
      cluster { num_servers: 1 }
      model {
        input_width: %d
        num_classes: 2
        segments { name: "sign" layers { units: 4 activation: RELU } layers { units: 2 activation: SOFTMAX } }
      }
      optimizer { kind: ADAM learning_rate: 0.01 }
      training { batch_size: 256 epochs: 1 staleness: 2 workers_per_segment: %d }
      data { source: NPY train_x: "train_x.npy" train_y: "train_y.npy" test_x: "test_x.npy" test_y: "test_y.npy" }
    )pb", kWidth, workers));
    return path;
  };
  auto limited = [&](const std::string& config) {
    return RunToEnd({"/bin/bash", "-c",
                     absl::StrCat("ulimit -v ", kLimitKb, " && exec ", BinaryPath("segps-local"), " --config ",
                                  config, " --report ", dir, "/report.json")},
                     absl::Minutes(5));
  };
  // The limit is real: one worker would need the whole file mapped, and cannot.
  Finished whole = limited(job(1));
  EXPECT_FALSE(whole.ok);
  EXPECT_NE(whole.output.find("train_x.npy: cannot map"), std::string::npos) << whole.output;
  // Four workers each map a quarter, and the job trains.
  Finished sliced = limited(job(4));
  ASSERT_TRUE(sliced.ok) << sliced.output;
  EXPECT_GT(EnsembleAccuracy(ReadFile(dir + "/report.json")), 0.9);
  std::remove((dir + "/train_x.npy").c_str());
}

}  // namespace
}  // namespace segps
