// Evaluates trained segments on a test set, alone and as the ensemble the
// config describes (the average of the segments' softmax outputs).
#ifndef SEGPS_WORKER_MODEL_EVALUATOR_H_
#define SEGPS_WORKER_MODEL_EVALUATOR_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/report.pb.h"
#include "worker/model/backend.h"
#include "worker/data/dataset.h"

namespace segps {

struct Score {
  std::string name;
  double accuracy = 0;
  double loss = 0;  // mean cross-entropy (loss MSE: mean squared error)
  std::optional<double> auc;  // two classes: ROC AUC of class 1's probability
  std::optional<double> rmse, mae;  // a regression's (loss MSE), where accuracy means nothing
};

// A score's second figure beside its loss, and its name in logs: the
// accuracy ("acc"), or under loss MSE the mean absolute error ("mae").
inline double SecondStat(const Score& s) { return s.mae.value_or(s.accuracy); }
inline const char* SecondStatName(const v1::ModelConfig& model) { return model.loss() == v1::MSE ? "mae" : "acc"; }

// The score of `outputs` [labels.size() x num_classes] against `labels`, by
// the model's loss: mean cross-entropy and accuracy, or MSE, RMSE and MAE.
Score ScoreRows(const v1::ModelConfig& model, absl::Span<const float> outputs, absl::Span<const int32_t> labels);

// A segment's embedding rows for scoring: per table of segment `segment`,
// the rows of the distinct `ids` into `values` (ids x dim each), as
// ParameterClient::PullRows reads them. Null: no segment has tables.
using RowSource = std::function<absl::Status(int segment, const std::vector<std::vector<uint64_t>>& ids,
                                             std::vector<std::vector<float>>* values)>;

struct EvalReport {
  std::vector<Score> segments;
  Score ensemble;
  uint64_t samples = 0;
  // Accuracy of guessing the most frequent test label; under loss MSE the
  // RMSE of predicting the test targets' mean (their standard deviation).
  double chance = 0;
  std::vector<float> probabilities;  // the ensemble's, [samples x classes]
  v1::RunHistory history;            // per epoch, where the workers kept it
};

// OK where every segment is computed from its layers; a segment declared
// by its tensors is refused, naming it (Evaluate and Predict check it).
absl::Status ComputedHere(const v1::ModelConfig& model);

// `params[k]` holds segment k's flat parameters.
absl::StatusOr<EvalReport> Evaluate(const v1::JobConfig& config, const Dataset& test,
                                    const std::vector<std::vector<float>>& params, Backend* backend,
                                    const RowSource& rows = nullptr);

// Class probabilities [data.size() x num_classes], row-major, of segment
// `segment` alone, or (segment -1) of the ensemble: the mean of every
// segment's softmax outputs, summed in double, exactly as Evaluate scores it.
absl::StatusOr<std::vector<float>> Predict(const v1::ModelConfig& model, const Dataset& data,
                                           const std::vector<std::vector<float>>& params, int segment,
                                           Backend* backend, const RowSource& rows = nullptr);

// The report as JSON (for files and tools).
std::string ToJson(const v1::JobConfig& config, const EvalReport& report);

}  // namespace segps

#endif  // SEGPS_WORKER_MODEL_EVALUATOR_H_
