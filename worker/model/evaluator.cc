#include "worker/model/evaluator.h"

#include <algorithm>
#include <cmath>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/proto_json.h"
#include "common/shard_map.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/model/embedding_lookup.h"
#include "worker/model/segment_model.h"

namespace segps {

namespace {

// Runs segment k with `params` over `test`, calling fn(row, probabilities).
absl::Status ForEachPrediction(const v1::ModelConfig& config, int k, const Dataset& test, absl::Span<const float> params,
                               Backend* backend, const RowSource& source,
                               absl::FunctionRef<void(size_t, const float*)> fn) {
  const int classes = static_cast<int>(config.num_classes());
  const size_t n = test.size();
  const int batch = 1024;
  SEGPS_RETURN_IF_ERROR(test.MapRows({0, n}));
  absl::StatusOr<SegmentModel> model = SegmentModel::Create(backend, config, k, batch);
  if (!model.ok()) return model.status();
  if (params.size() != model->num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("evaluation: segment ", k, " has ", params.size(),
                                                   " parameters, expected ", model->num_params()));
  }
  SEGPS_RETURN_IF_ERROR(backend->Upload(params.data(), model->params(), params.size() * sizeof(float)));
  std::vector<float> probs(static_cast<size_t>(batch) * classes);
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::vector<int32_t> labels(batch);
  std::vector<float> x(static_cast<size_t>(batch) * test.width), input;
  const bool tables = config.segments(k).embeddings_size() > 0;
  if (tables && (source == nullptr || test.fields != static_cast<int>(config.categorical_fields()))) {
    return absl::FailedPreconditionError(absl::StrCat("evaluation: segment \"", config.segments(k).name(),
                                                      "\" has embedding tables, whose rows only the servers hold"));
  }
  std::optional<BatchRows> lookup;
  if (tables) lookup.emplace(config.segments(k), config.input_width(), test.fields);
  std::vector<uint64_t> ids(tables ? static_cast<size_t>(batch) * test.fields : 0);
  for (size_t begin = 0; begin < n; begin += batch) {
    const size_t rows = std::min<size_t>(batch, n - begin);
    GatherBatch(test, order, begin, rows, x.data(), labels.data());
    if (tables) {
      GatherIds(test, order, begin, rows, ids.data());
      lookup->Collect(ids.data(), rows);
      SEGPS_RETURN_IF_ERROR(source(k, lookup->ids(), lookup->mutable_values()));
      input.resize(rows * static_cast<size_t>(model->input_width()));
      lookup->FillInput(x.data(), input.data());
      SEGPS_RETURN_IF_ERROR(backend->Upload(input.data(), model->input(), input.size() * sizeof(float)));
    } else {
      SEGPS_RETURN_IF_ERROR(backend->Upload(x.data(), model->input(), rows * test.width * sizeof(float)));
    }
    SEGPS_RETURN_IF_ERROR(model->Predict(static_cast<int>(rows)));
    SEGPS_RETURN_IF_ERROR(backend->Download(model->probabilities(), probs.data(), rows * classes * sizeof(float)));
    SEGPS_RETURN_IF_ERROR(backend->Synchronize());
    for (size_t r = 0; r < rows; ++r) fn(begin + r, &probs[r * classes]);
  }
  return absl::OkStatus();
}

// Scores outputs (class probabilities, or a regression's predictions)
// against labels (or TargetBits) row by row.
class Scorer {
 public:
  Scorer(int classes, bool regression) : classes_(classes), regression_(regression) {}
  // One row: outputs `p` (float or double) and its label.
  template <typename T>
  void Add(const T* p, int32_t label) {
    if (regression_) {
      const double e = static_cast<double>(p[0]) - TargetOf(label);
      loss_ += e * e;
      absolute_ += std::fabs(e);
    } else {
      loss_ -= std::log(std::max(static_cast<double>(p[label]), 1e-12));
      absolute_ += std::max_element(p, p + classes_) - p == label;
    }
    ++samples_;
  }
  Score score(std::string name) const {
    const double n = std::max<double>(1, static_cast<double>(samples_));
    Score s{std::move(name), regression_ ? 0 : absolute_ / n, loss_ / n, std::nullopt, std::nullopt, std::nullopt};
    if (regression_) {
      s.rmse = std::sqrt(loss_ / n);
      s.mae = absolute_ / n;
    }
    return s;
  }

