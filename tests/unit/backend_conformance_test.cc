// One conformance suite for every compute backend compiled in: each op, a
// whole training step and a pipeline stage's passes against a
// double-precision reference on random inputs. The shapes reach every
// launch path a GPU has (dimensions of 1, and of 1,000 and more, so that
// column sums and softmax span many thread blocks), and the tolerances are
// relative: to the sum of a product's absolute terms for one GEMM, to the
// largest reference value for a network.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/support/gpu.h"
#include "worker/model/backend.h"
#include "worker/model/segment_model.h"

namespace segps {
namespace {

struct BackendParam {
  std::string name;
  std::string device;
  bool tf32;
  double tolerance;        // relative error of one op
  double model_tolerance;  // relative error of a network's gradient
  int cpu_threads = 1;
};

void PrintTo(const BackendParam& p, std::ostream* os) { *os << p.name; }

class BackendTest : public ::testing::TestWithParam<BackendParam> {
 public:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(GetParam().device, GetParam().tf32, GetParam().cpu_threads);
    SEGPS_REQUIRE_GPU_OR_SKIP(b.status());
    backend_ = *std::move(b);
  }

  // Device copy of host data.
  template <typename T>
  Buffer ToDevice(const std::vector<T>& host) {
    Buffer b = *backend_->Allocate(host.size() * sizeof(T));
    EXPECT_TRUE(backend_->Upload(host.data(), b.data(), host.size() * sizeof(T)).ok());
    return b;
  }
  std::vector<float> ToHost(const float* device, size_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(backend_->Download(device, out.data(), n * sizeof(float)).ok());
    EXPECT_TRUE(backend_->Synchronize().ok());
    return out;
  }
  std::vector<float> Random(size_t n, double scale = 1.0) {
    std::normal_distribution<double> normal(0.0, scale);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(normal(rng_));
    return v;
  }
  // Every element within tolerance x max(1, largest |want|).
  void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
    ExpectRelative(got, want, std::vector<double>(want.size(), std::max(1.0, LargestMagnitude(want))),
                   GetParam().tolerance, what);
  }
  // Every element within `tolerance` x scale[i] of want[i]; the worst named.
  static void ExpectRelative(const std::vector<float>& got, const std::vector<double>& want,
                             const std::vector<double>& scale, double tolerance, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    size_t worst = 0;
    double worst_ratio = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double error = std::abs(static_cast<double>(got[i]) - want[i]);
      const double ratio = std::isfinite(got[i]) ? error / std::max(scale[i], 1e-30) : HUGE_VAL;
      if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
    }
    EXPECT_LE(worst_ratio, tolerance) << what << ": element " << worst << " is " << got[worst] << ", want "
                                      << want[worst] << " (error " << worst_ratio << " x its scale " << scale[worst]
                                      << ")";
  }
  static double LargestMagnitude(const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
  }

  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{17};
};

// One product checked against double: each element within the tolerance of
// the sum of its terms' magnitudes (the scale a float product's rounding
// grows with), widened by sqrt(k)/16 for long sums. With beta = 0, C starts
// as NaN: a product must not read it (the model's buffers start
// uninitialised).
void CheckGemm(BackendTest* t, Backend* backend, std::mt19937* rng, std::array<int, 3> shape, bool ta, bool tb,
               float beta, double tolerance) {
  const auto [m, n, k] = shape;
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = static_cast<float>(normal(*rng));
    return v;
  };
  std::vector<float> a = random(static_cast<size_t>(m) * k), b = random(static_cast<size_t>(k) * n);
  std::vector<float> c = beta == 0 ? std::vector<float>(static_cast<size_t>(m) * n, std::nanf(""))
                                   : random(static_cast<size_t>(m) * n);
  Buffer da = t->ToDevice(a), db = t->ToDevice(b), dc = t->ToDevice(c);
  ASSERT_TRUE(backend->Gemm(ta, tb, m, n, k, 0.5f, da.data(), db.data(), beta, dc.data()).ok());
  std::vector<double> want(static_cast<size_t>(m) * n), scale(want.size());
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0, magnitude = 0;
      for (int p = 0; p < k; ++p) {
        const double term = static_cast<double>(ta ? a[static_cast<size_t>(p) * m + i] : a[static_cast<size_t>(i) * k + p]) *
                            (tb ? b[static_cast<size_t>(j) * k + p] : b[static_cast<size_t>(p) * n + j]);
        sum += term;
        magnitude += std::abs(term);
      }
      const size_t at = static_cast<size_t>(i) * n + j;
      const double prior = beta == 0 ? 0.0 : static_cast<double>(beta) * c[at];
      want[at] = 0.5 * sum + prior;
      scale[at] = 0.5 * magnitude + std::abs(prior);
    }
  }
  const std::string what = absl::StrCat("gemm ", ta ? "T" : "N", tb ? "T" : "N", " m ", m, " n ", n, " k ", k,
                                        " beta ", beta);
  BackendTest::ExpectRelative(t->ToHost(dc.data(), want.size()), want, scale,
                              tolerance * std::max(1.0, std::sqrt(static_cast<double>(k)) / 16), what);
}

