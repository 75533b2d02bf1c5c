#include "worker/model/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/cuda_kernels.h"

namespace segps {
namespace {

// Out of device memory is RESOURCE_EXHAUSTED, as on the CPU; a machine
// whose driver or devices cannot run us FAILED_PRECONDITION; anything else
// is a fault of ours or of the device: INTERNAL.
absl::Status Check(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorNoKernelImageForDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status Check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(call, ": ", cublasGetStatusName(status), ": ", cublasGetStatusString(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (status == CUBLAS_STATUS_ARCH_MISMATCH || status == CUBLAS_STATUS_NOT_SUPPORTED) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

#define SEGPS_CUDA(call) Check((call), #call)

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override {
    partials_ = Buffer();
    if (timing_[0] != nullptr) cudaEventDestroy(timing_[0]);
    if (timing_[1] != nullptr) cudaEventDestroy(timing_[1]);
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  static absl::StatusOr<std::unique_ptr<Backend>> Create(int device, bool allow_tf32) {
    auto backend = std::unique_ptr<CudaBackend>(new CudaBackend(device));
    absl::Status s = SEGPS_CUDA(cudaSetDevice(device));
    if (s.ok()) s = SEGPS_CUDA(cudaStreamCreateWithFlags(&backend->stream_, cudaStreamNonBlocking));
    if (s.ok()) s = SEGPS_CUDA(cublasCreate(&backend->handle_));
    if (s.ok()) s = SEGPS_CUDA(cublasSetStream(backend->handle_, backend->stream_));
    // float32 products in float32 unless TF32 is asked for (the default
    // math mode uses no TF32; the pedantic one is for testing, and slower).
    if (s.ok()) {
      s = SEGPS_CUDA(cublasSetMathMode(backend->handle_, allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                     : CUBLAS_DEFAULT_MATH));
    }
    for (cudaEvent_t& event : backend->timing_) {
      if (s.ok()) s = SEGPS_CUDA(cudaEventCreate(&event));
    }
    if (!s.ok()) return s;
    return std::unique_ptr<Backend>(std::move(backend));
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  bool host_addressable() const override { return false; }

  absl::StatusOr<Buffer> Allocate(size_t bytes) override {
    void* p = nullptr;
    absl::Status s = SEGPS_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 4)));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("cuda: allocating ", bytes, " bytes: ", s.message()));
    return Buffer(p, bytes, [](void* q) { cudaFree(q); });
  }
  absl::StatusOr<Buffer> AllocateHost(size_t bytes) override {
    void* p = nullptr;
    absl::Status s = SEGPS_CUDA(cudaMallocHost(&p, std::max<size_t>(bytes, 4)));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("cuda: allocating ", bytes, " pinned host bytes: ", s.message()));
    return Buffer(p, bytes, [](void* q) { cudaFreeHost(q); });
  }

