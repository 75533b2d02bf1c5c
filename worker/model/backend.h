// Compute backends for workers: where a segment's forward and backward pass
// run. The CPU backend uses OpenBLAS; the CUDA backend uses cuBLAS.
//
// The interface is shaped for a device with its own memory and an
// asynchronous stream: buffers come from the backend, host data crosses by
// explicit Upload/Download (which may return before the copy is done), and
// every op is enqueued in order. Synchronize() is the only point where the
// host may rely on results, and on host buffers passed to Upload/Download
// being free again. On the CPU everything completes immediately.
//
// All matrices are row-major. Pointers passed to ops are device pointers
// obtained from DeviceBuffer::data().
//
// Thread safety: a backend and its buffers belong to one thread.
#ifndef SEGPS_WORKER_MODEL_BACKEND_H_
#define SEGPS_WORKER_MODEL_BACKEND_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/hash.h"
#include "segps/v1/config.pb.h"

namespace segps {

// Inverted dropout keeps element `index` under `seed` iff the top 24 bits
// of Mix64(seed + index) (common/hash.h) are at least
// DropoutThreshold(rate) = ceil(rate x 2^24): the same on every backend.
inline uint64_t DropoutThreshold(float rate) {
  return static_cast<uint64_t>(std::ceil(static_cast<double>(rate) * 16777216.0));
}
inline bool DropoutKeeps(uint64_t seed, uint64_t index, uint64_t threshold) {
  return (Mix64(seed + index) >> 40) >= threshold;
}

// Memory owned by a backend: device memory, or pinned host memory for
// staging transfers. Freed by its destructor.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, size_t bytes, std::function<void(void*)> free)
      : data_(data), bytes_(bytes), free_(std::move(free)) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = other.data_;
      bytes_ = other.bytes_;
      free_ = std::move(other.free_);
      other.data_ = nullptr;
      other.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Release(); }

  template <typename T = float>
  T* data() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Release() {
    if (data_ != nullptr && free_) free_(data_);
    data_ = nullptr;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> free_;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  // True when device pointers are ordinary host memory, so the host may read
  // a result in place (after Synchronize) instead of downloading a copy.
  virtual bool host_addressable() const = 0;

  // Device memory of `bytes` bytes, uninitialised.
  virtual absl::StatusOr<Buffer> Allocate(size_t bytes) = 0;
  // Host memory suited to fast transfers (pinned on a GPU).
  virtual absl::StatusOr<Buffer> AllocateHost(size_t bytes) = 0;

  // Host -> device and device -> host copies of `bytes`, enqueued.
  virtual absl::Status Upload(const void* host, void* device, size_t bytes) = 0;
  virtual absl::Status Download(const void* device, void* host, size_t bytes) = 0;
  // Waits for everything enqueued.
  virtual absl::Status Synchronize() = 0;

  // C[m x n] = alpha * op(A) * op(B) + beta * C, with op(A) m x k and
  // op(B) k x n; trans_* transposes the stored matrix.
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            const float* a, const float* b, float beta, float* c) = 0;
  // y[r, :] += bias for every row of a rows x cols matrix.
  virtual absl::Status AddBias(float* y, const float* bias, int rows, int cols) = 0;
  // In place y = f(y) for a hidden-layer activation (not SOFTMAX).
  virtual absl::Status Activate(v1::Activation f, float* y, size_t n) = 0;
  // dy *= f'(x) expressed through the activation's output y = f(x).
  virtual absl::Status ActivationGrad(v1::Activation f, const float* y, float* dy, size_t n) = 0;
  // out[c] = sum over rows of x[r, c].
  virtual absl::Status ColumnSum(const float* x, int rows, int cols, float* out) = 0;
  // Inverted dropout: out[i] = y[i] / (1 - rate) where DropoutKeeps(seed,
  // first + i, DropoutThreshold(rate)), else 0 (out may be y). `first` places the n elements
  // in the layer's output, so that a block's mask is the same in its
  // forward and its backward, and on every backend.
  virtual absl::Status Dropout(const float* y, float* out, size_t n, float rate, uint64_t seed, uint64_t first) = 0;
  // Row-wise softmax of logits into probs; with labels (may be null for
  // inference) also dlogits = (probs - onehot(labels)) * grad_scale and
  // stats[0] = summed cross-entropy, stats[1] = correct predictions.
  virtual absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                           int cols, float grad_scale, float* probs,
                                           float* dlogits, float* stats) = 0;
  // A regression's one-column output (model.loss MSE): outputs = preds;
  // with targets (may be null for inference) also dpreds = 2 (preds -
  // targets) * grad_scale and stats[0] = summed squared error, stats[1] =
  // summed absolute error.
  virtual absl::Status SquaredError(const float* preds, const float* targets, int rows, float grad_scale,
                                    float* outputs, float* dpreds, float* stats) = 0;

  // The time the ops enqueued between StartTiming() and StopTiming() took
  // to run on the device; StopTiming waits for them. On the CPU, where an op
  // completes as it is called, the wall time between the two calls.
  virtual absl::Status StartTiming() = 0;
  virtual absl::StatusOr<absl::Duration> StopTiming() = 0;
};

// OK for an activation a hidden layer may apply (IDENTITY, RELU, TANH,
// SIGMOID); otherwise INVALID_ARGUMENT naming `op` and the value, which may
// be one no enum name has (a config that is not text). Written without
// protobuf's reflection, so the CUDA plugin can use it.
inline absl::Status CheckHiddenActivation(const char* op, v1::Activation f) {
  static constexpr const char* kNames[] = {"ACTIVATION_UNSPECIFIED", "IDENTITY", "RELU", "TANH", "SIGMOID", "SOFTMAX"};
  const int code = static_cast<int>(f);
  if (f == v1::IDENTITY || f == v1::RELU || f == v1::TANH || f == v1::SIGMOID) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": activation ", code >= 0 && code <= 5 ? kNames[code] : absl::StrCat(code),
                   " is not one a hidden layer applies (IDENTITY, RELU, TANH, SIGMOID)"));
}

// The OpenBLAS backend. Sets OpenBLAS (one pool per process) to `threads`
// threads.
std::unique_ptr<Backend> CreateCpuBackend(int threads = 1);

// The most threads a CPU backend accepts.
inline constexpr int kMaxCpuThreads = 256;

// Creates the backend named by a --device flag: "cpu", "cuda:N" or "auto"
// (a GPU when one is usable, else the CPU). A GPU name on a machine or build
// without one is an error that says so. `allow_tf32` lets a GPU use TF32
// tensor cores for float32 products (faster, about 1e-3 relative error).
// `cpu_threads` (1..kMaxCpuThreads) is the CPU backend's thread count: 1
// suits a worker per core; more suit a worker whose servers are idle while it
// computes, as under staleness 0.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& device, bool allow_tf32 = false,
                                                       int cpu_threads = 1);

}  // namespace segps

#endif  // SEGPS_WORKER_MODEL_BACKEND_H_
