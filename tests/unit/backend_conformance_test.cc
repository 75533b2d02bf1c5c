// One conformance suite for every compute backend compiled in: each op and a
// whole training step against a double-precision reference on random inputs.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "worker/model/backend.h"
#include "worker/model/segment_model.h"

namespace segps {
namespace {

struct BackendParam {
  std::string name;
  std::string device;
  bool tf32;
  double tolerance;  // relative error bound
  int cpu_threads = 1;
};

void PrintTo(const BackendParam& p, std::ostream* os) { *os << p.name; }

class BackendTest : public ::testing::TestWithParam<BackendParam> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(GetParam().device, GetParam().tf32, GetParam().cpu_threads);
    if (!b.ok()) GTEST_SKIP() << GetParam().device << " unavailable: " << b.status().message();
    backend_ = *std::move(b);
  }

  // Device copy of host data.
  Buffer ToDevice(const std::vector<float>& host) {
    Buffer b = *backend_->Allocate(host.size() * sizeof(float));
    EXPECT_TRUE(backend_->Upload(host.data(), b.data(), host.size() * sizeof(float)).ok());
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
  void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    double max_abs = 0;
    for (double w : want) max_abs = std::max(max_abs, std::abs(w));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], GetParam().tolerance * std::max(1.0, max_abs)) << what << " element " << i;
    }
  }

  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{17};
};

// Small, and large enough for OpenBLAS to split over its threads: products
// up to m n k = 10^6 take its single-threaded small-matrix path (timed on
// this machine: 130 x 70 x 90 runs no faster with 2 threads; 160 x 150 x
// 140 runs in 53 instead of 70 us).
TEST_P(BackendTest, GemmAllTranspositions) {
  for (const auto& [m, n, k] : {std::array<int, 3>{37, 29, 41}, std::array<int, 3>{160, 150, 140}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        std::vector<float> a = Random(m * k), b = Random(k * n), c = Random(m * n);
        Buffer da = ToDevice(a), db = ToDevice(b), dc = ToDevice(c);
        ASSERT_TRUE(backend_->Gemm(ta, tb, m, n, k, 0.5f, da.data(), db.data(), 2.0f, dc.data()).ok());
        std::vector<double> want(m * n);
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < n; ++j) {
            double s = 0;
            for (int p = 0; p < k; ++p) {
              s += static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
            }
            want[i * n + j] = 0.5 * s + 2.0 * c[i * n + j];
          }
        }
        ExpectClose(ToHost(dc.data(), m * n), want, ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"));
      }
    }
  }
}

TEST_P(BackendTest, BiasActivationsAndColumnSum) {
  const int rows = 13, cols = 70;
  std::vector<float> y = Random(rows * cols), bias = Random(cols);
  Buffer dy = ToDevice(y), dbias = ToDevice(bias);
  ASSERT_TRUE(backend_->AddBias(dy.data(), dbias.data(), rows, cols).ok());
  std::vector<double> want(rows * cols);
  for (int i = 0; i < rows * cols; ++i) want[i] = static_cast<double>(y[i]) + bias[i % cols];
  ExpectClose(ToHost(dy.data(), rows * cols), want, "bias");

  std::vector<float> sums_in = Random(rows * cols);
  Buffer dsum_in = ToDevice(sums_in), dsum = *backend_->Allocate(cols * sizeof(float));
  ASSERT_TRUE(backend_->ColumnSum(dsum_in.data(), rows, cols, dsum.data()).ok());
  std::vector<double> col(cols, 0.0);
  for (int i = 0; i < rows * cols; ++i) col[i % cols] += sums_in[i];
  ExpectClose(ToHost(dsum.data(), cols), col, "column sum");

  for (v1::Activation f : {v1::IDENTITY, v1::RELU, v1::TANH, v1::SIGMOID}) {
    std::vector<float> x = Random(rows * cols, 2.0), g = Random(rows * cols);
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
    ExpectClose(ToHost(dx.data(), x.size()), fy, v1::Activation_Name(f).c_str());
    ASSERT_TRUE(backend_->ActivationGrad(f, dx.data(), dg.data(), x.size()).ok());
    ExpectClose(ToHost(dg.data(), x.size()), fg, (v1::Activation_Name(f) + " grad").c_str());
  }
  EXPECT_FALSE(backend_->Activate(v1::SOFTMAX, dy.data(), 1).ok());
}