// Every dimension at 1, 3, 1,000 and 4,097 in turn, the others small; two
// shapes where all are mid-sized (large enough for OpenBLAS to split over
// its threads); each in all four transpositions, accumulating into C or not.
TEST_P(BackendTest, GemmEveryShapeAndTransposition) {
  std::vector<std::array<int, 3>> shapes = {{37, 29, 41}, {160, 150, 140}};
  for (int position = 0; position < 3; ++position) {
    for (int dimension : {1, 3, 1000, 4097}) {
      std::array<int, 3> shape = {5, 7, 6};
      shape[position] = dimension;
      shapes.push_back(shape);
    }
  }
  int run = 0;
  for (const auto& shape : shapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        CheckGemm(this, backend_.get(), &rng_, shape, ta, tb, run++ % 2 == 0 ? 2.0f : 0.0f, GetParam().tolerance);
      }
    }
  }
}

TEST_P(BackendTest, BiasAndColumnSumOverManyBlocks) {
  for (const auto& [rows, cols] : {std::pair{1, 1}, {13, 70}, {3, 1000}, {1000, 3}, {257, 4097}}) {
    const size_t n = static_cast<size_t>(rows) * cols;
    std::vector<float> y = Random(n), bias = Random(cols);
    Buffer dy = ToDevice(y), dbias = ToDevice(bias);
    ASSERT_TRUE(backend_->AddBias(dy.data(), dbias.data(), rows, cols).ok());
    std::vector<double> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = static_cast<double>(y[i]) + bias[i % cols];
    ExpectClose(ToHost(dy.data(), n), want, absl::StrCat("bias ", rows, " x ", cols));

    Buffer dsum = *backend_->Allocate(cols * sizeof(float));
    ASSERT_TRUE(backend_->ColumnSum(dy.data(), rows, cols, dsum.data()).ok());
    std::vector<double> col(cols, 0.0), magnitude(cols, 0.0);
    for (size_t i = 0; i < n; ++i) col[i % cols] += want[i], magnitude[i % cols] += std::abs(want[i]);
    ExpectRelative(ToHost(dsum.data(), cols), col, magnitude, GetParam().tolerance,
                   absl::StrCat("column sum ", rows, " x ", cols));
  }
}

TEST_P(BackendTest, ActivationsAndTheirGradients) {
  const size_t n = 5000;  // several blocks
  for (v1::Activation f : {v1::IDENTITY, v1::RELU, v1::TANH, v1::SIGMOID}) {
    std::vector<float> x = Random(n, 2.0), g = Random(n);
    Buffer dx = ToDevice(x), dg = ToDevice(g);
    ASSERT_TRUE(backend_->Activate(f, dx.data(), x.size()).ok());
    std::vector<double> fy(x.size()), fg(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      double out = v, deriv = 1;
      if (f == v1::RELU) out = v > 0 ? v : 0, deriv = v > 0 ? 1 : 0;
      if (f == v1::TANH) out = std::tanh(v), deriv = 1 - out * out;
      if (f == v1::SIGMOID) out = 1 / (1 + std::exp(-v)), deriv = out * (1 - out);
      fy[i] = out;
      fg[i] = g[i] * deriv;
    }
    ExpectClose(ToHost(dx.data(), x.size()), fy, v1::Activation_Name(f));
    ASSERT_TRUE(backend_->ActivationGrad(f, dx.data(), dg.data(), x.size()).ok());
    ExpectClose(ToHost(dg.data(), x.size()), fg, v1::Activation_Name(f) + " grad");
  }
}

