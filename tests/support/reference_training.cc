#include "tests/support/reference_training.h"

#include <gtest/gtest.h>

#include <cmath>

#include "absl/functional/function_ref.h"

#include "common/config.h"
#include "common/embedding.h"
#include "common/shard_map.h"
#include "server/optimizer.h"
#include "worker/model/backend.h"
#include "worker/model/segment_model.h"

namespace segps {
namespace {

// The gradient (a mean) of `rows` samples from `order[begin]` at `params`.
void Gradient(Backend* backend, SegmentModel& model, const Dataset& train, const std::vector<uint32_t>& order,
              uint64_t begin, size_t rows, const std::vector<float>& params, std::vector<float>* grad) {
  std::vector<float> x(rows * train.width);
  std::vector<int32_t> y(rows);
  GatherBatch(train, order, begin, rows, x.data(), y.data());
  EXPECT_TRUE(backend->Upload(params.data(), model.params(), params.size() * sizeof(float)).ok());
  EXPECT_TRUE(backend->Upload(x.data(), model.input(), x.size() * sizeof(float)).ok());
  EXPECT_TRUE(backend->Upload(y.data(), model.labels(), y.size() * sizeof(int32_t)).ok());
  EXPECT_TRUE(model.TrainStep(static_cast<int>(rows)).ok());
  EXPECT_TRUE(backend->Download(model.grad(), grad->data(), grad->size() * sizeof(float)).ok());
}

// Calls fn(order, begin, rows) for each batch one worker of segment k
// computes, in order: every epoch's order of its slice, batch by batch.
void ForEachBatch(const v1::JobConfig& config, const Dataset& train, int k,
                  absl::FunctionRef<void(const std::vector<uint32_t>&, uint64_t, size_t)> fn) {
  const uint32_t batch = config.training().batch_size();
  const Range slice = WorkerSlice(config, train.size(), k, 0);
  for (uint32_t epoch = 0; epoch < config.training().epochs(); ++epoch) {
    const std::vector<uint32_t> order = EpochOrder(slice, config.seed(), k, 0, epoch);
    for (uint64_t begin = 0; begin < slice.count; begin += batch) {
      fn(order, begin, std::min<size_t>(batch, slice.count - begin));
    }
  }
}

}  // namespace

std::vector<std::vector<float>> TrainReference(const v1::JobConfig& config, const Dataset& train) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  ShardMap map = *ShardMap::Create(config.model(), 1);
  const uint32_t batch = config.training().batch_size();
  std::vector<std::vector<float>> result;
  for (int k = 0; k < map.num_segments(); ++k) {
    std::vector<float> params(map.segment_size(k)), grad(params.size());
    InitializeRange(map, k, 0, config.seed(), params.data(), params.size());
    std::unique_ptr<Optimizer> optimizer = *CreateOptimizer(config.optimizer(), params.size());
    SegmentModel model = *SegmentModel::Create(backend.get(), config.model(), k, static_cast<int>(batch));
    uint64_t step = 0;
    ForEachBatch(config, train, k, [&](const std::vector<uint32_t>& order, uint64_t begin, size_t rows) {
      Gradient(backend.get(), model, train, order, begin, rows, params, &grad);
      optimizer->Apply(++step, 0, absl::MakeSpan(params), grad, 1.0f);
    });
    result.push_back(std::move(params));
  }
  return result;
}

std::vector<std::vector<float>> TrainBalancedReference(const v1::JobConfig& config, const Dataset& train) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  ShardMap map = *ShardMap::Create(config.model(), 1);
  const uint32_t batch = config.training().batch_size();
  std::vector<std::vector<float>> result;
  for (int k = 0; k < map.num_segments(); ++k) {
    const uint32_t clock_samples = batch * WorkersOf(config, k);
    std::vector<float> params(map.segment_size(k)), grad(params.size());
    InitializeRange(map, k, 0, config.seed(), params.data(), params.size());
    std::unique_ptr<Optimizer> optimizer = *CreateOptimizer(config.optimizer(), params.size());
    SegmentModel model = *SegmentModel::Create(backend.get(), config.model(), k, static_cast<int>(clock_samples));
    const Range rows_of_segment = SegmentRows(config, train.size(), k);
    uint64_t step = 0;
    for (uint32_t epoch = 0; epoch < config.training().epochs(); ++epoch) {
      const std::vector<uint32_t> order = EpochOrder(rows_of_segment, config.seed(), k, kWholeSegment, epoch);
      for (uint64_t begin = 0; begin < rows_of_segment.count; begin += clock_samples) {
        const size_t rows = std::min<size_t>(clock_samples, rows_of_segment.count - begin);
        Gradient(backend.get(), model, train, order, begin, rows, params, &grad);
        // The workers' pushes of one clock, each weighted by its samples
        // over batch_size, sum to the clock's mean gradient times rows / batch_size.
        optimizer->Apply(++step, 0, absl::MakeSpan(params), grad,
                         static_cast<float>(rows) / static_cast<float>(batch));
      }
    }
    result.push_back(std::move(params));
  }
  return result;
}

