// segps-predict: runs an exported model (segps-export) on the CPU backend,
// without a cluster: the ensemble's class probabilities, or one segment's.
//
//   segps-predict --model model.safetensors --input x.npy --out probs.npy [--segment NAME]
#include <iostream>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "common/config.h"
#include "common/config_hints.h"
#include "common/lock_checks.h"
#include "worker/model/backend.h"
#include "worker/data/dataset.h"
#include "worker/model/evaluator.h"
#include "worker/model/model_file.h"
#include "worker/data/npy.h"

ABSL_FLAG(std::string, model, "", "An exported model (segps-export --out). Required.");
ABSL_FLAG(std::string, input, "",
          "Input rows: an .npy array [n, input_width] of float32, float64 or uint8, raw as the training data was "
          "given; the model's scale and standardisation are applied. Required.");
ABSL_FLAG(std::string, out, "", "Write class probabilities here: .npy float32 [n, num_classes]. Required.");
ABSL_FLAG(std::string, segment, "", "Predict with this segment alone (a name or an index). Default: the ensemble.");
ABSL_FLAG(int32_t, cpu_threads, 1, "Threads to compute with.");

namespace {
int Fail(const std::string& message) {
  std::cerr << "segps-predict: " << message << "\n";
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  segps::SkipMutexDeadlockDetection();
  std::vector<char*> positional = segps::ParseCommandLine(
      argc, argv,
      "Runs an exported model.\n"
      "  segps-predict --model model.safetensors --input x.npy --out probs.npy "
      "[--segment NAME]");
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
  // Raw rows, read as the training data was: the model's scale and standardisation.
  absl::StatusOr<segps::Dataset> input = segps::OpenNpyFeatures(
      absl::GetFlag(FLAGS_input), static_cast<int>(model->model.input_width()), model->input_scale);
  if (!input.ok()) return Fail(std::string(input.status().message()));
  input->mean = model->mean;
  input->std = model->std;
  std::unique_ptr<segps::Backend> backend = segps::CreateCpuBackend(absl::GetFlag(FLAGS_cpu_threads));
  absl::StatusOr<std::vector<float>> probs = segps::Predict(model->model, *input, model->params, segment, backend.get());
  if (!probs.ok()) return Fail(std::string(probs.status().message()));
  absl::Status written = segps::WriteNpyFloat32(absl::GetFlag(FLAGS_out), probs->data(),
                                                {input->size(), model->model.num_classes()});
  if (!written.ok()) return Fail(std::string(written.message()));
  std::cout << "segps-predict: " << input->size() << " rows -> " << absl::GetFlag(FLAGS_out) << "\n";
  return 0;
}