// SOFTMAX is the output layer's, UNSPECIFIED none, 9 no value of the enum
// (a config that is not text can carry it): refused before anything runs.
TEST_P(BackendTest, RefusesWhatIsNoHiddenActivation) {
  Buffer y = ToDevice(std::vector<float>(4, 1.0f)), dy = ToDevice(std::vector<float>(4, 1.0f));
  for (v1::Activation f : {v1::SOFTMAX, v1::ACTIVATION_UNSPECIFIED, static_cast<v1::Activation>(9)}) {
    for (const absl::Status& s : {backend_->Activate(f, y.data(), 4), backend_->ActivationGrad(f, y.data(), dy.data(), 4)}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      const std::string named = f == 9 ? "activation 9 " : "activation " + v1::Activation_Name(f) + " ";
      EXPECT_NE(s.message().find(named), std::string::npos) << s.message();
    }
  }
  EXPECT_EQ(ToHost(y.data(), 4), std::vector<float>(4, 1.0f));
  EXPECT_EQ(ToHost(dy.data(), 4), std::vector<float>(4, 1.0f));
}

// Rows over many blocks, one and two classes too. The loss is summed in
// double in a fixed order, so the same inputs give the same bits each time.
TEST_P(BackendTest, SoftmaxCrossEntropyOverManyBlocks) {
  for (const auto& [rows, cols] : {std::pair{1, 2}, {3, 10}, {33, 10}, {1000, 3}, {4097, 10}}) {
    const size_t n = static_cast<size_t>(rows) * cols;
    std::vector<float> z = Random(n, 3.0);
    z[0] = 80.0f;  // large logits must not overflow
    std::vector<int32_t> labels(rows);
    for (int r = 0; r < rows; ++r) labels[r] = static_cast<int32_t>(rng_() % cols);
    Buffer dz = ToDevice(z), dl = ToDevice(labels), dp = *backend_->Allocate(n * sizeof(float)),
           dd = *backend_->Allocate(n * sizeof(float)), ds = *backend_->Allocate(2 * sizeof(float));
    std::vector<double> p(n), d(n);
    double loss = 0;
    int correct = 0;
    for (int r = 0; r < rows; ++r) {
      const float* zr = z.data() + static_cast<size_t>(r) * cols;
      const int arg = static_cast<int>(std::max_element(zr, zr + cols) - zr);
      double sum = 0;
      for (int c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(zr[c]) - zr[arg]);
      for (int c = 0; c < cols; ++c) {
        p[r * cols + c] = std::exp(static_cast<double>(zr[c]) - zr[arg]) / sum;
        d[r * cols + c] = (p[r * cols + c] - (c == labels[r])) / rows;
      }
      loss += zr[arg] + std::log(sum) - zr[labels[r]];
      correct += arg == labels[r];
    }
    std::vector<float> first_stats;
    for (int run = 0; run < 2; ++run) {
      ASSERT_TRUE(backend_->SoftmaxCrossEntropy(dz.data(), dl.data<int32_t>(), rows, cols, 1.0f / rows, dp.data(),
                                                dd.data(), ds.data()).ok());
      std::vector<float> stats = ToHost(ds.data(), 2);
      if (run == 1) {
        EXPECT_EQ(std::memcmp(stats.data(), first_stats.data(), 2 * sizeof(float)), 0) << "loss sums differ between runs";
      }
      first_stats = stats;
    }
    const std::string shape = absl::StrCat(rows, " x ", cols);
    ExpectClose(ToHost(dp.data(), n), p, "softmax " + shape);
    ExpectClose(ToHost(dd.data(), n), d, "dlogits " + shape);
    EXPECT_NEAR(first_stats[0], loss, 1e-6 * loss) << shape;
    EXPECT_EQ(first_stats[1], correct) << shape;
  }
}

