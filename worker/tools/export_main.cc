// segps-export: writes a trained job's whole model to one file: safetensors
// (named tensors, the architecture and preprocessing in its metadata) and,
// with --onnx, an ONNX graph of the ensemble, or of the one network a
// CHAIN's stages make.
//
//   segps-export --config job.pbtxt --servers HOST:PORT,... --out model.safetensors [--onnx model.onnx]
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/config.h"
#include "common/security.h"
#include "common/lock_checks.h"
#include "worker/data/dataset.h"
#include "worker/model/evaluator.h"
#include "worker/model/model_file.h"
#include "worker/client/model_reader.h"
#include "worker/client/ps_client.h"

ABSL_FLAG(std::string, config, "", "Job config file (*.pbtxt). Required.");
ABSL_FLAG(std::string, servers, "", "Comma-separated host:port of every server. Default: cluster.server_addresses.");
ABSL_FLAG(std::string, out, "", "Write the model as safetensors to this file.");
ABSL_FLAG(std::string, onnx, "", "Write the model as an ONNX graph to this file.");
ABSL_FLAG(uint64_t, max_table_mb, 1024,
          "The largest embedding table written, in MiB dense (vocab x dim floats): every row of a table is "
          "written, those never pushed at their initial values; a larger one is refused.");

namespace {
int Fail(const std::string& message) {
  std::cerr << "segps-export: " << message << "\n";
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  segps::SkipMutexDeadlockDetection();
  std::vector<char*> positional = segps::ParseCommandLine(
      argc, argv,
      "Exports a trained model.\n"
      "  segps-export --config FILE --servers HOST:PORT,... --out model.safetensors "
      "[--onnx model.onnx]");
  if (positional.size() > 1) return Fail(std::string("unexpected argument '") + positional[1] + "'");
  if (absl::GetFlag(FLAGS_config).empty()) return Fail("--config is required (see --help)");
  if (absl::GetFlag(FLAGS_out).empty() && absl::GetFlag(FLAGS_onnx).empty()) {
    return Fail("give --out FILE.safetensors, --onnx FILE.onnx, or both");
  }
  absl::StatusOr<segps::v1::JobConfig> config = segps::LoadConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) return Fail(std::string(config.status().message()));
  segps::ApplySecurityFlags(config->mutable_security());
  const std::vector<std::string> addresses = segps::ServerAddresses(absl::GetFlag(FLAGS_servers), *config);
  absl::StatusOr<std::unique_ptr<segps::ModelReader>> reader = segps::ModelReader::Connect(*config, addresses);
  if (!reader.ok()) return Fail(std::string(reader.status().message()));
  // Each range from its primary, or from a backup's copy (cluster.replicas).
  absl::StatusOr<std::vector<std::vector<float>>> params = (*reader)->Pull();
  if (!params.ok()) return Fail(std::string(params.status().message()));
  // Embedding rows (tables are never replicated) through the workers' client.
  absl::StatusOr<std::unique_ptr<segps::ParameterClient>> client = segps::ConnectGrpc(*config, addresses);
  if (!client.ok()) return Fail(std::string(client.status().message()));
  absl::StatusOr<std::vector<std::vector<std::vector<float>>>> tables =
      segps::PullTables(**client, config->model(), absl::GetFlag(FLAGS_max_table_mb) << 20);
  if (!tables.ok()) return Fail(std::string(tables.status().message()));
  // The preprocessing (scale, standardisation) is the training set's, as
  // every worker computed it; a model of tensors (Python workers) has none.
  segps::TrainTest data;
  if (!segps::TensorsOnly(config->model())) {
    absl::StatusOr<segps::TrainTest> loaded = segps::LoadData(*config);
    if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
    data = *std::move(loaded);
  }
  const segps::TrainedModel model = segps::ModelOfJob(*config, *std::move(params), data.train, *std::move(tables));
  if (!absl::GetFlag(FLAGS_out).empty()) {
    absl::Status written = segps::WriteModelSafetensors(model, absl::GetFlag(FLAGS_out));
    if (!written.ok()) return Fail(std::string(written.message()));
    std::cout << "segps-export: wrote " << absl::GetFlag(FLAGS_out) << "\n";
  }
  if (!absl::GetFlag(FLAGS_onnx).empty()) {
    if (absl::Status computed = segps::ComputedHere(config->model()); !computed.ok()) {
      return Fail(absl::StrCat("--onnx: ", computed.message(), "; torch.onnx.export writes its graph"));
    }
    absl::Status written = segps::WriteModelOnnx(model, absl::GetFlag(FLAGS_onnx));
    if (!written.ok()) return Fail(std::string(written.message()));
    std::cout << "segps-export: wrote " << absl::GetFlag(FLAGS_onnx) << "\n";
  }
  return 0;
}
