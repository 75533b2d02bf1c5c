#include "server/optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_wire.h"

namespace segps {
namespace {

// Loops are written over raw pointers with restrict so that the compiler
// vectorises them: the server's speed is memory bandwidth. The update
// kernels are SEGPS_VECTOR_CLONES (optimizer.h).

SEGPS_VECTOR_CLONES void SgdKernel(float* __restrict w, const float* __restrict g, size_t n, float lr, float wd) {
  for (size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
}

// The moments are interleaved (m0 v0 m1 v1 ...): three memory streams
// instead of four keep the hardware prefetchers ahead.
SEGPS_VECTOR_CLONES void AdamKernel(float* __restrict w, const float* __restrict g, float* __restrict mv,
                                    size_t n, float alpha, float one_minus_b1, float one_minus_b2, float eps,
                                    float wd) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * w[i];
    const float m = mv[2 * i] + (gi - mv[2 * i]) * one_minus_b1;
    const float v = mv[2 * i + 1] + (gi * gi - mv[2 * i + 1]) * one_minus_b2;
    mv[2 * i] = m;
    mv[2 * i + 1] = v;
    w[i] -= alpha * m / (std::sqrt(v) + eps);
  }
}
// w - c * m / (sqrt(v) + eps) over interleaved moments: Adam's drift.
SEGPS_VECTOR_CLONES void AdamDriftKernel(const float* __restrict w, const float* __restrict mv, float* __restrict out,
                                         size_t n, float c, float eps) {
  for (size_t i = 0; i < n; ++i) out[i] = w[i] - c * mv[2 * i] / (std::sqrt(mv[2 * i + 1]) + eps);
}

// Drift is geometric in the momentum decay; past this many updates the
// remaining terms are below float precision for any decay in [0, 0.99].
constexpr uint64_t kMaxDriftUpdates = 4096;

// Half of float32's largest value: what a bound may reach, leaving room for
// the rounding of the float arithmetic it bounds.
constexpr double kLimit = std::numeric_limits<float>::max() / 2.0;

// The first of `bounds` (what, bound) beyond kLimit, as a refusal.
absl::Status Within(float max_abs, std::initializer_list<std::pair<const char*, double>> bounds) {
  for (const auto& [what, bound] : bounds) {
    if (!(bound <= kLimit)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Push gradient: its largest element, ", max_abs, ", could take ", what, " to ", bound,
          ", beyond float32's range; refused, nothing was applied (a worker whose loss explodes: lower "
          "optimizer.learning_rate)"));
    }
  }
  return absl::OkStatus();
}

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const v1::OptimizerConfig& c) : Optimizer(c), wd_(c.weight_decay()) {}
  void Apply(uint64_t step, uint64_t, absl::Span<float> params, absl::Span<const float> grad, float scale) override {
    SgdKernel(params.data(), grad.data(), params.size(), Rate(step) * scale, wd_);
  }
  // w - lr (g + wd w)
  absl::Status Grow(uint64_t step, float max_abs, float scale) override {
    const double g = max_abs + double{wd_} * w_, w = w_ + double{Rate(step)} * scale * g;
    SEGPS_RETURN_IF_ERROR(Within(max_abs, {{"the weight-decayed gradient", g}, {"the parameters", w}}));
    w_ = w;
    return absl::OkStatus();
  }
  void Bound(absl::Span<const float> params) override { w_ = MaxMagnitude(params); }

 private:
  const float wd_;
  double w_ = 0;  // bound on |parameter|
};

class Momentum final : public Optimizer {
 public:
  Momentum(const v1::OptimizerConfig& c, uint64_t n)
      : Optimizer(c), momentum_(c.momentum()), wd_(c.weight_decay()), velocity_(n, 0.0f) {}
  void Apply(uint64_t step, uint64_t first, absl::Span<float> params, absl::Span<const float> grad,
             float scale) override {
    float* __restrict w = params.data();
    const float* __restrict g = grad.data();
    float* __restrict v = velocity_.data() + first;
    const size_t n = params.size();
    const float lr = Rate(step) * scale, mu = momentum_, wd = wd_;
    for (size_t i = 0; i < n; ++i) {
      v[i] = mu * v[i] - lr * (g[i] + wd * w[i]);
      w[i] += v[i];
    }
  }
  // With no gradient the velocity decays by mu each update: w + (mu + ... + mu^k) v.
  void Extrapolate(uint64_t, uint64_t updates, uint64_t first, absl::Span<const float> params,
                   absl::Span<float> out) const override {
    const double mu = momentum_;
    const float c = static_cast<float>(mu * (1.0 - std::pow(mu, static_cast<double>(updates))) / (1.0 - mu));
    const float* __restrict w = params.data();
    const float* __restrict v = velocity_.data() + first;
    float* __restrict o = out.data();
    for (size_t i = 0; i < params.size(); ++i) o[i] = w[i] + c * v[i];
  }
  // v = mu v - lr (g + wd w); w + v
  absl::Status Grow(uint64_t step, float max_abs, float scale) override {
    const double g = max_abs + double{wd_} * w_;
    const double v = double{momentum_} * v_ + double{Rate(step)} * scale * g, w = w_ + v;
    SEGPS_RETURN_IF_ERROR(Within(
        max_abs, {{"the weight-decayed gradient", g}, {"the momentum", v}, {"the parameters", w}}));
    v_ = v;
    w_ = w;
    return absl::OkStatus();
  }
  void Bound(absl::Span<const float> params) override {
    w_ = MaxMagnitude(params);
    v_ = MaxMagnitude(velocity_);
  }
  std::vector<std::string> SlotNames() const override { return {"momentum"}; }
  void SaveState(std::vector<std::vector<float>>* slots) const override { *slots = {velocity_}; }
  void LoadState(const std::vector<std::vector<float>>& slots) override { velocity_ = slots[0]; }