// Inference (Predict, the evaluator): probabilities only; the gradient and
// the statistics stay as they were.
TEST_P(BackendTest, SoftmaxWithoutLabelsLeavesGradientAndStatisticsAlone) {
  const int rows = 700, cols = 5;
  std::vector<float> z = Random(static_cast<size_t>(rows) * cols, 2.0);
  Buffer dz = ToDevice(z), dp = *backend_->Allocate(z.size() * sizeof(float)),
         dd = ToDevice(std::vector<float>(z.size(), 7.0f)), ds = ToDevice(std::vector<float>{7.0f, 7.0f});
  ASSERT_TRUE(backend_->SoftmaxCrossEntropy(dz.data(), nullptr, rows, cols, 1.0f, dp.data(), dd.data(), ds.data()).ok());
  std::vector<double> p(z.size());
  for (int r = 0; r < rows; ++r) {
    double sum = 0;
    for (int c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(z[r * cols + c]));
    for (int c = 0; c < cols; ++c) p[r * cols + c] = std::exp(static_cast<double>(z[r * cols + c])) / sum;
  }
  ExpectClose(ToHost(dp.data(), z.size()), p, "softmax without labels");
  EXPECT_EQ(ToHost(dd.data(), z.size()), std::vector<float>(z.size(), 7.0f));
  EXPECT_EQ(ToHost(ds.data(), 2), (std::vector<float>{7.0f, 7.0f}));
}

// A regression's output (model.loss MSE): predictions as they are, the
// gradient 2 (p - t) / rows, squared and absolute errors summed in a fixed
// order over many blocks; without targets, the outputs only.
TEST_P(BackendTest, SquaredErrorOverManyBlocks) {
  for (int rows : {1, 33, 4097}) {
    const std::vector<float> p = Random(rows, 3.0), t = Random(rows, 3.0);
    Buffer dp = ToDevice(p), dt = ToDevice(t), dout = *backend_->Allocate(rows * sizeof(float)),
           dd = *backend_->Allocate(rows * sizeof(float)), ds = *backend_->Allocate(2 * sizeof(float));
    std::vector<double> out(rows), d(rows);
    double squared = 0, absolute = 0;
    for (int r = 0; r < rows; ++r) {
      const double e = static_cast<double>(p[r]) - t[r];
      out[r] = p[r];
      d[r] = 2 * e / rows;
      squared += e * e;
      absolute += std::fabs(e);
    }
    ASSERT_TRUE(backend_->SquaredError(dp.data(), dt.data(), rows, 1.0f / rows, dout.data(), dd.data(), ds.data()).ok());
    const std::vector<float> stats = ToHost(ds.data(), 2);
    ExpectClose(ToHost(dout.data(), rows), out, absl::StrCat("outputs of ", rows));
    ExpectClose(ToHost(dd.data(), rows), d, absl::StrCat("gradient of ", rows));
    EXPECT_NEAR(stats[0], squared, 1e-6 * squared) << rows;
    EXPECT_NEAR(stats[1], absolute, 1e-6 * absolute) << rows;
    Buffer untouched = ToDevice(std::vector<float>(rows, 7.0f)), kept = ToDevice(std::vector<float>{7.0f, 7.0f});
    ASSERT_TRUE(backend_->SquaredError(dp.data(), nullptr, rows, 1.0f, dout.data(), untouched.data(), kept.data()).ok());
    EXPECT_EQ(ToHost(untouched.data(), rows), std::vector<float>(rows, 7.0f));
    EXPECT_EQ(ToHost(kept.data(), 2), (std::vector<float>{7.0f, 7.0f}));
  }
}

// More memory than any machine has: RESOURCE_EXHAUSTED naming the size, on
// the device as on the CPU, and the backend goes on working.
TEST_P(BackendTest, AnAllocationBeyondTheMemoryIsResourceExhausted) {
  const size_t bytes = std::numeric_limits<size_t>::max() / 4;
  absl::StatusOr<Buffer> huge = backend_->Allocate(bytes);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find(std::to_string(bytes)), std::string::npos) << huge.status();
  EXPECT_EQ(ToHost(ToDevice(std::vector<float>{1.5f}).data(), 1), std::vector<float>{1.5f});
}

