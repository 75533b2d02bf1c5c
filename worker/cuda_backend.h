// The CUDA/cuBLAS backend: one device, one stream and one cuBLAS handle per
// backend (a worker owns one). Everything is enqueued on the stream; only
// Synchronize waits. Every CUDA and cuBLAS call is checked and a failure
// becomes a Status naming the call and the error.
#ifndef SEGPS_WORKER_CUDA_BACKEND_H_
#define SEGPS_WORKER_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend.h"

namespace segps {

// Usable CUDA devices; 0 without a driver or a GPU.
int CudaDeviceCount();

// A backend on GPU `device`. `allow_tf32` lets cuBLAS use TF32 tensor cores
// for float32 products (faster, ~1e-3 relative error); off matches the CPU.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device, bool allow_tf32);

}  // namespace segps

#endif  // SEGPS_WORKER_CUDA_BACKEND_H_
