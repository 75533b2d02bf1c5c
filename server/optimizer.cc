#include "server/optimizer.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace segps {
namespace {

// Loops are written over raw pointers with restrict so that the compiler
// vectorises them: the server's speed is memory bandwidth.
class Sgd final : public Optimizer {
 public:
  Sgd(float lr, float wd) : lr_(lr), wd_(wd) {}
  void Apply(absl::Span<float> params, absl::Span<const float> grad) override {
    float* __restrict w = params.data();
    const float* __restrict g = grad.data();
    const size_t n = params.size();
    const float lr = lr_, wd = wd_;
    for (size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    ++steps_;
  }
  uint64_t steps() const override { return steps_; }
  uint64_t state_bytes() const override { return 0; }

 private:
  const float lr_, wd_;
  uint64_t steps_ = 0;
};

class Momentum final : public Optimizer {
 public:
  Momentum(float lr, float momentum, float wd, uint64_t n)
      : lr_(lr), momentum_(momentum), wd_(wd), velocity_(n, 0.0f) {}
  void Apply(absl::Span<float> params, absl::Span<const float> grad) override {
    float* __restrict w = params.data();
    const float* __restrict g = grad.data();
    float* __restrict v = velocity_.data();
    const size_t n = params.size();
    const float lr = lr_, mu = momentum_, wd = wd_;
    for (size_t i = 0; i < n; ++i) {
      v[i] = mu * v[i] - lr * (g[i] + wd * w[i]);
      w[i] += v[i];
    }
    ++steps_;
  }
  uint64_t steps() const override { return steps_; }
  uint64_t state_bytes() const override { return velocity_.size() * sizeof(float); }

 private:
  const float lr_, momentum_, wd_;
  std::vector<float> velocity_;
  uint64_t steps_ = 0;
};

// Keras Adam: m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
// w -= alpha * m / (sqrt(v) + eps) with alpha = lr sqrt(1 - b2^t) / (1 - b1^t).
class Adam final : public Optimizer {
 public:
  Adam(const v1::OptimizerConfig& c, uint64_t n)
      : lr_(c.learning_rate()), b1_(c.beta1()), b2_(c.beta2()), eps_(c.epsilon()),
        wd_(c.weight_decay()), m_(n, 0.0f), v_(n, 0.0f) {}
  void Apply(absl::Span<float> params, absl::Span<const float> grad) override {
    ++steps_;
    b1_power_ *= b1_;
    b2_power_ *= b2_;
    const float alpha =
        static_cast<float>(lr_ * std::sqrt(1.0 - b2_power_) / (1.0 - b1_power_));
    float* __restrict w = params.data();
    const float* __restrict g = grad.data();
    float* __restrict m = m_.data();
    float* __restrict v = v_.data();
    const size_t n = params.size();
    const float one_minus_b1 = 1.0f - b1_, one_minus_b2 = 1.0f - b2_, eps = eps_, wd = wd_;
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] + wd * w[i];
      m[i] += (gi - m[i]) * one_minus_b1;
      v[i] += (gi * gi - v[i]) * one_minus_b2;
      w[i] -= alpha * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
  uint64_t steps() const override { return steps_; }
  uint64_t state_bytes() const override { return (m_.size() + v_.size()) * sizeof(float); }

 private:
  const float lr_, b1_, b2_, eps_, wd_;
  double b1_power_ = 1.0, b2_power_ = 1.0;
  std::vector<float> m_, v_;
  uint64_t steps_ = 0;
};

class AdaGrad final : public Optimizer {
 public:
  AdaGrad(const v1::OptimizerConfig& c, uint64_t n)
      : lr_(c.learning_rate()), eps_(c.epsilon()), wd_(c.weight_decay()),
        accumulator_(n, c.initial_accumulator()) {}
  void Apply(absl::Span<float> params, absl::Span<const float> grad) override {
    float* __restrict w = params.data();
    const float* __restrict g = grad.data();
    float* __restrict a = accumulator_.data();
    const size_t n = params.size();
    const float lr = lr_, eps = eps_, wd = wd_;
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] + wd * w[i];
      a[i] += gi * gi;
      w[i] -= lr * gi / (std::sqrt(a[i]) + eps);
    }
    ++steps_;
  }
  uint64_t steps() const override { return steps_; }
  uint64_t state_bytes() const override { return accumulator_.size() * sizeof(float); }

 private:
  const float lr_, eps_, wd_;
  std::vector<float> accumulator_;
  uint64_t steps_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const v1::OptimizerConfig& c,
                                                           uint64_t n) {
  switch (c.kind()) {
    case v1::SGD:
      return std::make_unique<Sgd>(c.learning_rate(), c.weight_decay());
    case v1::MOMENTUM:
      return std::make_unique<Momentum>(c.learning_rate(), c.momentum(), c.weight_decay(), n);
    case v1::ADAM:
      return std::make_unique<Adam>(c, n);
    case v1::ADAGRAD:
      return std::make_unique<AdaGrad>(c, n);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer kind ", static_cast<int>(c.kind()), " is not supported"));
  }
}

}  // namespace segps