// The time a pipeline stage reports busy: the enqueued work's, which a
// 512^3 product makes measurable; nothing enqueued takes less.
TEST_P(BackendTest, TimingCoversTheWorkEnqueuedBetweenItsMarks) {
  const int n = 512;
  Buffer a = ToDevice(Random(n * n)), b = ToDevice(Random(n * n)), c = *backend_->Allocate(n * n * sizeof(float));
  ASSERT_TRUE(backend_->StartTiming().ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(backend_->Gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data()).ok());
  absl::StatusOr<absl::Duration> busy = backend_->StopTiming();
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_GT(*busy, absl::ZeroDuration());
  EXPECT_TRUE(std::isfinite(ToHost(c.data(), 1)[0]));
}

// A network of dense layers in double: widths[0] inputs, then each layer's
// units and activation; w in the shard map's order (per layer: kernel
// [in, out] row-major, then bias). Returns the last layer's output after
// its activation (SOFTMAX leaves the logits).
// `mask(l, j)`, when given, multiplies hidden layer l's output j (dropout).
std::vector<double> ReferenceForward(const std::vector<int>& widths, const std::vector<v1::Activation>& acts,
                                     const std::vector<double>& w, std::vector<double> a,
                                     const std::function<double(size_t, int)>& mask = nullptr) {
  size_t off = 0;
  for (size_t l = 0; l < acts.size(); ++l) {
    std::vector<double> z(widths[l + 1], 0.0);
    for (int j = 0; j < widths[l + 1]; ++j) {
      for (int i = 0; i < widths[l]; ++i) z[j] += a[i] * w[off + static_cast<size_t>(i) * widths[l + 1] + j];
      z[j] += w[off + static_cast<size_t>(widths[l]) * widths[l + 1] + j];
    }
    off += static_cast<size_t>(widths[l]) * widths[l + 1] + widths[l + 1];
    for (double& v : z) {
      if (acts[l] == v1::TANH) v = std::tanh(v);
      if (acts[l] == v1::RELU) v = std::max(v, 0.0);
      if (acts[l] == v1::SIGMOID) v = 1 / (1 + std::exp(-v));
    }
    if (mask && l + 1 < acts.size()) {
      for (int j = 0; j < widths[l + 1]; ++j) z[j] *= mask(l, j);
    }
    a = z;
  }
  return a;
}

double CrossEntropy(const std::vector<double>& logits, int label) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double v : logits) sum += std::exp(v - mx);
  return mx + std::log(sum) - logits[label];
}

// d f / d v by central differences, for every element of v.
template <typename F>
std::vector<double> NumericGradient(F f, std::vector<double> v) {
  std::vector<double> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double h = 1e-6, keep = v[i];
    v[i] = keep + h;
    const double plus = f(v);
    v[i] = keep - h;
    const double minus = f(v);
    v[i] = keep;
    g[i] = (plus - minus) / (2 * h);
  }
  return g;
}

struct Layer {
  uint32_t units;
  v1::Activation activation;
};

void AddSegment(v1::ModelConfig* config, const std::string& name, uint32_t input_width, const std::vector<Layer>& layers) {
  auto* seg = config->add_segments();
  seg->set_name(name);
  if (input_width > 0) seg->set_input_width(input_width);
  for (const Layer& layer : layers) {
    auto* l = seg->add_layers();
    l->set_units(layer.units);
    l->set_activation(layer.activation);
  }
}

// Dropout: out[i] = y[i] / (1 - rate) exactly where DropoutKeeps says (the
// same elements on every backend), in place or not; rate 0 copies.
TEST_P(BackendTest, DropoutKeepsTheElementsItsSeedDraws) {
  const size_t n = 5000;
  const std::vector<float> y = Random(n);
  Buffer dy = ToDevice(y), dout = *backend_->Allocate(n * sizeof(float));
  ASSERT_TRUE(backend_->Dropout(dy.data(), dout.data(), n, 0.25f, 77, 1000).ok());
  const std::vector<float> out = ToHost(dout.data(), n);
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool keeps = DropoutKeeps(77, 1000 + i, DropoutThreshold(0.25f));
    kept += keeps;
    ASSERT_EQ(out[i], keeps ? y[i] * (1.0f / 0.75f) : 0.0f) << i;
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.75, 0.02);
  ASSERT_TRUE(backend_->Dropout(dy.data(), dy.data(), n, 0.25f, 77, 1000).ok());
  EXPECT_EQ(ToHost(dy.data(), n), out) << "in place";
  ASSERT_TRUE(backend_->Dropout(dout.data(), dy.data(), n, 0.0f, 5, 0).ok());
  EXPECT_EQ(ToHost(dy.data(), n), out) << "rate 0 copies";
}