 private:
  int classes_;
  bool regression_;
  double loss_ = 0;
  double absolute_ = 0;  // correct predictions, or a regression's summed absolute error
  uint64_t samples_ = 0;
};

}  // namespace

Score ScoreRows(const v1::ModelConfig& model, absl::Span<const float> outputs, absl::Span<const int32_t> labels) {
  Scorer scorer(static_cast<int>(model.num_classes()), model.loss() == v1::MSE);
  for (size_t i = 0; i < labels.size(); ++i) scorer.Add(&outputs[i * model.num_classes()], labels[i]);
  return scorer.score("");
}

namespace {

// A CHAIN's probabilities [n x classes]: every stage in turn over each
// batch of `data`, each stage's output the next one's input.
absl::StatusOr<std::vector<double>> Chain(const v1::ModelConfig& config, const Dataset& data,
                                          const std::vector<std::vector<float>>& params, Backend* backend) {
  const int stages = config.segments_size();
  const int classes = static_cast<int>(config.num_classes());
  const size_t n = data.size();
  const int batch = 1024;
  SEGPS_RETURN_IF_ERROR(data.MapRows({0, n}));
  std::vector<SegmentModel> models;
  for (int k = 0; k < stages; ++k) {
    absl::StatusOr<SegmentModel> model = SegmentModel::Create(backend, config, k, batch);
    if (!model.ok()) return model.status();
    if (params[k].size() != model->num_params()) {
      return absl::InvalidArgumentError(absl::StrCat("evaluation: stage ", k, " has ", params[k].size(),
                                                     " parameters, expected ", model->num_params()));
    }
    SEGPS_RETURN_IF_ERROR(backend->Upload(params[k].data(), model->params(), params[k].size() * sizeof(float)));
    models.push_back(*std::move(model));
  }
  std::vector<double> out(n * classes);
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::vector<int32_t> labels(batch);
  std::vector<float> x(static_cast<size_t>(batch) * data.width), probs(static_cast<size_t>(batch) * classes);
  // Stage to stage through host buffers, one per link: each download into
  // one and upload from it are enqueued in order, and the buffer outlives
  // them, so the host neither waits between stages nor frees what a copy reads.
  std::vector<Buffer> carried;
  for (int k = 1; k < stages; ++k) {
    absl::StatusOr<Buffer> b =
        backend->AllocateHost(static_cast<size_t>(batch) * models[k].input_width() * sizeof(float));
    if (!b.ok()) return b.status();
    carried.push_back(*std::move(b));
  }
  for (size_t begin = 0; begin < n; begin += batch) {
    const size_t rows = std::min<size_t>(batch, n - begin);
    GatherBatch(data, order, begin, rows, x.data(), labels.data());
    SEGPS_RETURN_IF_ERROR(backend->Upload(x.data(), models[0].input(), rows * data.width * sizeof(float)));
    for (int k = 0; k < stages; ++k) {
      if (k > 0) {
        const size_t bytes = rows * static_cast<size_t>(models[k].input_width()) * sizeof(float);
        SEGPS_RETURN_IF_ERROR(backend->Download(models[k - 1].output(0), carried[k - 1].data(), bytes));
        SEGPS_RETURN_IF_ERROR(backend->Upload(carried[k - 1].data(), models[k].input(), bytes));
      }
      SEGPS_RETURN_IF_ERROR(k + 1 == stages ? models[k].Predict(static_cast<int>(rows))
                                            : models[k].StageForward(0, static_cast<int>(rows), 0.0f));
    }
    SEGPS_RETURN_IF_ERROR(backend->Download(models.back().probabilities(), probs.data(), rows * classes * sizeof(float)));
    SEGPS_RETURN_IF_ERROR(backend->Synchronize());
    for (size_t i = 0; i < rows * classes; ++i) out[begin * classes + i] = probs[i];
  }
  return out;
}

// The ensemble's probabilities [n x classes]: the mean of every segment's
// softmax outputs, summed in double; `each(k, row, p)` sees segment k's.
absl::StatusOr<std::vector<double>> Ensemble(const v1::ModelConfig& model, const Dataset& data,
                                             const std::vector<std::vector<float>>& params, Backend* backend,
                                             const RowSource& rows,
                                             absl::FunctionRef<void(int, size_t, const float*)> each) {
  const int segments = model.segments_size();
  const int classes = static_cast<int>(model.num_classes());
  if (params.size() != static_cast<size_t>(segments)) {
    return absl::InvalidArgumentError("evaluation: need parameters for every segment");
  }
  if (model.combine() == v1::CHAIN) return Chain(model, data, params, backend);
  std::vector<double> ensemble(data.size() * classes, 0.0);
  for (int k = 0; k < segments; ++k) {
    SEGPS_RETURN_IF_ERROR(ForEachPrediction(model, k, data, params[k], backend, rows, [&](size_t row, const float* p) {
      each(k, row, p);
      for (int c = 0; c < classes; ++c) ensemble[row * classes + c] += p[c] / segments;
    }));
  }
  return ensemble;
}

}  // namespace