std::vector<std::vector<float>> TrainChainReference(const v1::JobConfig& config, const Dataset& train) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  const ShardMap map = *ShardMap::Create(config.model(), 1);
  v1::ModelConfig whole;
  whole.set_input_width(config.model().input_width());
  whole.set_num_classes(config.model().num_classes());
  whole.set_combine(v1::AVERAGE_SOFTMAX);
  v1::SegmentConfig* network = whole.add_segments();
  network->set_name("whole");
  std::vector<float> params;
  for (int k = 0; k < map.num_segments(); ++k) {
    for (const v1::LayerConfig& layer : config.model().segments(k).layers()) *network->add_layers() = layer;
    std::vector<float> stage(map.segment_size(k));
    InitializeRange(map, k, 0, config.seed(), stage.data(), stage.size());
    params.insert(params.end(), stage.begin(), stage.end());
  }
  const uint32_t batch = config.training().batch_size();
  std::vector<float> grad(params.size());
  std::unique_ptr<Optimizer> optimizer = *CreateOptimizer(config.optimizer(), params.size());
  SegmentModel model = *SegmentModel::Create(backend.get(), whole, 0, static_cast<int>(batch));
  const Range slice = WorkerSlice(config, train.size(), 0, 0);
  uint64_t step = 0;
  for (uint32_t epoch = 0; epoch < config.training().epochs(); ++epoch) {
    const std::vector<uint32_t> order = EpochOrder(slice, config.seed(), 0, 0, epoch);
    for (uint64_t begin = 0; begin < slice.count; begin += batch) {
      const size_t rows = std::min<size_t>(batch, slice.count - begin);
      Gradient(backend.get(), model, train, order, begin, rows, params, &grad);
      optimizer->Apply(++step, 0, absl::MakeSpan(params), grad, 1.0f);
    }
  }
  std::vector<std::vector<float>> stages;
  size_t at = 0;
  for (int k = 0; k < map.num_segments(); ++k) {
    stages.emplace_back(params.begin() + at, params.begin() + at + map.segment_size(k));
    at += map.segment_size(k);
  }
  return stages;
}

