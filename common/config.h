// Loading and validating a job config (*.pbtxt, segps.v1.JobConfig).
//
// LoadConfig parses, validates and fills in every default, so that the rest
// of segps reads a complete config and never re-derives defaults. Errors
// name the file, the line and the field, and say what is allowed.
#ifndef SEGPS_COMMON_CONFIG_H_
#define SEGPS_COMMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "segps/v1/config.pb.h"

namespace segps {

// Reads, parses and validates `path`.
absl::StatusOr<v1::JobConfig> LoadConfig(const std::string& path);

// Parses and validates config text; `source_name` stands for the file in errors.
absl::StatusOr<v1::JobConfig> ParseConfig(absl::string_view text, absl::string_view source_name);

// The bytes a worker holds per parameter of its segment (values, gradient,
// two pull buffers): training.worker_parameter_budget_bytes counts these.
inline constexpr uint64_t kWorkerBytesPerParameter = 16;

// Staleness bound of a segment in a loaded config; -1 means unbounded.
inline int32_t StalenessOf(const v1::JobConfig& config, int segment) {
  return config.model().segments(segment).staleness();
}
// The segment a user names by its name or its index; -1 if none.
int SegmentIndex(const v1::ModelConfig& model, const std::string& name_or_index);

// The activation every segment's (a chain's last stage's) last layer
// ends in: SOFTMAX for classes, IDENTITY for a regression (loss: MSE).
inline v1::Activation OutputActivation(const v1::ModelConfig& model) {
  return model.loss() == v1::MSE ? v1::IDENTITY : v1::SOFTMAX;
}

// A segment declared by its tensors (SegmentConfig.tensors), trained by
// Python workers; and a model of only such segments, which needs no data,
// input_width or num_classes (its workers bring their own).
inline bool DeclaredByTensors(const v1::SegmentConfig& segment) { return segment.tensors_size() > 0; }
bool TensorsOnly(const v1::ModelConfig& model);

inline uint32_t WorkersOf(const v1::JobConfig& config, int segment) {
  return config.model().segments(segment).workers();
}

// The most pushes a worker of `segment` keeps unacknowledged:
// training.pushes_in_flight, or s + 1 bounded to [1, 8] (8 when unbounded).
uint32_t PushesInFlight(const v1::JobConfig& config, int segment);

// The least share of a balanced worker, in samples per clock:
// ceil(balance.min_share x batch_size), at least 1.
uint32_t MinShare(const v1::TrainingConfig& training);

// Hex fingerprint of everything that must agree between servers and workers
// for their parameters to mean the same thing: the model, the optimizer and
// the initialisation seed (and, for balanced training, the balance and the
// batch size that pushes are weighted against).
std::string ModelFingerprint(const v1::JobConfig& config);
// The same parts fingerprinted one by one ("model", "optimizer", "seed",
// "balance"), so that a mismatch can say which differ.
std::map<std::string, std::string> ModelFingerprintParts(const v1::JobConfig& config);
// The fingerprinted parts as one line of protobuf text, which a checkpoint
// records beside the fingerprint; and, given such a record, each field in
// which it differs from `config`'s: "optimizer.learning_rate: 0.003 here,
// 0.001 in <where>" (none when the record is empty or unreadable).
std::string FingerprintedConfig(const v1::JobConfig& config);
std::vector<std::string> FingerprintDifferences(const v1::JobConfig& config, const std::string& recorded,
                                                const std::string& where);

// What a checkpoint must share with a config for the config to resume it:
// ModelFingerprint less the optimizer settings that may change between
// runs of one job (learning_rate, schedule, clip_value,
// clip_gradient_norm), which servers apply from the config they run with
// and no saved state depends on.
std::string CheckpointFingerprint(const v1::JobConfig& config);
// FingerprintDifferences split: those of such settings (a resume takes
// them) and the rest (a resume must refuse them).
struct ResumeDifferences {
  std::vector<std::string> allowed, refused;
};
ResumeDifferences CompareForResume(const v1::JobConfig& config, const std::string& recorded,
                                   const std::string& where);

}  // namespace segps

#endif  // SEGPS_COMMON_CONFIG_H_
