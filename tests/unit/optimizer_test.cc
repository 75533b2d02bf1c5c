#include "server/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace segps {
namespace {

// Plain double-precision references, written from the formulas.
struct Reference {
  v1::OptimizerConfig c;
  std::vector<double> w, m, v, a;
  int t = 0;
  // One update with the learning rate times `scale`.
  void Step(const std::vector<double>& g0, double scale = 1) {
    ++t;
    for (size_t i = 0; i < w.size(); ++i) {
      const double g = g0[i] + c.weight_decay() * w[i];
      switch (c.kind()) {
        case v1::SGD:
          w[i] -= scale * c.learning_rate() * g;
          break;
        case v1::MOMENTUM:
          m[i] = c.momentum() * m[i] - scale * c.learning_rate() * g;
          w[i] += m[i];
          break;
        case v1::ADAM: {
          m[i] = c.beta1() * m[i] + (1 - c.beta1()) * g;
          v[i] = c.beta2() * v[i] + (1 - c.beta2()) * g * g;
          const double alpha = scale * c.learning_rate() * std::sqrt(1 - std::pow(c.beta2(), t)) / (1 - std::pow(c.beta1(), t));
          w[i] -= alpha * m[i] / (std::sqrt(v[i]) + c.epsilon());
          break;
        }
        case v1::ADAGRAD:
          a[i] += g * g;
          w[i] -= scale * c.learning_rate() * g / (std::sqrt(a[i]) + c.epsilon());
          break;
        default:
          FAIL();
      }
    }
  }
};

v1::OptimizerConfig Config(v1::OptimizerKind kind) {
  v1::OptimizerConfig c;
  c.set_kind(kind);
  c.set_learning_rate(kind == v1::SGD || kind == v1::MOMENTUM ? 0.05f : 0.01f);
  c.set_beta1(0.9f);
  c.set_beta2(0.999f);
  c.set_epsilon(1e-7f);
  c.set_momentum(0.9f);
  c.set_weight_decay(0.01f);
  c.set_initial_accumulator(0.1f);
  return c;
}

class OptimizerTest : public ::testing::TestWithParam<v1::OptimizerKind> {};

// An optimizer and its double-precision reference, from the same random start.
struct Twins {
  std::unique_ptr<Optimizer> opt;
  Reference ref;
  std::vector<float> w;
  std::mt19937 rng;
  std::normal_distribution<double> normal;

  Twins(const v1::OptimizerConfig& config, size_t n, uint32_t seed)
      : opt(*CreateOptimizer(config, n)),
        ref{config, std::vector<double>(n), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0),
            std::vector<double>(n, config.initial_accumulator())},
        w(n),
        rng(seed) {
    for (size_t i = 0; i < n; ++i) w[i] = static_cast<float>(ref.w[i] = normal(rng));
  }
  // A random gradient, as floats and as the doubles the reference steps with.
  std::vector<float> Gradient(std::vector<double>* g) {
    std::vector<float> gf(w.size());
    g->resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) (*g)[i] = gf[i] = static_cast<float>(normal(rng));
    return gf;
  }
};

TEST_P(OptimizerTest, MatchesDoublePrecisionReference) {
  const size_t n = 257;
  Twins t(Config(GetParam()), n, 1);
  for (int step = 0; step < 20; ++step) {
    std::vector<double> g;
    const std::vector<float> gf = t.Gradient(&g);
    // In blocks, as chunked pushes arrive: the state follows each block's place.
    for (size_t first = 0; first < n; first += 100) {
      const size_t count = std::min<size_t>(100, n - first);
      t.opt->Apply(step + 1, first, absl::MakeSpan(t.w).subspan(first, count),
                   absl::MakeConstSpan(gf).subspan(first, count), 1.0f);
    }
    t.ref.Step(g);
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(t.w[i], t.ref.w[i], 2e-5 * (1 + std::abs(t.ref.w[i]))) << "element " << i;
  }
}

// A balanced push's weight (its samples over batch_size) scales the
// update's learning rate, for every optimizer.
TEST_P(OptimizerTest, WeightedUpdatesScaleTheLearningRate) {
  const size_t n = 257;
  Twins t(Config(GetParam()), n, 3);
  for (int step = 0; step < 12; ++step) {
    const float scale = 0.25f * static_cast<float>(step % 4 + 1);  // 0.25 .. 1
    std::vector<double> g;
    const std::vector<float> gf = t.Gradient(&g);
    t.opt->Apply(step + 1, 0, absl::MakeSpan(t.w), gf, scale);
    t.ref.Step(g, scale);
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(t.w[i], t.ref.w[i], 2e-5 * (1 + std::abs(t.ref.w[i]))) << "element " << i;
  }
}