namespace {

// Sample r's input: its features, then each table's row per field.
void ReferenceInput(const v1::SegmentConfig& seg, const Dataset& train, uint32_t row,
                    std::vector<std::map<uint64_t, std::vector<float>>>& tables, uint64_t seed, int k, float* out) {
  train.CopyRow(row, out);
  out += train.width;
  for (int t = 0; t < seg.embeddings_size(); ++t) {
    for (uint32_t field : seg.embeddings(t).field()) {
      const uint64_t id = train.ids[static_cast<size_t>(row) * train.fields + field];
      std::vector<float>& values = tables[t][id];
      if (values.empty()) {
        values.resize(seg.embeddings(t).dim());
        InitialRow(seed, k, static_cast<uint32_t>(t), id, absl::MakeSpan(values));
      }
      out = std::copy(values.begin(), values.end(), out);
    }
  }
}

// Each touched row's gradient: the sum over the input columns that used it.
std::vector<std::map<uint64_t, std::vector<double>>> SumRowGradients(const v1::SegmentConfig& seg,
                                                                     const Dataset& train,
                                                                     const std::vector<uint32_t>& order,
                                                                     uint64_t begin, size_t rows,
                                                                     const std::vector<float>& input_grad,
                                                                     size_t width) {
  std::vector<std::map<uint64_t, std::vector<double>>> row_grads(seg.embeddings_size());
  for (size_t r = 0; r < rows; ++r) {
    size_t column = static_cast<size_t>(train.width);
    for (int t = 0; t < seg.embeddings_size(); ++t) {
      for (uint32_t field : seg.embeddings(t).field()) {
        const uint64_t id = train.ids[static_cast<size_t>(order[begin + r]) * train.fields + field];
        std::vector<double>& g = row_grads[t][id];
        g.resize(seg.embeddings(t).dim(), 0.0);
        for (double& gj : g) gj += input_grad[r * width + column++];
      }
    }
  }
  return row_grads;
}

// SGD or AdaGrad on each touched row, as their formulas say.
void ApplyRowGradients(const v1::OptimizerConfig& opt,
                       const std::vector<std::map<uint64_t, std::vector<double>>>& row_grads,
                       std::vector<std::map<uint64_t, std::vector<float>>>* tables,
                       std::vector<std::map<uint64_t, std::vector<float>>>* accumulators) {
  for (size_t t = 0; t < row_grads.size(); ++t) {
    for (const auto& [id, g] : row_grads[t]) {
      std::vector<float>& w = (*tables)[t][id];
      std::vector<float>& a = (*accumulators)[t][id];
      a.resize(w.size(), opt.initial_accumulator());
      for (size_t j = 0; j < w.size(); ++j) {
        const float gj = static_cast<float>(g[j]);
        if (opt.kind() == v1::ADAGRAD) {
          a[j] += gj * gj;
          w[j] -= opt.learning_rate() * gj / (std::sqrt(a[j]) + opt.epsilon());
        } else {
          w[j] -= opt.learning_rate() * gj;
        }
      }
    }
  }
}

}  // namespace

EmbeddingReference TrainEmbeddingReference(const v1::JobConfig& config, const Dataset& train, int k) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  const ShardMap map = *ShardMap::Create(config.model(), 1);
  const v1::SegmentConfig& seg = config.model().segments(k);
  const v1::OptimizerConfig& opt = config.optimizer();
  const uint32_t batch = config.training().batch_size();
  EmbeddingReference ref;
  ref.params.resize(map.segment_size(k));
  ref.tables.resize(seg.embeddings_size());
  std::vector<std::map<uint64_t, std::vector<float>>> accumulators(seg.embeddings_size());
  InitializeRange(map, k, 0, config.seed(), ref.params.data(), ref.params.size());
  std::vector<float> grad(ref.params.size());
  std::unique_ptr<Optimizer> optimizer = *CreateOptimizer(opt, ref.params.size());
  SegmentModel model = *SegmentModel::Create(backend.get(), config.model(), k, static_cast<int>(batch));
  const size_t width = static_cast<size_t>(model.input_width());
  uint64_t step = 0;
  ForEachBatch(config, train, k, [&](const std::vector<uint32_t>& order, uint64_t begin, size_t rows) {
    std::vector<float> x(rows * width), input_grad(rows * width);
    std::vector<int32_t> y(rows);
    for (size_t r = 0; r < rows; ++r) {
      ReferenceInput(seg, train, order[begin + r], ref.tables, config.seed(), k, &x[r * width]);
      y[r] = train.y[order[begin + r]];
    }
    EXPECT_TRUE(backend->Upload(ref.params.data(), model.params(), ref.params.size() * sizeof(float)).ok());
    EXPECT_TRUE(backend->Upload(x.data(), model.input(), x.size() * sizeof(float)).ok());
    EXPECT_TRUE(backend->Upload(y.data(), model.labels(), y.size() * sizeof(int32_t)).ok());
    EXPECT_TRUE(model.StageForward(0, static_cast<int>(rows), 1.0f / static_cast<float>(rows)).ok());
    EXPECT_TRUE(model.StageBackward(0, static_cast<int>(rows), false, true).ok());
    EXPECT_TRUE(backend->Download(model.grad(), grad.data(), grad.size() * sizeof(float)).ok());
    EXPECT_TRUE(backend->Download(model.input_grad(0), input_grad.data(), input_grad.size() * sizeof(float)).ok());
    optimizer->Apply(++step, 0, absl::MakeSpan(ref.params), grad, 1.0f);
    ApplyRowGradients(opt, SumRowGradients(seg, train, order, begin, rows, input_grad, width), &ref.tables,
                      &accumulators);
  });
  return ref;
}

double MaxRelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::abs(static_cast<double>(b[i]))));
  }
  return worst;
}

}  // namespace segps
