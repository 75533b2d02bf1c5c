// segps-predict: runs an exported model (segps-export) on the CPU backend,
// without a cluster: the ensemble's class probabilities, or one segment's.
//
//   segps-predict --model model.safetensors --input x.npy|rows.csv --out probs.npy|classes.txt
//                 [--probabilities probs.npy] [--segment NAME]
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "common/config.h"
#include "common/config_hints.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/lock_checks.h"
#include "common/status_macros.h"
#include "worker/model/backend.h"
#include "worker/data/dataset.h"
#include "worker/model/evaluator.h"
#include "worker/data/categorical.h"
#include "worker/model/model_file.h"
#include "worker/data/csv.h"
#include "worker/data/npy.h"

ABSL_FLAG(std::string, model, "", "An exported model (segps-export --out). Required.");
ABSL_FLAG(std::string, input, "",
          "Input rows, raw as the training data was given (the model's scale and standardisation are applied): an "
          ".npy array [n, input_width] of float32, float64 or uint8, or a .csv table: by the training table's "
          "feature column names where it had a header (other columns, its label say, are skipped), else "
          "input_width columns in order. Required.");
ABSL_FLAG(std::string, out, "",
          "Where the predictions go: a .npy file gets the class probabilities (float32 [n, num_classes]); any other "
          "file one predicted class a line. Required.");
ABSL_FLAG(std::string, ids, "",
          "A model with embedding tables: each --input row's categorical ids, a .npy array [n, "
          "categorical_fields] of int64 or int32 (as data.train_ids). Required for such a model.");
ABSL_FLAG(std::string, probabilities, "", "Also write the class probabilities here (.npy float32 [n, num_classes]).");
ABSL_FLAG(std::string, segment, "", "Predict with this segment alone (a name or an index). Default: the ensemble.");
ABSL_FLAG(int32_t, cpu_threads, 1, "Threads to compute with.");

namespace {
int Fail(const std::string& message) {
  std::cerr << "segps-predict: " << message << "\n";
  return 1;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The --input rows, read as the training data was: the model's scale and
// standardisation applied.
absl::StatusOr<segps::Dataset> ReadInput(const segps::TrainedModel& model) {
  const std::string path = absl::GetFlag(FLAGS_input);
  const int width = static_cast<int>(model.model.input_width());
  absl::StatusOr<segps::Dataset> input =
      EndsWith(path, ".csv") ? segps::ReadCsvFeatures(path, model.csv_delimiter[0], model.input_columns, width,
                                                      model.input_scale)
                             : segps::OpenNpyFeatures(path, width, model.input_scale);
  if (!input.ok()) return input.status();
  if (!model.mean.empty()) input->Standardize(model.mean, model.std);
  const std::string ids = absl::GetFlag(FLAGS_ids);
  const uint32_t fields = model.model.categorical_fields();
  if (fields == 0 && !ids.empty()) return absl::InvalidArgumentError("--ids: this model has no embedding tables");
  if (fields > 0) {
    if (ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--ids is required: this model looks up ", fields,
                                                     " categorical ids a row in its embedding tables"));
    }
    absl::StatusOr<std::vector<uint64_t>> read = segps::ReadIds(ids, input->size(), model.model, path);
    if (!read.ok()) return read.status();
    input->fields = static_cast<int>(fields);
    input->ids = *std::move(read);
  }
  return input;
}

// The probabilities to --out (.npy) or one class a line (a regression's
// prediction, under loss MSE), and to --probabilities.
absl::Status WriteOutputs(const std::vector<float>& probs, size_t rows, size_t classes, bool regression) {
  const std::string out = absl::GetFlag(FLAGS_out), also = absl::GetFlag(FLAGS_probabilities);
  for (const std::string& npy : {EndsWith(out, ".npy") ? out : std::string(), also}) {
    if (!npy.empty()) SEGPS_RETURN_IF_ERROR(segps::WriteNpyFloat32(npy, probs.data(), {rows, classes}));
  }
  if (EndsWith(out, ".npy")) return absl::OkStatus();
  std::string text;
  for (size_t r = 0; r < rows; ++r) {
    const float* p = probs.data() + r * classes;
    if (regression) {
      absl::StrAppend(&text, absl::StrFormat("%.9g", p[0]), "\n");
    } else {
      absl::StrAppend(&text, std::max_element(p, p + classes) - p, "\n");
    }
  }
  std::ofstream file(out, std::ios::trunc);
  file << text;
  file.close();
  if (!file) return absl::UnavailableError(absl::StrCat("cannot write ", out, ": ", std::strerror(errno)));
  return absl::OkStatus();
}
}  // namespace

int main(int argc, char** argv) {
  segps::SkipMutexDeadlockDetection();
  std::vector<char*> positional = segps::ParseCommandLine(
      argc, argv,
      "Runs an exported model.\n"
      "  segps-predict --model model.safetensors --input x.npy|rows.csv [--ids ids.npy] --out probs.npy|classes.txt "
      "[--probabilities probs.npy] [--segment NAME]");
  if (positional.size() > 1) return Fail(std::string("unexpected argument '") + positional[1] + "'");
  for (const auto* flag : {&FLAGS_model, &FLAGS_input, &FLAGS_out}) {
    if (absl::GetFlag(*flag).empty()) return Fail("--model, --input and --out are required (see --help)");
  }
  absl::StatusOr<segps::TrainedModel> model = segps::ReadModelSafetensors(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const std::string wanted = absl::GetFlag(FLAGS_segment);
  const int segment = wanted.empty() ? -1 : segps::SegmentIndex(model->model, wanted);
  if (!wanted.empty() && segment < 0) {
    std::vector<std::string> names;
    for (const segps::v1::SegmentConfig& s : model->model.segments()) names.push_back(s.name());
    return Fail("--segment '" + wanted + "' names no segment of the model." + segps::Suggest(wanted, names));
  }
  absl::StatusOr<segps::Dataset> input = ReadInput(*model);
  if (!input.ok()) return Fail(std::string(input.status().message()));
  std::unique_ptr<segps::Backend> backend = segps::CreateCpuBackend(absl::GetFlag(FLAGS_cpu_threads));
  absl::StatusOr<std::vector<float>> probs =
      segps::Predict(model->model, *input, model->params, segment, backend.get(), segps::TableRows(*model));
  if (!probs.ok()) return Fail(std::string(probs.status().message()));
  absl::Status written = WriteOutputs(*probs, input->size(), model->model.num_classes(),
                                      model->model.loss() == segps::v1::MSE);
  if (!written.ok()) return Fail(std::string(written.message()));
  std::cout << "segps-predict: " << input->size() << " rows -> " << absl::GetFlag(FLAGS_out) << "\n";
  return 0;
}
