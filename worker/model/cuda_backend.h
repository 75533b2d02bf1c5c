// The CUDA/cuBLAS backend, built as a plugin (libsegps_cuda.so) that
// workers load only when asked for a GPU: CPU workers never map the CUDA
// libraries (hundreds of megabytes and a tenth of a second at start-up).
// CreateBackend (backend.h) is the way in; this header is the plugin's
// contract.
//
// The backend holds one device, one stream and one cuBLAS handle. Everything
// is enqueued on the stream; only Synchronize waits. Every CUDA and cuBLAS
// call is checked and a failure becomes a Status naming the call and the error.
#ifndef SEGPS_WORKER_MODEL_CUDA_BACKEND_H_
#define SEGPS_WORKER_MODEL_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/backend.h"

namespace segps {

struct CudaBackendApi {
  // Usable CUDA devices; 0 without a driver or a GPU.
  int (*device_count)();
  // A backend on GPU `device`. `allow_tf32` lets cuBLAS use TF32 tensor
  // cores for float32 products (faster, ~1e-3 relative error).
  absl::StatusOr<std::unique_ptr<Backend>> (*create)(int device, bool allow_tf32);
};

}  // namespace segps

// The plugin's one exported symbol.
extern "C" const segps::CudaBackendApi* segps_cuda_backend_api();

#endif  // SEGPS_WORKER_MODEL_CUDA_BACKEND_H_
