#include "worker/evaluator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/segment_model.h"

namespace segps {

absl::StatusOr<EvalReport> Evaluate(const v1::JobConfig& config, const Dataset& test,
                                    const std::vector<std::vector<float>>& params, Backend* backend) {
  const int segments = config.model().segments_size();
  const int classes = static_cast<int>(config.model().num_classes());
  const size_t n = test.size();
  if (n == 0) return absl::InvalidArgumentError("evaluation: the test set is empty");
  if (params.size() != static_cast<size_t>(segments)) {
    return absl::InvalidArgumentError("evaluation: need parameters for every segment");
  }
  const int batch = 1024;
  std::vector<double> ensemble(n * classes, 0.0);
  EvalReport report;
  report.samples = n;
  for (int k = 0; k < segments; ++k) {
    absl::StatusOr<SegmentModel> model = SegmentModel::Create(backend, config.model(), k, batch);
    if (!model.ok()) return model.status();
    if (params[k].size() != model->num_params()) {
      return absl::InvalidArgumentError(absl::StrCat("evaluation: segment ", k, " has ", params[k].size(),
                                                     " parameters, expected ", model->num_params()));
    }
    SEGPS_RETURN_IF_ERROR(backend->Upload(params[k].data(), model->params(), params[k].size() * sizeof(float)));
    Score score;
    score.name = config.model().segments(k).name();
    std::vector<float> probs(static_cast<size_t>(batch) * classes);
    std::vector<uint32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
    std::vector<int32_t> labels(batch);
    std::vector<float> x(static_cast<size_t>(batch) * test.width);
    double loss = 0;
    uint64_t correct = 0;
    for (size_t begin = 0; begin < n; begin += batch) {
      const size_t rows = std::min<size_t>(batch, n - begin);
      GatherBatch(test, order, begin, rows, x.data(), labels.data());
      SEGPS_RETURN_IF_ERROR(backend->Upload(x.data(), model->input(), rows * test.width * sizeof(float)));
      SEGPS_RETURN_IF_ERROR(model->Predict(static_cast<int>(rows)));
      SEGPS_RETURN_IF_ERROR(backend->Download(model->probabilities(), probs.data(), rows * classes * sizeof(float)));
      SEGPS_RETURN_IF_ERROR(backend->Synchronize());
      for (size_t r = 0; r < rows; ++r) {
        const float* p = &probs[r * classes];
        const int y = labels[r];
        loss -= std::log(std::max(static_cast<double>(p[y]), 1e-12));
        correct += std::max_element(p, p + classes) - p == y;
        for (int c = 0; c < classes; ++c) ensemble[(begin + r) * classes + c] += p[c] / segments;
      }
    }
    score.accuracy = static_cast<double>(correct) / n;
    score.loss = loss / n;
    report.segments.push_back(score);
  }
  double loss = 0;
  uint64_t correct = 0;
  std::vector<uint64_t> counts(classes, 0);
  for (size_t i = 0; i < n; ++i) {
    const double* p = &ensemble[i * classes];
    const int y = test.y[i];
    loss -= std::log(std::max(p[y], 1e-12));
    correct += std::max_element(p, p + classes) - p == y;
    counts[y] += 1;
  }
  report.ensemble = {"ensemble", static_cast<double>(correct) / n, loss / n};
  report.chance = static_cast<double>(*std::max_element(counts.begin(), counts.end())) / n;
  return report;
}

std::string ToJson(const v1::JobConfig& config, const EvalReport& report) {
  auto score = [](const Score& s) {
    return absl::StrFormat("{\"name\": \"%s\", \"accuracy\": %.6f, \"loss\": %.6f}", s.name, s.accuracy, s.loss);
  };
  std::string out = absl::StrFormat("{\n  \"job\": \"%s\",\n  \"data_source\": \"%s\",\n  \"test_samples\": %d,\n",
                                    config.name(), v1::DataSource_Name(config.data().source()), report.samples);
  absl::StrAppend(&out, "  \"segments\": [");
  for (size_t k = 0; k < report.segments.size(); ++k) {
    absl::StrAppend(&out, k ? ", " : "", score(report.segments[k]));
  }
  absl::StrAppend(&out, "],\n  \"ensemble\": ", score(report.ensemble), ",\n");
  absl::StrAppend(&out, absl::StrFormat("  \"chance_accuracy\": %.6f\n}\n", report.chance));
  return out;
}

}  // namespace segps