TEST_P(BackendTest, SoftmaxCrossEntropy) {
  const int rows = 33, cols = 10;
  std::vector<float> z = Random(rows * cols, 3.0);
  z[5] = 80.0f;  // large logits must not overflow
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = static_cast<int32_t>(rng_() % cols);
  Buffer dz = ToDevice(z), dp = *backend_->Allocate(z.size() * sizeof(float)),
         dd = *backend_->Allocate(z.size() * sizeof(float)), ds = *backend_->Allocate(2 * sizeof(float)),
         dl = *backend_->Allocate(rows * sizeof(int32_t));
  ASSERT_TRUE(backend_->Upload(labels.data(), dl.data(), rows * sizeof(int32_t)).ok());
  ASSERT_TRUE(backend_->SoftmaxCrossEntropy(dz.data(), dl.data<int32_t>(), rows, cols, 1.0f / rows, dp.data(),
                                            dd.data(), ds.data()).ok());
  std::vector<double> p(z.size()), d(z.size());
  double loss = 0;
  int correct = 0;
  for (int r = 0; r < rows; ++r) {
    double mx = -1e300, sum = 0;
    int arg = 0;
    for (int c = 0; c < cols; ++c) {
      if (z[r * cols + c] > mx) mx = z[r * cols + c], arg = c;
    }
    for (int c = 0; c < cols; ++c) sum += std::exp(z[r * cols + c] - mx);
    for (int c = 0; c < cols; ++c) {
      p[r * cols + c] = std::exp(z[r * cols + c] - mx) / sum;
      d[r * cols + c] = (p[r * cols + c] - (c == labels[r])) / rows;
    }
    loss += mx + std::log(sum) - z[r * cols + labels[r]];
    correct += arg == labels[r];
  }
  ExpectClose(ToHost(dp.data(), z.size()), p, "softmax");
  ExpectClose(ToHost(dd.data(), z.size()), d, "dlogits");
  std::vector<float> stats = ToHost(ds.data(), 2);
  EXPECT_NEAR(stats[0], loss, GetParam().tolerance * 10 * loss);
  EXPECT_EQ(stats[1], correct);
}

TEST_P(BackendTest, WholeTrainingStepMatchesDoubleReference) {
  v1::ModelConfig config;
  config.set_input_width(11);
  config.set_num_classes(4);
  auto* seg = config.add_segments();
  seg->set_name("s");
  // Every activation appears once, so the check covers each layer kind.
  const int widths[] = {11, 9, 7, 6, 5, 4};
  const v1::Activation acts[] = {v1::TANH, v1::RELU, v1::SIGMOID, v1::IDENTITY, v1::SOFTMAX};
  const int layers = 5;
  for (auto [units, f] : {std::pair{9u, v1::TANH}, std::pair{7u, v1::RELU}, std::pair{6u, v1::SIGMOID},
                          std::pair{5u, v1::IDENTITY}, std::pair{4u, v1::SOFTMAX}}) {
    auto* l = seg->add_layers();
    l->set_units(units);
    l->set_activation(f);
  }
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

  // Reference: the same network in double, gradients by central differences.
  auto loss = [&](const std::vector<double>& w) {
    double total = 0;
    for (int r = 0; r < rows; ++r) {
      std::vector<double> a(x.begin() + r * 11, x.begin() + (r + 1) * 11);
      size_t off = 0;
      for (int l = 0; l < layers; ++l) {
        std::vector<double> z(widths[l + 1], 0.0);
        for (int j = 0; j < widths[l + 1]; ++j) {
          for (int i = 0; i < widths[l]; ++i) z[j] += a[i] * w[off + i * widths[l + 1] + j];
          z[j] += w[off + widths[l] * widths[l + 1] + j];
        }
        off += widths[l] * widths[l + 1] + widths[l + 1];
        for (double& v : z) {
          if (acts[l] == v1::TANH) v = std::tanh(v);
          if (acts[l] == v1::RELU) v = std::max(v, 0.0);
          if (acts[l] == v1::SIGMOID) v = 1 / (1 + std::exp(-v));
        }
        a = z;
      }
      double mx = *std::max_element(a.begin(), a.end()), sum = 0;
      for (double v : a) sum += std::exp(v - mx);
      total += mx + std::log(sum) - a[y[r]];
    }
    return total / rows;
  };
  std::vector<double> w(params.begin(), params.end()), numeric(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const double h = 1e-6;
    std::vector<double> plus = w, minus = w;
    plus[i] += h;
    minus[i] -= h;
    numeric[i] = (loss(plus) - loss(minus)) / (2 * h);
  }
  ExpectClose(grad, numeric, "model gradient");
  ASSERT_TRUE(model->DownloadStats().ok());
  ASSERT_TRUE(backend_->Synchronize().ok());
  EXPECT_NEAR(model->stats().loss_sum / rows, loss(w), GetParam().tolerance);
}

// The same suite runs in two binaries: the CPU instance (label unit) and,
// when CUDA is compiled in, the GPU instances (label gpu), which skip with
// the reason when no GPU is usable.
std::vector<BackendParam> Backends() {
#ifdef SEGPS_CONFORMANCE_GPU
  // TF32 keeps 10 mantissa bits: products are good to about 1e-3 relative.
  return {{"cuda", "cuda:0", false, 1e-5}, {"cuda_tf32", "cuda:0", true, 5e-3}};
#else
  // OpenBLAS splits a product over its threads: the sums regroup, the bound holds.
  return {{"cpu", "cpu", false, 1e-5}, {"cpu_2_threads", "cpu", false, 1e-5, 2}};
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
