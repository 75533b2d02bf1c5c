// Fingerprints of the parts of a job config that must agree between
// servers, workers and checkpoints, and what differs when they do not.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/hash.h"

namespace segps {
namespace {

// Each part of the model fingerprint, serialised deterministically.
std::map<std::string, std::string> FingerprintBytes(const v1::JobConfig& config) {
  auto serialized = [](auto write) {
    std::string bytes;
    {
      google::protobuf::io::StringOutputStream out(&bytes);
      google::protobuf::io::CodedOutputStream coded(&out);
      coded.SetSerializationDeterministic(true);
      write(coded);
    }
    return bytes;
  };
  std::map<std::string, std::string> parts;
  parts["model"] = serialized([&](auto& coded) { config.model().SerializeToCodedStream(&coded); });
  parts["optimizer"] = serialized([&](auto& coded) { config.optimizer().SerializeToCodedStream(&coded); });
  parts["seed"] = serialized([&](auto& coded) { coded.WriteVarint64(config.seed()); });
  // Balanced pushes are weighted by their samples against batch_size.
  if (config.training().has_balance()) {
    parts["balance"] = serialized([&](auto& coded) {
      config.training().balance().SerializeToCodedStream(&coded);
      coded.WriteVarint32(config.training().batch_size());
    });
  }
  return parts;
}

}  // namespace

std::string ModelFingerprint(const v1::JobConfig& config) {
  const std::map<std::string, std::string> parts = FingerprintBytes(config);
  std::string bytes;
  for (const char* name : {"model", "optimizer", "seed", "balance"}) {
    auto it = parts.find(name);
    if (it != parts.end()) bytes += it->second;
  }
  return HexFingerprint(bytes);
}

std::map<std::string, std::string> ModelFingerprintParts(const v1::JobConfig& config) {
  std::map<std::string, std::string> parts = FingerprintBytes(config);
  for (auto& [name, bytes] : parts) bytes = HexFingerprint(bytes);
  return parts;
}


namespace {

// The fingerprinted parts as a config of their own.
v1::JobConfig FingerprintedParts(const v1::JobConfig& config) {
  v1::JobConfig parts;
  *parts.mutable_model() = config.model();
  *parts.mutable_optimizer() = config.optimizer();
  parts.set_seed(config.seed());
  if (config.training().has_balance()) {
    *parts.mutable_training()->mutable_balance() = config.training().balance();
    parts.mutable_training()->set_batch_size(config.training().batch_size());
  }
  return parts;
}

}  // namespace

std::string FingerprintedConfig(const v1::JobConfig& config) {
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(FingerprintedParts(config), &text);
  return text;
}

std::vector<std::string> FingerprintDifferences(const v1::JobConfig& config, const std::string& recorded,
                                                const std::string& where) {
  v1::JobConfig theirs;
  if (recorded.empty() || !google::protobuf::TextFormat::ParseFromString(recorded, &theirs)) return {};
  std::string report;
  {
    google::protobuf::util::MessageDifferencer differencer;
    google::protobuf::io::StringOutputStream out(&report);
    google::protobuf::util::MessageDifferencer::StreamReporter reporter(&out);
    differencer.ReportDifferencesTo(&reporter);
    differencer.Compare(FingerprintedParts(config), theirs);
  }
  // The reporter's lines: "modified: PATH: OURS -> THEIRS", "added: PATH:
  // THEIRS", "deleted: PATH: OURS".
  std::vector<std::string> differences;
  std::istringstream lines(report);
  for (std::string text; std::getline(lines, text);) {
    const size_t kind_end = text.find(": "), path_end = text.find(": ", kind_end + 2);
    if (kind_end == std::string::npos || path_end == std::string::npos) continue;
    const std::string kind = text.substr(0, kind_end), path = text.substr(kind_end + 2, path_end - kind_end - 2);
    const std::string values = text.substr(path_end + 2);
    if (kind == "modified") {
      const size_t arrow = values.find(" -> ");
      if (arrow == std::string::npos) continue;
      differences.push_back(
          absl::StrCat(path, ": ", values.substr(0, arrow), " here, ", values.substr(arrow + 4), " in ", where));
    } else if (kind == "added") {
      differences.push_back(absl::StrCat(path, ": unset here, ", values, " in ", where));
    } else if (kind == "deleted") {
      differences.push_back(absl::StrCat(path, ": ", values, " here, unset in ", where));
    }
  }
  return differences;
}

namespace {

// The optimizer settings that may change between runs of one job: the
// servers apply them from the config they run with, and no state depends on them.
constexpr const char* kChangesBetweenRuns[] = {"learning_rate", "schedule", "clip_value", "clip_gradient_norm"};

}  // namespace

std::string CheckpointFingerprint(const v1::JobConfig& config) {
  v1::JobConfig resumable = config;
  v1::OptimizerConfig* optimizer = resumable.mutable_optimizer();
  for (const char* name : kChangesBetweenRuns) {
    optimizer->GetReflection()->ClearField(optimizer, optimizer->GetDescriptor()->FindFieldByName(name));
  }
  return ModelFingerprint(resumable);
}

ResumeDifferences CompareForResume(const v1::JobConfig& config, const std::string& recorded,
                                   const std::string& where) {
  ResumeDifferences out;
  for (std::string& difference : FingerprintDifferences(config, recorded, where)) {
    bool allowed = false;
    for (const char* name : kChangesBetweenRuns) allowed |= difference.rfind(absl::StrCat("optimizer.", name), 0) == 0;
    (allowed ? out.allowed : out.refused).push_back(std::move(difference));
  }
  return out;
}

}  // namespace segps
