// The CUDA kernels of the GPU backend, behind plain launch functions so that
// only cuda_kernels.cu goes through nvcc. Each launch is enqueued on `stream`
// and returns the launch error (cudaSuccess when enqueued).
#ifndef SEGPS_WORKER_MODEL_CUDA_KERNELS_H_
#define SEGPS_WORKER_MODEL_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace segps {
namespace cuda {

// Activation codes, the values of segps.v1.Activation.
enum ActivationCode : int { kIdentity = 1, kRelu = 2, kTanh = 3, kSigmoid = 4 };

cudaError_t AddBias(float* y, const float* bias, int rows, int cols, cudaStream_t stream);
cudaError_t Activate(int activation, float* y, size_t n, cudaStream_t stream);
cudaError_t ActivationGrad(int activation, const float* y, float* dy, size_t n, cudaStream_t stream);
cudaError_t ColumnSum(const float* x, int rows, int cols, float* out, cudaStream_t stream);
// out[i] = y[i] * scale where the top 24 bits of Mix64(seed + first + i)
// are at least `threshold`, else 0 (Backend::Dropout; out may be y).
cudaError_t Dropout(const float* y, float* out, size_t n, float scale, uint64_t seed, uint64_t first,
                    uint64_t threshold, cudaStream_t stream);
// labels, dlogits and stats may be null. With labels and stats, the loss
// and correct count are summed in double, per block and then over blocks in
// a fixed order (the same sums on every run), in `partials`: scratch of
// 2 * SoftmaxBlocks(rows) doubles.
int SoftmaxBlocks(int rows);
cudaError_t SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                float grad_scale, float* probs, float* dlogits, float* stats,
                                double* partials, cudaStream_t stream);
// The squared error of a one-column output (Backend::SquaredError), with
// per-block sums in `partials` (2 * SoftmaxBlocks(rows) doubles) as above.
cudaError_t SquaredError(const float* preds, const float* targets, int rows, float grad_scale, float* outputs,
                         float* dpreds, float* stats, double* partials, cudaStream_t stream);

}  // namespace cuda
}  // namespace segps

#endif  // SEGPS_WORKER_MODEL_CUDA_KERNELS_H_