  absl::Status Upload(const void* host, void* device, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    return SEGPS_CUDA(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
  }
  absl::Status Download(const void* device, void* host, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    return SEGPS_CUDA(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  absl::Status Synchronize() override { return SEGPS_CUDA(cudaStreamSynchronize(stream_)); }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
  // cuBLAS gets the operands swapped and no data moves.
  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) override {
    const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
    return SEGPS_CUDA(cublasSgemm(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  n, m, k, &alpha, b, ldb, a, lda, &beta, c, n));
  }

  absl::Status AddBias(float* y, const float* bias, int rows, int cols) override {
    return SEGPS_CUDA(cuda::AddBias(y, bias, rows, cols, stream_));
  }
  absl::Status Activate(v1::Activation f, float* y, size_t n) override {
    absl::Status s = CheckHiddenActivation("cuda: Activate", f);
    if (!s.ok()) return s;
    return SEGPS_CUDA(cuda::Activate(static_cast<int>(f), y, n, stream_));
  }
  absl::Status ActivationGrad(v1::Activation f, const float* y, float* dy, size_t n) override {
    absl::Status s = CheckHiddenActivation("cuda: ActivationGrad", f);
    if (!s.ok()) return s;
    return SEGPS_CUDA(cuda::ActivationGrad(static_cast<int>(f), y, dy, n, stream_));
  }
  absl::Status ColumnSum(const float* x, int rows, int cols, float* out) override {
    return SEGPS_CUDA(cuda::ColumnSum(x, rows, cols, out, stream_));
  }
  absl::Status Dropout(const float* y, float* out, size_t n, float rate, uint64_t seed, uint64_t first) override {
    return SEGPS_CUDA(cuda::Dropout(y, out, n, 1.0f / (1.0f - rate), seed, first, DropoutThreshold(rate), stream_));
  }
  absl::Status SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                   float grad_scale, float* probs, float* dlogits, float* stats) override {
    if (labels != nullptr && stats != nullptr) SEGPS_RETURN_IF_ERROR(GrowPartials(rows));
    return SEGPS_CUDA(cuda::SoftmaxCrossEntropy(logits, labels, rows, cols, grad_scale, probs, dlogits, stats,
                                                partials_.data<double>(), stream_));
  }
  absl::Status SquaredError(const float* preds, const float* targets, int rows, float grad_scale, float* outputs,
                            float* dpreds, float* stats) override {
    if (targets != nullptr && stats != nullptr) SEGPS_RETURN_IF_ERROR(GrowPartials(rows));
    return SEGPS_CUDA(cuda::SquaredError(preds, targets, rows, grad_scale, outputs, dpreds, stats,
                                         partials_.data<double>(), stream_));
  }

  absl::Status StartTiming() override { return SEGPS_CUDA(cudaEventRecord(timing_[0], stream_)); }
  absl::StatusOr<absl::Duration> StopTiming() override {
    absl::Status s = SEGPS_CUDA(cudaEventRecord(timing_[1], stream_));
    if (s.ok()) s = SEGPS_CUDA(cudaEventSynchronize(timing_[1]));
    float ms = 0;
    if (s.ok()) s = SEGPS_CUDA(cudaEventElapsedTime(&ms, timing_[0], timing_[1]));
    if (!s.ok()) return s;
    return absl::Nanoseconds(static_cast<int64_t>(double{ms} * 1e6));
  }

 private:
  explicit CudaBackend(int device) : device_(device) {}
  // Room for the loss kernels' per-block sums of `rows` rows: grown to the
  // largest batch seen; the old scratch may still be read by enqueued work.
  absl::Status GrowPartials(int rows) {
    const size_t partials = 2 * static_cast<size_t>(cuda::SoftmaxBlocks(rows)) * sizeof(double);
    if (partials <= partials_.bytes()) return absl::OkStatus();
    SEGPS_RETURN_IF_ERROR(Synchronize());
    partials_ = Buffer();
    absl::StatusOr<Buffer> grown = Allocate(partials);
    if (!grown.ok()) return grown.status();
    partials_ = *std::move(grown);
    return absl::OkStatus();
  }
  const int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  cudaEvent_t timing_[2] = {nullptr, nullptr};  // StartTiming's and StopTiming's marks
  Buffer partials_;                             // the loss kernels' per-block sums
};

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, bool allow_tf32) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("--device cuda:", device, ": no usable GPU on this machine (",
                                                      cudaGetErrorString(error), "); use --device cpu or auto"));
  }
  if (device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("--device cuda:", device, ": this machine has ", count,
                                                      " GPU(s), numbered from 0"));
  }
  return CudaBackend::Create(device, allow_tf32);
}

}  // namespace
}  // namespace segps

extern "C" __attribute__((visibility("default"))) const segps::CudaBackendApi* segps_cuda_backend_api() {
  static const segps::CudaBackendApi api = {&segps::CudaDeviceCount, &segps::CreateCudaBackend};
  return &api;
}