// A pull's lookahead is where k updates carrying no gradient would take the
// parameters. Adam holds v at its value (the reference lets it decay by
// b2^k), so its drift may differ by ~k/2000 of itself.
TEST_P(OptimizerTest, ExtrapolateIsUpdatesWithoutGradient) {
  const size_t n = 257;
  v1::OptimizerConfig config = Config(GetParam());
  config.set_weight_decay(0);  // decay would pull on w even without a gradient
  Twins t(config, n, 2);
  const Reference& ref = t.ref;
  const std::vector<float>& w = t.w;
  const int steps = 5;
  for (int step = 1; step <= steps; ++step) {
    std::vector<double> g;
    const std::vector<float> gf = t.Gradient(&g);
    t.opt->Apply(step, 0, absl::MakeSpan(t.w), gf, 1.0f);
    t.ref.Step(g);
  }
  for (int k : {0, 1, 3}) {
    Reference ahead = ref;
    for (int j = 0; j < k; ++j) ahead.Step(std::vector<double>(n, 0.0));
    std::vector<float> out(n, -1.0f);
    for (size_t first = 0; first < n; first += 100) {
      const size_t count = std::min<size_t>(100, n - first);
      t.opt->Extrapolate(steps, k, first, absl::MakeConstSpan(w).subspan(first, count),
                       absl::MakeSpan(out).subspan(first, count));
    }
    for (size_t i = 0; i < n; ++i) {
      const double drift = ahead.w[i] - ref.w[i];
      EXPECT_NEAR(out[i], ahead.w[i], 2e-3 * std::abs(drift) + 2e-5 * (1 + std::abs(ahead.w[i])))
          << "element " << i << " after " << k << " updates";
    }
    if (k > 0 && (GetParam() == v1::MOMENTUM || GetParam() == v1::ADAM)) {
      EXPECT_NE(out[0], w[0]) << "momentum must move the parameters";
    }
  }
}

// Every parameter and slot of the state finite.
bool AllFinite(const Optimizer& opt, const std::vector<float>& w) {
  std::vector<std::vector<float>> slots;
  opt.SaveState(&slots);
  slots.push_back(w);
  for (const std::vector<float>& slot : slots) {
    for (float x : slot) {
      if (!std::isfinite(x)) return false;
    }
  }
  return true;
}