 private:
  const float momentum_, wd_;
  std::vector<float> velocity_;
  double w_ = 0, v_ = 0;  // bounds on |parameter| and |velocity|
};

// Keras Adam: m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
// w -= alpha * m / (sqrt(v) + eps) with alpha = lr sqrt(1 - b2^t) / (1 - b1^t).
class Adam final : public Optimizer {
 public:
  Adam(const v1::OptimizerConfig& c, uint64_t n)
      : Optimizer(c), b1_(c.beta1()), b2_(c.beta2()), eps_(c.epsilon()), wd_(c.weight_decay()),
        moments_(2 * n, 0.0f) {}
  void Apply(uint64_t step, uint64_t first, absl::Span<float> params, absl::Span<const float> grad, float scale) override {
    // An update comes in blocks, which reuse its factor (two pow calls cost
    // about 2% of a block's update). The cache is per thread: parts of one
    // update run on several threads at once.
    thread_local struct {
      uint64_t optimizer = 0, step = 0;
      float alpha = 0;
    } cache;
    if (cache.optimizer != id_ || cache.step != step) {
      const double t = static_cast<double>(step);
      cache = {id_, step, static_cast<float>(Alpha(t))};
    }
    AdamKernel(params.data(), grad.data(), moments_.data() + 2 * first, params.size(), cache.alpha * scale, 1.0f - b1_,
               1.0f - b2_, eps_, wd_);
  }
  // With no gradient m decays by b1 each update and v by b2; v is held at
  // its value (b2^k is within 1% of 1 for the few updates a pull looks ahead):
  // w - (alpha_{t+1} b1 + ... + alpha_{t+k} b1^k) m / (sqrt(v) + eps).
  void Extrapolate(uint64_t applied, uint64_t updates, uint64_t first, absl::Span<const float> params,
                   absl::Span<float> out) const override {
    double c = 0, b1_power = 1;
    for (uint64_t j = 1; j <= std::min(updates, kMaxDriftUpdates); ++j) {
      const double t = static_cast<double>(applied + j);
      b1_power *= b1_;
      c += b1_power * Alpha(t);
    }
    AdamDriftKernel(params.data(), moments_.data() + 2 * first, out.data(), params.size(), static_cast<float>(c),
                    eps_);
  }
  // g' = g + wd w; m + (g' - m)(1 - b1) and v + (g'^2 - v)(1 - b2), each
  // between its old value and g' (g'^2); w - alpha m / (sqrt(v) + eps),
  // the step at most alpha |m| / eps.
  absl::Status Grow(uint64_t step, float max_abs, float scale) override {
    const double g = max_abs + double{wd_} * w_, g2 = g * g;
    const double m = std::max(m_, g), v = std::max(v_, g2);
    const double t = static_cast<double>(std::max<uint64_t>(step, 1));
    const double w = w_ + Alpha(t) * scale * m / eps_;
    SEGPS_RETURN_IF_ERROR(Within(max_abs, {{"the weight-decayed gradient", g},
                                           {"g - m in the first moment", g + m_},
                                           {"the squared gradient", g2},
                                           {"g^2 - v in the second moment", g2 + v_},
                                           {"the parameters", w}}));
    m_ = m;
    v_ = v;
    w_ = w;
    return absl::OkStatus();
  }
  void Bound(absl::Span<const float> params) override {
    w_ = MaxMagnitude(params);
    m_ = v_ = 0;
    for (size_t i = 0; i < moments_.size(); i += 2) {
      m_ = std::max(m_, double{std::fabs(moments_[i])});
      v_ = std::max(v_, double{std::fabs(moments_[i + 1])});
    }
  }
  std::vector<std::string> SlotNames() const override { return {"adam_m", "adam_v"}; }
  void SaveState(std::vector<std::vector<float>>* slots) const override {
    const size_t n = moments_.size() / 2;
    slots->assign(2, std::vector<float>(n));
    float* __restrict m = (*slots)[0].data();
    float* __restrict v = (*slots)[1].data();
    for (size_t i = 0; i < n; ++i) {
      m[i] = moments_[2 * i];
      v[i] = moments_[2 * i + 1];
    }
  }
  void LoadState(const std::vector<std::vector<float>>& slots) override {
    for (size_t i = 0; i < slots[0].size(); ++i) {
      moments_[2 * i] = slots[0][i];
      moments_[2 * i + 1] = slots[1][i];
    }
  }

