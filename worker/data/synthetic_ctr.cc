#include "worker/data/synthetic_ctr.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/embedding.h"
#include "common/hash.h"

namespace segps {
namespace {

// A standard normal from two uniforms (Box-Muller).
double Normal(double u1, double u2) {
  return std::sqrt(-2.0 * std::log(std::max(u1, 1e-300))) * std::cos(6.283185307179586 * u2);
}

}  // namespace

TrainTest SyntheticCtr(const v1::JobConfig& config) {
  const v1::DataConfig& data = config.data();
  const int width = static_cast<int>(config.model().input_width());
  const int fields = static_cast<int>(config.model().categorical_fields());
  const uint64_t seed = data.data_seed();
  std::vector<double> vocab(fields), w(width);
  for (int f = 0; f < fields; ++f) {
    const uint64_t v = FieldVocab(config.model(), static_cast<uint32_t>(f));
    vocab[f] = static_cast<double>(v == 0 ? 1 : v);
  }
  std::mt19937_64 rng(Mix64(seed ^ 0xc7a));
  auto uniform = [&rng] { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); };
  for (double& wj : w) wj = Normal(uniform(), uniform()) / std::sqrt(std::max(width, 1));
  TrainTest out;
  for (auto [set, n] : {std::pair{&out.train, data.train_samples()}, std::pair{&out.test, data.test_samples()}}) {
    set->width = width;
    set->classes = 2;
    set->fields = fields;
    set->x.resize(static_cast<size_t>(n) * width);
    set->ids.resize(static_cast<size_t>(n) * fields);
    set->y.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      float* x = &set->x[static_cast<size_t>(i) * width];
      double z = -0.5;
      for (int j = 0; j < width; ++j) {
        x[j] = static_cast<float>(Normal(uniform(), uniform()));
        z += 0.3 * w[j] * x[j];
      }
      for (int f = 0; f < fields; ++f) {
        const uint64_t id = std::min(static_cast<uint64_t>(std::pow(vocab[f] + 1, uniform())) - 1,
                                     static_cast<uint64_t>(vocab[f]) - 1);
        set->ids[static_cast<size_t>(i) * fields + f] = id;
        z += Normal(UniformFromKey(seed, 1, f, id), UniformFromKey(seed, 2, f, id));
      }
      set->y[i] = uniform() < 1.0 / (1.0 + std::exp(-z)) ? 1 : 0;
    }
  }
  return out;
}

double RocAuc(const std::vector<float>& scores, const std::vector<int32_t>& labels) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: the positives' mean rank among all, ties sharing their mean rank.
  double positive_ranks = 0;
  uint64_t positives = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double rank = (static_cast<double>(i) + static_cast<double>(j) + 1) / 2;  // 1-based mean
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] == 1) {
        positive_ranks += rank;
        ++positives;
      }
    }
    i = j;
  }
  const uint64_t negatives = labels.size() - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  const double p = static_cast<double>(positives);
  return (positive_ranks - p * (p + 1) / 2) / (p * static_cast<double>(negatives));
}

}  // namespace segps