absl::Status ComputedHere(const v1::ModelConfig& model) {
  for (const v1::SegmentConfig& segment : model.segments()) {
    if (DeclaredByTensors(segment)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "segment \"", segment.name(),
          "\" is declared by its tensors (a module trained from Python): its forward pass is the module's, which "
          "only PyTorch computes; load its parameters there (segps.torch, docs/python.md)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Predict(const v1::ModelConfig& model, const Dataset& data,
                                           const std::vector<std::vector<float>>& params, int segment,
                                           Backend* backend, const RowSource& rows) {
  SEGPS_RETURN_IF_ERROR(ComputedHere(model));
  const int classes = static_cast<int>(model.num_classes());
  std::vector<float> out(data.size() * classes);
  if (segment >= 0) {
    if (segment >= model.segments_size() || static_cast<size_t>(segment) >= params.size()) {
      return absl::InvalidArgumentError(absl::StrCat("prediction: no segment ", segment));
    }
    if (model.combine() == v1::CHAIN) {
      return absl::InvalidArgumentError(absl::StrCat("prediction: ", model.segments(segment).name(),
                                                     " is a stage of one network (combine: CHAIN), which predicts "
                                                     "only as a whole"));
    }
    SEGPS_RETURN_IF_ERROR(ForEachPrediction(model, segment, data, params[segment], backend, rows,
                                            [&](size_t row, const float* p) {
                                              std::copy_n(p, classes, &out[row * classes]);
                                            }));
    return out;
  }
  absl::StatusOr<std::vector<double>> ensemble =
      Ensemble(model, data, params, backend, rows, [](int, size_t, const float*) {});
  if (!ensemble.ok()) return ensemble.status();
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>((*ensemble)[i]);
  return out;
}

absl::StatusOr<EvalReport> Evaluate(const v1::JobConfig& config, const Dataset& test,
                                    const std::vector<std::vector<float>>& params, Backend* backend,
                                    const RowSource& rows) {
  SEGPS_RETURN_IF_ERROR(ComputedHere(config.model()));
  const int segments = config.model().segments_size();
  const int classes = static_cast<int>(config.model().num_classes());
  const size_t n = test.size();
  if (n == 0) return absl::InvalidArgumentError("evaluation: the test set is empty");
  const bool regression = config.model().loss() == v1::MSE;
  std::vector<Scorer> scorers(segments, Scorer(classes, regression));
  // Two classes: class 1's probability per segment, for the ROC AUC.
  std::vector<std::vector<float>> positive(classes == 2 ? segments : 0, std::vector<float>(n));
  absl::StatusOr<std::vector<double>> ensemble =
      Ensemble(config.model(), test, params, backend, rows, [&](int k, size_t row, const float* p) {
        scorers[k].Add(p, test.y[row]);
        if (classes == 2) positive[k][row] = p[1];
      });
  if (!ensemble.ok()) return ensemble.status();
  EvalReport report;
  report.samples = n;
  // A CHAIN's stages are parts of one network: only the whole is scored.
  const bool chain = config.model().combine() == v1::CHAIN;
  for (int k = 0; k < segments && !chain; ++k) {
    report.segments.push_back(scorers[k].score(config.model().segments(k).name()));
    if (classes == 2) report.segments.back().auc = RocAuc(positive[k], test.y);
  }
  Scorer scorer(classes, regression);
  std::vector<uint64_t> counts(classes, 0);
  double mean = 0, squares = 0;  // a regression's targets
  report.probabilities.resize(n * classes);
  for (size_t i = 0; i < n; ++i) {
    scorer.Add(&(*ensemble)[i * classes], test.y[i]);
    if (regression) {
      mean += TargetOf(test.y[i]);
      squares += double{TargetOf(test.y[i])} * TargetOf(test.y[i]);
    } else {
      counts[test.y[i]] += 1;
    }
  }
  for (size_t i = 0; i < report.probabilities.size(); ++i) {
    report.probabilities[i] = static_cast<float>((*ensemble)[i]);
  }
  report.ensemble = scorer.score(chain ? "chain" : "ensemble");
  if (classes == 2) {
    std::vector<float> p1(n);
    for (size_t i = 0; i < n; ++i) p1[i] = static_cast<float>((*ensemble)[i * 2 + 1]);
    report.ensemble.auc = RocAuc(p1, test.y);
  }
  mean /= static_cast<double>(n);
  report.chance = regression ? std::sqrt(std::max(0.0, squares / static_cast<double>(n) - mean * mean))
                             : static_cast<double>(*std::max_element(counts.begin(), counts.end())) / n;
  return report;
}

std::string ToJson(const v1::JobConfig& config, const EvalReport& report) {
  auto score = [](const Score& s) {
    if (s.rmse.has_value()) {
      return absl::StrFormat("{\"name\": \"%s\", \"rmse\": %.6f, \"mae\": %.6f, \"loss\": %.6f}", s.name, *s.rmse,
                             s.mae.value_or(0), s.loss);
    }
    return absl::StrFormat("{\"name\": \"%s\", \"accuracy\": %.6f, \"loss\": %.6f%s}", s.name, s.accuracy, s.loss,
                           s.auc.has_value() ? absl::StrFormat(", \"auc\": %.6f", *s.auc) : "");
  };
  std::string out = absl::StrFormat(
      "{\n  \"job\": \"%s\",\n  \"data_source\": \"%s\",\n  \"epochs\": %d,\n  \"test_samples\": %d,\n", config.name(),
      v1::DataSource_Name(config.data().source()), config.training().epochs(), report.samples);
  absl::StrAppend(&out, "  \"segments\": [");
  for (size_t k = 0; k < report.segments.size(); ++k) {
    absl::StrAppend(&out, k ? ", " : "", score(report.segments[k]));
  }
  absl::StrAppend(&out, "],\n");
  if (config.model().combine() == v1::CHAIN) {
    // The stages as cut (model.partition), with their layers and parameters.
    const ShardMap map = *ShardMap::Create(config.model(), 1);
    absl::StrAppend(&out, "  \"partition\": \"", v1::Partition_Name(config.model().partition()), "\",\n  \"stages\": [");
    for (int k = 0; k < config.model().segments_size(); ++k) {
      absl::StrAppend(&out, k ? ", " : "",
                      absl::StrFormat("{\"name\": \"%s\", \"layers\": %d, \"parameters\": %d}",
                                      config.model().segments(k).name(), config.model().segments(k).layers_size(),
                                      map.segment_size(k)));
    }
    absl::StrAppend(&out, "],\n");
  }
  absl::StrAppend(&out, "  \"ensemble\": ", score(report.ensemble), ",\n");
  absl::StrAppend(&out, config.model().loss() == v1::MSE ? "  \"baseline_rmse\": " : "  \"chance_accuracy\": ",
                  absl::StrFormat("%.6f", report.chance));
  if (report.history.workers_size() > 0) {
    absl::StrAppend(&out, ",\n  \"history\": ", ToJson(report.history));
  }
  absl::StrAppend(&out, "\n}\n");
  return out;
}

}  // namespace segps
