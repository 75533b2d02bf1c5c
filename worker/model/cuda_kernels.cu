#include "worker/model/cuda_kernels.h"

namespace segps {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 32 ? blocks : 65535 * 32);
}

__global__ void AddBiasKernel(float* y, const float* bias, int rows, int cols) {
  const size_t n = static_cast<size_t>(rows) * cols;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % cols];
  }
}

__global__ void ActivateKernel(int activation, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = y[i];
    switch (activation) {
      case kRelu: y[i] = v > 0.0f ? v : 0.0f; break;
      case kTanh: y[i] = tanhf(v); break;
      case kSigmoid: y[i] = 1.0f / (1.0f + expf(-v)); break;
      default: break;
    }
  }
}

__global__ void ActivationGradKernel(int activation, const float* y, float* dy, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = y[i];
    switch (activation) {
      case kRelu: dy[i] = v > 0.0f ? dy[i] : 0.0f; break;
      case kTanh: dy[i] *= 1.0f - v * v; break;
      case kSigmoid: dy[i] *= v * (1.0f - v); break;
      default: break;
    }
  }
}

// One thread per column; adjacent threads read adjacent addresses of a row.
// common/hash.h's Mix64, on the device.
__device__ uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void DropoutKernel(const float* y, float* out, size_t n, float scale, uint64_t seed, uint64_t first,
                              uint64_t threshold) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = (Mix64(seed + first + i) >> 40) >= threshold ? y[i] * scale : 0.0f;
}

__global__ void ColumnSumKernel(const float* x, int rows, int cols, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += x[static_cast<size_t>(r) * cols + c];
  out[c] = sum;
}

// Sums v over the block in a fixed order (a tree over thread indices), so
// that the result does not depend on how the threads were scheduled.
// Every thread of the block must call it; thread 0 gets the sum.
__device__ double BlockSum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const double sum = shared[0];
  __syncthreads();  // `shared` may be written again by the next call
  return sum;
}

// One thread per row: class counts are small. With labels and `partials`,
// each block leaves its rows' summed cross-entropy and correct predictions,
// in double, at partials[2 * block], partials[2 * block + 1].
__global__ void SoftmaxXentKernel(const float* logits, const int32_t* labels, int rows, int cols,
                                  float grad_scale, float* probs, float* dlogits, double* partials) {
  __shared__ double shared[kThreads];
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  double loss = 0.0, correct = 0.0;
  if (r < rows) {
    const float* z = logits + static_cast<size_t>(r) * cols;
    float* p = probs + static_cast<size_t>(r) * cols;
    float max = z[0];
    int argmax = 0;
    for (int c = 1; c < cols; ++c) {
      if (z[c] > max) max = z[c], argmax = c;
    }
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c) {
      p[c] = expf(z[c] - max);
      sum += p[c];
    }
    const float inv = 1.0f / sum;
    for (int c = 0; c < cols; ++c) p[c] *= inv;
    if (labels != nullptr) {
      const int y = labels[r];
      if (dlogits != nullptr) {
        float* d = dlogits + static_cast<size_t>(r) * cols;
        for (int c = 0; c < cols; ++c) d[c] = (p[c] - (c == y ? 1.0f : 0.0f)) * grad_scale;
      }
      // log softmax from the logits directly, as the CPU: exact when p[y] underflows.
      loss = static_cast<double>(max) + log(static_cast<double>(sum)) - z[y];
      correct = argmax == y ? 1.0 : 0.0;
    }
  }
  if (labels == nullptr || partials == nullptr) return;  // uniform over the block: no thread waits alone
  loss = BlockSum(loss, shared);
  correct = BlockSum(correct, shared);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = loss;
    partials[2 * blockIdx.x + 1] = correct;
  }
}