// A training step with dropout on its hidden layers: the gradient of the
// loss of the network with the same masks (a double-precision reference),
// and prediction with every unit.
TEST_P(BackendTest, ATrainingStepWithDropoutMatchesTheMaskedReference) {
  v1::ModelConfig config;
  config.set_input_width(8);
  config.set_num_classes(3);
  AddSegment(&config, "s", 0, {{9, v1::TANH}, {7, v1::RELU}, {3, v1::SOFTMAX}});
  config.mutable_segments(0)->mutable_layers(0)->set_dropout(0.3f);
  config.mutable_segments(0)->mutable_layers(1)->set_dropout(0.5f);
  const std::vector<int> widths = {8, 9, 7, 3};
  const std::vector<v1::Activation> acts = {v1::TANH, v1::RELU, v1::SOFTMAX};
  const std::vector<float> rates = {0.3f, 0.5f};
  const int rows = 5;
  const uint64_t seed = DropoutSeed(7, 0, 1, 42);
  absl::StatusOr<SegmentModel> model = SegmentModel::Create(backend_.get(), config, 0, rows);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> params = Random(model->num_params(), 0.5), x = Random(rows * 8);
  std::vector<int32_t> y(rows);
  for (int r = 0; r < rows; ++r) y[r] = r % 3;
  ASSERT_TRUE(backend_->Upload(params.data(), model->params(), params.size() * 4).ok());
  ASSERT_TRUE(backend_->Upload(x.data(), model->input(), x.size() * 4).ok());
  ASSERT_TRUE(backend_->Upload(y.data(), model->labels(), rows * 4).ok());
  ASSERT_TRUE(model->TrainStep(rows, 0, seed).ok());
  const std::vector<float> grad = ToHost(model->grad(), params.size());
  auto loss = [&](const std::vector<double>& w) {
    double total = 0;
    for (int r = 0; r < rows; ++r) {
      auto mask = [&](size_t l, int j) {
        const uint64_t at = static_cast<uint64_t>(r) * widths[l + 1] + j;
        return DropoutKeeps(Mix64(seed + l), at, DropoutThreshold(rates[l])) ? 1.0 / (1.0 - rates[l]) : 0.0;
      };
      total += CrossEntropy(ReferenceForward(widths, acts, w, {x.begin() + r * 8, x.begin() + (r + 1) * 8}, mask),
                            y[r]);
    }
    return total / rows;
  };
  const std::vector<double> w(params.begin(), params.end()), numeric = NumericGradient(loss, w);
  ExpectRelative(grad, numeric, std::vector<double>(numeric.size(), LargestMagnitude(numeric)),
                 GetParam().model_tolerance, "gradient with dropout");
  ASSERT_TRUE(model->TrainStep(rows, 0).ok());  // no seed: no dropout
  EXPECT_NE(ToHost(model->grad(), params.size()), grad);
}