 private:
  // The step size of update number t, bias corrections included.
  double Alpha(double t) const {
    return double{Rate(static_cast<uint64_t>(t))} * std::sqrt(1.0 - std::pow(b2_, t)) / (1.0 - std::pow(b1_, t));
  }

  static inline std::atomic<uint64_t> next_id_{1};
  const uint64_t id_ = next_id_++;  // names this optimizer in the per-thread cache
  const double b1_, b2_;
  const float eps_, wd_;
  std::vector<float> moments_;  // m and v interleaved
  double w_ = 0, m_ = 0, v_ = 0;  // bounds on |parameter|, |m| and v
};

class AdaGrad final : public Optimizer {
 public:
  AdaGrad(const v1::OptimizerConfig& c, uint64_t n)
      : Optimizer(c), eps_(c.epsilon()), wd_(c.weight_decay()), accumulator_(n, c.initial_accumulator()) {}
  void Apply(uint64_t step, uint64_t first, absl::Span<float> params, absl::Span<const float> grad,
             float scale) override {
    float* __restrict w = params.data();
    const float* __restrict g = grad.data();
    float* __restrict a = accumulator_.data() + first;
    const size_t n = params.size();
    const float lr = Rate(step) * scale, eps = eps_, wd = wd_;
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] + wd * w[i];
      a[i] += gi * gi;
      w[i] -= lr * gi / (std::sqrt(a[i]) + eps);
    }
  }
  // g' = g + wd w; a + g'^2; w - lr g' / (sqrt(a) + eps), the step at
  // most lr since a >= g'^2.
  absl::Status Grow(uint64_t step, float max_abs, float scale) override {
    const double g = max_abs + double{wd_} * w_, g2 = g * g;
    const double a = a_ + g2, w = w_ + double{Rate(step)} * scale;
    SEGPS_RETURN_IF_ERROR(Within(max_abs, {{"the weight-decayed gradient", g},
                                           {"the squared gradient", g2},
                                           {"the accumulator", a},
                                           {"the parameters", w}}));
    a_ = a;
    w_ = w;
    return absl::OkStatus();
  }
  void Bound(absl::Span<const float> params) override {
    w_ = MaxMagnitude(params);
    a_ = MaxMagnitude(accumulator_);
  }
  std::vector<std::string> SlotNames() const override { return {"adagrad_accumulator"}; }
  void SaveState(std::vector<std::vector<float>>* slots) const override { *slots = {accumulator_}; }
  void LoadState(const std::vector<std::vector<float>>& slots) override { accumulator_ = slots[0]; }

 private:
  const float eps_, wd_;
  std::vector<float> accumulator_;
  double w_ = 0, a_ = 0;  // bounds on |parameter| and the accumulator
};

}  // namespace

float ScheduledRate(const v1::OptimizerConfig& c, uint64_t step) {
  const v1::LearningRateSchedule& s = c.schedule();
  double factor = 1.0;
  if (step <= s.warmup_updates()) factor = static_cast<double>(step) / static_cast<double>(s.warmup_updates());
  // Updates after the warm-up before this one.
  const uint64_t after = step > s.warmup_updates() ? step - s.warmup_updates() - 1 : 0;
  switch (s.decay()) {
    case v1::LearningRateSchedule::STEP: {
      const uint64_t decays = after / s.step_updates();  // whole periods past
      factor *= std::pow(double{s.gamma()}, static_cast<double>(decays));
      break;
    }
    case v1::LearningRateSchedule::COSINE: {
      const double done = static_cast<double>(std::min(after, s.decay_updates())) / s.decay_updates();
      factor *= s.min_factor() + (1.0 - s.min_factor()) * 0.5 * (1.0 + std::cos(M_PI * done));
      break;
    }
    default:
      break;
  }
  // Exactly the configured rate where nothing scales it.
  return factor == 1.0 ? c.learning_rate() : static_cast<float>(double{c.learning_rate()} * factor);
}

absl::Status Optimizer::Admit(uint64_t step, float max_abs, float scale, absl::Span<const float> params) {
  if (Grow(step, max_abs, scale).ok()) return absl::OkStatus();
  Bound(params);  // the bounds may have drifted far above the values
  return Grow(step, max_abs, scale);
}

void Optimizer::Extrapolate(uint64_t, uint64_t, uint64_t, absl::Span<const float> params,
                            absl::Span<float> out) const {
  std::copy(params.begin(), params.end(), out.begin());
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const v1::OptimizerConfig& c,
                                                           uint64_t n) {
  switch (c.kind()) {
    case v1::SGD:
      return std::make_unique<Sgd>(c);
    case v1::MOMENTUM:
      return std::make_unique<Momentum>(c, n);
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