// One thread per row of a one-column output: outputs = preds, and with
// targets dpreds = 2 (pred - target) grad_scale; each block leaves its
// rows' summed squared and absolute errors at partials[2 * block], [+ 1].
__global__ void SquaredErrorKernel(const float* preds, const float* targets, int rows, float grad_scale,
                                   float* outputs, float* dpreds, double* partials) {
  __shared__ double shared[kThreads];
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  double squared = 0.0, absolute = 0.0;
  if (r < rows) {
    const float p = preds[r];
    outputs[r] = p;
    if (targets != nullptr) {
      const float e = p - targets[r];
      if (dpreds != nullptr) dpreds[r] = 2.0f * e * grad_scale;
      squared = static_cast<double>(e) * e;
      absolute = fabs(static_cast<double>(e));
    }
  }
  if (targets == nullptr || partials == nullptr) return;  // uniform over the block
  squared = BlockSum(squared, shared);
  absolute = BlockSum(absolute, shared);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = squared;
    partials[2 * blockIdx.x + 1] = absolute;
  }
}

// One block: the blocks' partial sums in a fixed order, into stats[0..1].
__global__ void ReduceStatsKernel(const double* partials, int blocks, float* stats) {
  __shared__ double shared[kThreads];
  double loss = 0.0, correct = 0.0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    loss += partials[2 * b];
    correct += partials[2 * b + 1];
  }
  loss = BlockSum(loss, shared);
  correct = BlockSum(correct, shared);
  if (threadIdx.x == 0) {
    stats[0] = static_cast<float>(loss);
    stats[1] = static_cast<float>(correct);
  }
}

}  // namespace

cudaError_t AddBias(float* y, const float* bias, int rows, int cols, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(n), kThreads, 0, stream>>>(y, bias, rows, cols);
  return cudaGetLastError();
}

cudaError_t Activate(int activation, float* y, size_t n, cudaStream_t stream) {
  if (n == 0 || activation == kIdentity) return cudaSuccess;
  ActivateKernel<<<Blocks(n), kThreads, 0, stream>>>(activation, y, n);
  return cudaGetLastError();
}

cudaError_t ActivationGrad(int activation, const float* y, float* dy, size_t n, cudaStream_t stream) {
  if (n == 0 || activation == kIdentity) return cudaSuccess;
  ActivationGradKernel<<<Blocks(n), kThreads, 0, stream>>>(activation, y, dy, n);
  return cudaGetLastError();
}

cudaError_t ColumnSum(const float* x, int rows, int cols, float* out, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  ColumnSumKernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, stream>>>(x, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t Dropout(const float* y, float* out, size_t n, float scale, uint64_t seed, uint64_t first,
                    uint64_t threshold, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DropoutKernel<<<Blocks(n), kThreads, 0, stream>>>(y, out, n, scale, seed, first, threshold);
  return cudaGetLastError();
}

int SoftmaxBlocks(int rows) { return (rows + kThreads - 1) / kThreads; }

cudaError_t SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                float grad_scale, float* probs, float* dlogits, float* stats,
                                double* partials, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int blocks = SoftmaxBlocks(rows);
  const bool sums = labels != nullptr && stats != nullptr;
  SoftmaxXentKernel<<<blocks, kThreads, 0, stream>>>(logits, labels, rows, cols, grad_scale, probs, dlogits,
                                                     sums ? partials : nullptr);
  if (!sums) return cudaGetLastError();
  ReduceStatsKernel<<<1, kThreads, 0, stream>>>(partials, blocks, stats);
  return cudaGetLastError();
}

cudaError_t SquaredError(const float* preds, const float* targets, int rows, float grad_scale, float* outputs,
                         float* dpreds, float* stats, double* partials, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int blocks = SoftmaxBlocks(rows);
  const bool sums = targets != nullptr && stats != nullptr;
  SquaredErrorKernel<<<blocks, kThreads, 0, stream>>>(preds, targets, rows, grad_scale, outputs, dpreds,
                                                      sums ? partials : nullptr);
  if (!sums) return cudaGetLastError();
  ReduceStatsKernel<<<1, kThreads, 0, stream>>>(partials, blocks, stats);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace segps