TEST_P(BackendTest, WholeTrainingStepMatchesDoubleReference) {
  v1::ModelConfig config;
  config.set_input_width(11);
  config.set_num_classes(4);
  // Every activation appears once, so the check covers each layer kind.
  AddSegment(&config, "s", 0, {{9, v1::TANH}, {7, v1::RELU}, {6, v1::SIGMOID}, {5, v1::IDENTITY}, {4, v1::SOFTMAX}});
  const std::vector<int> widths = {11, 9, 7, 6, 5, 4};
  const std::vector<v1::Activation> acts = {v1::TANH, v1::RELU, v1::SIGMOID, v1::IDENTITY, v1::SOFTMAX};
  const int rows = 6;
  absl::StatusOr<SegmentModel> model = SegmentModel::Create(backend_.get(), config, 0, rows);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> params = Random(model->num_params(), 0.5), x = Random(rows * 11);
  std::vector<int32_t> y(rows);
  for (int r = 0; r < rows; ++r) y[r] = r % 4;
  ASSERT_TRUE(backend_->Upload(params.data(), model->params(), params.size() * 4).ok());
  ASSERT_TRUE(backend_->Upload(x.data(), model->input(), x.size() * 4).ok());
  ASSERT_TRUE(backend_->Upload(y.data(), model->labels(), rows * 4).ok());
  ASSERT_TRUE(model->TrainStep(rows).ok());
  std::vector<float> grad = ToHost(model->grad(), params.size());

  auto loss = [&](const std::vector<double>& w) {
    double total = 0;
    for (int r = 0; r < rows; ++r) {
      total += CrossEntropy(ReferenceForward(widths, acts, w, {x.begin() + r * 11, x.begin() + (r + 1) * 11}), y[r]);
    }
    return total / rows;
  };
  const std::vector<double> w(params.begin(), params.end()), numeric = NumericGradient(loss, w);
  ExpectRelative(grad, numeric, std::vector<double>(numeric.size(), LargestMagnitude(numeric)),
                 GetParam().model_tolerance, "model gradient");
  ASSERT_TRUE(model->DownloadStats().ok());
  ASSERT_TRUE(backend_->Synchronize().ok());
  EXPECT_NEAR(model->stats().loss_sum / rows, loss(w), GetParam().model_tolerance * loss(w));

  // Inference on the same rows (no labels): the reference's probabilities.
  ASSERT_TRUE(model->Predict(rows).ok());
  std::vector<double> probs;
  for (int r = 0; r < rows; ++r) {
    std::vector<double> z = ReferenceForward(widths, acts, w, {x.begin() + r * 11, x.begin() + (r + 1) * 11});
    const double mx = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double v : z) sum += std::exp(v - mx);
    for (double v : z) probs.push_back(std::exp(v - mx) / sum);
  }
  ExpectRelative(ToHost(model->probabilities(), probs.size()), probs, std::vector<double>(probs.size(), 1.0),
                 GetParam().model_tolerance, "predicted probabilities");
}

