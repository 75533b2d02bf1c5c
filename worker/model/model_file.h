// A trained model as one file a user can take elsewhere: the architecture,
// every segment's parameters as named tensors, and the input preprocessing
// the workers applied (data.scale, data.normalize).
//
// Tensors are named as a user would name them, SEGMENT/dense_K/kernel
// [in, out] and SEGMENT/dense_K/bias [out], plus preprocess/mean and
// preprocess/std [input_width] when standardised. The model computes, for
// raw input rows x: f = x * input_scale; f = (f - mean) / std (if
// standardised); per segment, for each layer h = act(h @ kernel + bias).
// The ensemble (combine: AVERAGE) is the mean of the segments' softmax
// outputs, each computed from f; a CHAIN is one network, each stage
// computed from the previous stage's output and the last stage's softmax
// its output.
//
// A segment's embedding tables (SegmentConfig.embeddings) go dense, every
// row of the vocab: SEGMENT/embeddings/TABLE [vocab, dim]. A sample's
// first layer then reads f followed by, for each table in order and each
// field it serves, the row its id names.
#ifndef SEGPS_WORKER_MODEL_MODEL_FILE_H_
#define SEGPS_WORKER_MODEL_MODEL_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"
#include "worker/data/dataset.h"
#include "worker/model/evaluator.h"

namespace segps {

struct TrainedModel {
  std::string job;
  v1::ModelConfig model;
  std::vector<std::vector<float>> params;  // segment k's flat parameters (the shard map's order)
  // Segment k's embedding tables, in order, each vocab x dim rows (empty
  // for a segment without tables).
  std::vector<std::vector<std::vector<float>>> tables;
  float input_scale = 1;
  std::vector<float> mean, std;  // standardisation; empty: none
  std::string config_fingerprint;  // ModelFingerprint of the job that trained it
  // Trained from a CSV table with a header: its feature columns' names, in
  // order, and its delimiter (segps-predict reads CSV by these names).
  std::vector<std::string> input_columns;
  std::string csv_delimiter = ",";
};

// The model of a job: `params` and `tables` (PullTables; none: empty)
// from the servers, preprocessing from the job's training set as LoadData
// built it.
TrainedModel ModelOfJob(const v1::JobConfig& config, std::vector<std::vector<float>> params,
                        const Dataset& train, std::vector<std::vector<std::vector<float>>> tables = {});

// The model's tables as the evaluator reads rows (Predict's RowSource);
// null for a model without tables. `model` outlives it.
RowSource TableRows(const TrainedModel& model);

// The safetensors file (common/safetensors.h), metadata holding the
// architecture as JSON ("segps.model"), the combine rule, the preprocessing
// and the config's fingerprint.
absl::Status WriteModelSafetensors(const TrainedModel& model, const std::string& path);
absl::StatusOr<TrainedModel> ReadModelSafetensors(const std::string& path);

// The same model as an ONNX graph (opset 13): input "input" [batch,
// input_width] float32 (and, for a model with tables, "ids" [batch,
// categorical_fields] int64, each table's rows looked up by Gather),
// output "probabilities" [batch, num_classes] (the
// ensemble's or the chain's), and, for an ensemble, "SEGMENT/probabilities"
// for each segment.
absl::Status WriteModelOnnx(const TrainedModel& model, const std::string& path);

}  // namespace segps

#endif  // SEGPS_WORKER_MODEL_MODEL_FILE_H_
