// Maps a --device name to a backend.
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/backend.h"
#ifdef SEGPS_WITH_CUDA
#include "worker/cuda_backend.h"
#endif

namespace segps {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& device, bool allow_tf32) {
  if (device == "cpu") return CreateCpuBackend(1);
  if (device == "auto") {
#ifdef SEGPS_WITH_CUDA
    if (CudaDeviceCount() > 0) return CreateCudaBackend(0, allow_tf32);
#endif
    return CreateCpuBackend(1);
  }
  if (absl::StartsWith(device, "cuda:")) {
    int index = -1;
    if (!absl::SimpleAtoi(device.substr(5), &index) || index < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--device ", device, ": expected cuda:N with N >= 0"));
    }
#ifdef SEGPS_WITH_CUDA
    return CreateCudaBackend(index, allow_tf32);
#else
    (void)allow_tf32;
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", device, ": this build has no CUDA backend (rebuild with nvcc and cuBLAS "
        "present, -DSEGPS_WITH_CUDA=ON); use --device cpu"));
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device ", device, ": expected cpu, cuda:N or auto"));
}

}  // namespace segps