// A CHAIN cut in two stages, each fed 7 rows as micro-batches of 3 and 4:
// the second micro-batch's backward accumulates into the first's gradient
// (beta = 1, the bias through a one-row product with a column of ones),
// and each stage leaves the gradient with respect to its input. The last
// stage against the mean cross-entropy; the first against sum(G . output)
// for a random upstream gradient G, as its next stage would send.
TEST_P(BackendTest, PipelineStagesAccumulateMicroBatchesLikeTheWholeBatch) {
  v1::ModelConfig config;
  config.set_input_width(5);
  config.set_num_classes(3);
  config.set_combine(v1::CHAIN);
  AddSegment(&config, "first", 0, {{4, v1::TANH}, {6, v1::RELU}});
  AddSegment(&config, "last", 6, {{4, v1::SIGMOID}, {3, v1::SOFTMAX}});
  const int rows = 7, parts[2][2] = {{0, 3}, {3, 4}};
  const std::vector<int> widths[2] = {{5, 4, 6}, {6, 4, 3}};
  const std::vector<v1::Activation> acts[2] = {{v1::TANH, v1::RELU}, {v1::SIGMOID, v1::SOFTMAX}};
  for (int stage = 0; stage < 2; ++stage) {
    SCOPED_TRACE(stage == 0 ? "first stage" : "last stage");
    absl::StatusOr<SegmentModel> model = SegmentModel::Create(backend_.get(), config, stage, rows);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ(model->final_stage(), stage == 1);
    const int in = widths[stage].front(), out = widths[stage].back();
    std::vector<float> params = Random(model->num_params(), 0.5), x = Random(rows * in), g = Random(rows * out);
    std::vector<int32_t> y(rows);
    for (int r = 0; r < rows; ++r) y[r] = (r * 2) % 3;
    ASSERT_TRUE(backend_->Upload(params.data(), model->params(), params.size() * 4).ok());
    ASSERT_TRUE(backend_->Upload(x.data(), model->input(), x.size() * 4).ok());
    ASSERT_TRUE(backend_->Upload(y.data(), model->labels(), rows * 4).ok());
    for (const auto& [first, count] : parts) {
      ASSERT_TRUE(model->StageForward(first, count, 1.0f / rows).ok());
    }
    if (stage == 0) {
      ASSERT_TRUE(backend_->Upload(g.data(), model->output_grad(0), g.size() * 4).ok());
    }
    for (const auto& [first, count] : parts) {
      ASSERT_TRUE(model->StageBackward(first, count, /*accumulate=*/first > 0, /*input_grad=*/true).ok());
    }
    // The objective of parameters w and inputs v, in double.
    auto objective = [&](const std::vector<double>& w, const std::vector<double>& v) {
      double total = 0;
      for (int r = 0; r < rows; ++r) {
        std::vector<double> o = ReferenceForward(widths[stage], acts[stage], w, {v.begin() + r * in, v.begin() + (r + 1) * in});
        if (stage == 1) total += CrossEntropy(o, y[r]) / rows;
        for (int j = 0; stage == 0 && j < out; ++j) total += g[r * out + j] * o[j];
      }
      return total;
    };
    const std::vector<double> w(params.begin(), params.end()), v(x.begin(), x.end());
    const std::vector<double> dw = NumericGradient([&](const auto& p) { return objective(p, v); }, w);
    const std::vector<double> dv = NumericGradient([&](const auto& p) { return objective(w, p); }, v);
    ExpectRelative(ToHost(model->grad(), w.size()), dw, std::vector<double>(dw.size(), LargestMagnitude(dw)),
                   GetParam().model_tolerance, "parameter gradient over two micro-batches");
    ExpectRelative(ToHost(model->input_grad(0), v.size()), dv, std::vector<double>(dv.size(), LargestMagnitude(dv)),
                   GetParam().model_tolerance, "input gradient");
    if (stage == 0) {
      std::vector<double> forward;
      for (int r = 0; r < rows; ++r) {
        const std::vector<double> o = ReferenceForward(widths[0], acts[0], w, {v.begin() + r * in, v.begin() + (r + 1) * in});
        forward.insert(forward.end(), o.begin(), o.end());
      }
      ExpectRelative(ToHost(model->output(0), forward.size()), forward,
                     std::vector<double>(forward.size(), LargestMagnitude(forward)), GetParam().model_tolerance, "output");
    } else {
      // The statistics are the last micro-batch's: rows 3 to 6.
      ASSERT_TRUE(model->DownloadStats().ok());
      ASSERT_TRUE(backend_->Synchronize().ok());
      double want = 0;
      for (int r = 3; r < rows; ++r) {
        want += CrossEntropy(ReferenceForward(widths[1], acts[1], w, {v.begin() + r * in, v.begin() + (r + 1) * in}), y[r]);
      }
      EXPECT_NEAR(model->stats().loss_sum, want, GetParam().model_tolerance * want);
    }
  }
}

// The same suite runs in two binaries: the CPU instance (label unit) and,
// when CUDA is compiled in, the GPU instances (label gpu), which skip with
// the reason when no GPU is usable, and fail instead under
// SEGPS_REQUIRE_GPU=1 (tests/gpu/check.sh).
std::vector<BackendParam> Backends() {
#ifdef SEGPS_CONFORMANCE_GPU
  // TF32 keeps 10 mantissa bits: products are good to about 1e-3 relative.
  // TF32 rounds each product's inputs to 10 mantissa bits: a product is
  // good to about 1e-3 of its terms' magnitudes, and a network's gradient
  // to about that per layer.
  return {{"cuda", "cuda:0", false, 1e-5, 1e-5}, {"cuda_tf32", "cuda:0", true, 2e-3, 2e-2}};
#else
  // OpenBLAS splits a product over its threads: the sums regroup, the bound holds.
  return {{"cpu", "cpu", false, 1e-5, 1e-5}, {"cpu_2_threads", "cpu", false, 1e-5, 1e-5, 2}};
#endif
}

INSTANTIATE_TEST_SUITE_P(Compiled, BackendTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param.name; });

TEST(CreateBackend, RejectsUnknownDevices) {
  EXPECT_EQ(CreateBackend("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateBackend("cuda:x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CreateBackend("auto").ok());
}

TEST(CreateBackend, RejectsThreadCountsOutOfRange) {
  for (int threads : {0, -1, kMaxCpuThreads + 1}) {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend("cpu", false, threads);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << threads;
    EXPECT_NE(b.status().message().find("--cpu_threads"), std::string::npos) << b.status().message();
  }
  EXPECT_TRUE(CreateBackend("cpu", false, 2).ok());
}

}  // namespace
}  // namespace segps
