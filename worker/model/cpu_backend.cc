// The CPU backend: OpenBLAS sgemm for the products, plain loops (which the
// compiler vectorises) for the element-wise ops.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/model/backend.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace segps {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) { openblas_set_num_threads(std::max(1, threads)); }

  std::string name() const override { return "cpu"; }
  bool host_addressable() const override { return true; }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override {
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    void* data = std::aligned_alloc(64, rounded);
    if (data == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    return Buffer(data, bytes, [](void* p) { std::free(p); });
  }
  absl::StatusOr<Buffer> AllocateHost(size_t bytes) override { return Allocate(bytes); }

  absl::Status Upload(const void* host, void* device, size_t bytes) override {
    if (bytes > 0 && host != device) std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  absl::Status Download(const void* device, void* host, size_t bytes) override {
    if (bytes > 0 && host != device) std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, trans_a ? m : k, b,
                trans_b ? k : n, beta, c, n);
    return absl::OkStatus();
  }

  absl::Status AddBias(float* y, const float* bias, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      float* __restrict row = y + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
    return absl::OkStatus();
  }

  absl::Status Activate(v1::Activation f, float* y, size_t n) override {
    switch (f) {
      case v1::IDENTITY:
        break;
      case v1::RELU:
        for (size_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
        break;
      case v1::TANH:
        for (size_t i = 0; i < n; ++i) y[i] = std::tanh(y[i]);
        break;
      case v1::SIGMOID:
        for (size_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-y[i]));
        break;
      default:
        return CheckHiddenActivation("cpu: Activate", f);
    }
    return absl::OkStatus();
  }

  absl::Status ActivationGrad(v1::Activation f, const float* y, float* dy, size_t n) override {
    switch (f) {
      case v1::IDENTITY:
        break;
      case v1::RELU:
        for (size_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        break;
      case v1::TANH:
        for (size_t i = 0; i < n; ++i) dy[i] *= 1.0f - y[i] * y[i];
        break;
      case v1::SIGMOID:
        for (size_t i = 0; i < n; ++i) dy[i] *= y[i] * (1.0f - y[i]);
        break;
      default:
        return CheckHiddenActivation("cpu: ActivationGrad", f);
    }
    return absl::OkStatus();
  }

  absl::Status Dropout(const float* y, float* out, size_t n, float rate, uint64_t seed, uint64_t first) override {
    const uint64_t threshold = DropoutThreshold(rate);
    const float scale = 1.0f / (1.0f - rate);
    for (size_t i = 0; i < n; ++i) out[i] = DropoutKeeps(seed, first + i, threshold) ? y[i] * scale : 0.0f;
    return absl::OkStatus();
  }

  absl::Status ColumnSum(const float* x, int rows, int cols, float* out) override {
    std::fill(out, out + cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* __restrict row = x + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) out[c] += row[c];
    }
    return absl::OkStatus();
  }

  absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                   float grad_scale, float* probs, float* dlogits,
                                   float* stats) override {
    double loss = 0.0;
    int correct = 0;
    for (int r = 0; r < rows; ++r) {
      const float* z = logits + static_cast<size_t>(r) * cols;
      float* p = probs + static_cast<size_t>(r) * cols;
      const float max = *std::max_element(z, z + cols);
      float sum = 0.0f;
      int argmax = 0;
      for (int c = 0; c < cols; ++c) {
        if (z[c] > z[argmax]) argmax = c;
        p[c] = std::exp(z[c] - max);
        sum += p[c];
      }
      const float inv = 1.0f / sum;
      for (int c = 0; c < cols; ++c) p[c] *= inv;
      if (labels == nullptr) continue;
      const int y = labels[r];
      // log softmax from the logits directly: exact even when p[y] underflows.
      loss += static_cast<double>(max) + std::log(static_cast<double>(sum)) - z[y];
      correct += argmax == y;
      if (dlogits != nullptr) {
        float* d = dlogits + static_cast<size_t>(r) * cols;
        for (int c = 0; c < cols; ++c) d[c] = (p[c] - (c == y ? 1.0f : 0.0f)) * grad_scale;
      }
    }
    if (labels != nullptr && stats != nullptr) {
      stats[0] = static_cast<float>(loss);
      stats[1] = static_cast<float>(correct);
    }
    return absl::OkStatus();
  }

  absl::Status SquaredError(const float* preds, const float* targets, int rows, float grad_scale, float* outputs,
                            float* dpreds, float* stats) override {
    double squared = 0.0, absolute = 0.0;
    for (int r = 0; r < rows; ++r) {
      const float p = preds[r];
      outputs[r] = p;
      if (targets == nullptr) continue;
      const float e = p - targets[r];
      if (dpreds != nullptr) dpreds[r] = 2.0f * e * grad_scale;
      squared += static_cast<double>(e) * e;
      absolute += std::fabs(static_cast<double>(e));
    }
    if (targets != nullptr && stats != nullptr) {
      stats[0] = static_cast<float>(squared);
      stats[1] = static_cast<float>(absolute);
    }
    return absl::OkStatus();
  }

  absl::Status StartTiming() override {
    timing_since_ = absl::Now();
    return absl::OkStatus();
  }
  absl::StatusOr<absl::Duration> StopTiming() override { return absl::Now() - timing_since_; }

 private:
  absl::Time timing_since_ = absl::Now();
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace segps