// Gradients from ordinary to the largest float, each on a fresh optimizer:
// one the optimizer admits leaves the parameters and the state finite, and
// so does an ordinary update after it (a poisoned state turns the next
// update into NaN); one it refuses changes nothing and names why.
TEST_P(OptimizerTest, AdmitsNoUpdateThatMakesTheModelNonFinite) {
  const size_t n = 64;
  int refused = 0;
  for (const float magnitude : {1.0f, 1e10f, 1e18f, 1e19f, 1e20f, 1e30f, 3e38f}) {
    SCOPED_TRACE(magnitude);
    Twins t(Config(GetParam()), n, 3);
    t.opt->Bound(t.w);
    std::vector<float> huge(n);
    for (size_t i = 0; i < n; ++i) huge[i] = i % 2 == 0 ? magnitude : -magnitude;
    const std::vector<float> before = t.w;
    const absl::Status admitted = t.opt->Admit(1, magnitude, 1.0f, t.w);
    if (!admitted.ok()) {
      ++refused;
      EXPECT_EQ(admitted.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(admitted.message().find("beyond float32's range; refused, nothing was applied"), std::string::npos)
          << admitted;
      EXPECT_EQ(t.w, before);
      continue;
    }
    t.opt->Apply(1, 0, absl::MakeSpan(t.w), huge, 1.0f);
    EXPECT_TRUE(AllFinite(*t.opt, t.w)) << "admitted, then not finite";
    std::vector<double> g;
    const std::vector<float> ordinary = t.Gradient(&g);
    ASSERT_TRUE(t.opt->Admit(2, 4.0f, 1.0f, t.w).ok());
    t.opt->Apply(2, 0, absl::MakeSpan(t.w), ordinary, 1.0f);
    EXPECT_TRUE(AllFinite(*t.opt, t.w)) << "the update after it is not finite";
  }
  EXPECT_GE(refused, 1) << "the largest float is refused by every optimizer";
  if (GetParam() == v1::ADAM || GetParam() == v1::ADAGRAD) {
    EXPECT_GE(refused, 3) << "1e20 squared overflows the second moment or the accumulator";
  }
}

// Ordinary training is never refused: the bounds grow with every update
// but stay far from float32's range over a long run.
TEST_P(OptimizerTest, AdmitsALongRunOfOrdinaryUpdates) {
  Twins t(Config(GetParam()), 16, 4);
  t.opt->Bound(t.w);
  for (uint64_t step = 1; step <= 100000; ++step) {
    ASSERT_TRUE(t.opt->Admit(step, 100.0f, 1.0f, t.w).ok()) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, OptimizerTest,
                         ::testing::Values(v1::SGD, v1::MOMENTUM, v1::ADAM, v1::ADAGRAD),
                         [](const auto& info) { return v1::OptimizerKind_Name(info.param); });

// The learning rate of update t under each schedule, from its closed form:
// a warm-up rises linearly, STEP multiplies by gamma after every
// step_updates updates, COSINE falls along half a cosine to min_factor.
TEST(Optimizer, ScheduledRatesFollowTheirFormulas) {
  v1::OptimizerConfig c = Config(v1::SGD);
  c.set_learning_rate(0.1f);
  EXPECT_EQ(ScheduledRate(c, 1), 0.1f);
  EXPECT_EQ(ScheduledRate(c, 1000000), 0.1f);
  c.mutable_schedule()->set_warmup_updates(4);
  EXPECT_FLOAT_EQ(ScheduledRate(c, 1), 0.025f);
  EXPECT_FLOAT_EQ(ScheduledRate(c, 3), 0.075f);
  EXPECT_EQ(ScheduledRate(c, 4), 0.1f);
  EXPECT_EQ(ScheduledRate(c, 5), 0.1f);

  c.mutable_schedule()->set_decay(v1::LearningRateSchedule::STEP);
  c.mutable_schedule()->set_step_updates(10);
  c.mutable_schedule()->set_gamma(0.5f);
  EXPECT_EQ(ScheduledRate(c, 14), 0.1f);             // the 10th update after the warm-up
  EXPECT_FLOAT_EQ(ScheduledRate(c, 15), 0.05f);      // the 11th
  EXPECT_FLOAT_EQ(ScheduledRate(c, 4 + 25), 0.025f);  // the 25th

  v1::LearningRateSchedule& cosine = *c.mutable_schedule();
  cosine = v1::LearningRateSchedule();
  cosine.set_decay(v1::LearningRateSchedule::COSINE);
  cosine.set_decay_updates(100);
  cosine.set_min_factor(0.2f);
  EXPECT_EQ(ScheduledRate(c, 1), 0.1f);
  EXPECT_FLOAT_EQ(ScheduledRate(c, 51), 0.1f * (0.2f + 0.8f * 0.5f));  // halfway: cos(pi / 2) = 0
  EXPECT_FLOAT_EQ(ScheduledRate(c, 26), 0.1f * (0.2 + 0.8 * 0.5 * (1 + std::cos(M_PI / 4))));
  EXPECT_FLOAT_EQ(ScheduledRate(c, 101), 0.02f);
  EXPECT_FLOAT_EQ(ScheduledRate(c, 5000), 0.02f);  // level after the decay
}

// Every optimizer takes update t at the scheduled rate: as the reference
// stepping with the schedule's factor as its weight.
TEST_P(OptimizerTest, EachUpdateTakesTheScheduledRate) {
  const size_t n = 129;
  v1::OptimizerConfig c = Config(GetParam());
  c.mutable_schedule()->set_decay(v1::LearningRateSchedule::COSINE);
  c.mutable_schedule()->set_warmup_updates(3);
  c.mutable_schedule()->set_decay_updates(8);
  Twins t(c, n, 5);
  for (int step = 1; step <= 14; ++step) {
    std::vector<double> g;
    const std::vector<float> gf = t.Gradient(&g);
    t.opt->Apply(step, 0, absl::MakeSpan(t.w), gf, 1.0f);
    const double factor =
        step <= 3 ? step / 3.0 : 0.5 * (1 + std::cos(M_PI * std::min(step - 4, 8) / 8.0));  // min_factor 0
    t.ref.Step(g, factor);
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(t.w[i], t.ref.w[i], 2e-5 * (1 + std::abs(t.ref.w[i]))) << "element " << i;
  }
}

TEST(Optimizer, UnspecifiedKindIsRejected) {
  v1::OptimizerConfig c;
  EXPECT_FALSE(CreateOptimizer(c, 4).ok());
}

}  // namespace
}  // namespace segps
