// Maps a --device name to a backend. The CUDA backend is a plugin loaded
// from beside the executable on first use (see cuda_backend.h).
#include <dlfcn.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/model/backend.h"
#include "worker/model/cuda_backend.h"

namespace segps {
namespace {

struct CudaPlugin {
  const CudaBackendApi* api = nullptr;
  std::string error;  // why it could not be loaded
};

// Loaded once, never unloaded: backends and buffers point into it.
const CudaPlugin& LoadCudaPlugin() {
  static const CudaPlugin plugin = [] {
    CudaPlugin p;
#ifdef SEGPS_WITH_CUDA
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    const std::string path(self, n > 0 ? n : 0);
    const std::string beside = path.substr(0, path.rfind('/') + 1) + "libsegps_cuda.so";
    void* handle = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) handle = dlopen("libsegps_cuda.so", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      p.error = absl::StrCat("cannot load the CUDA backend (libsegps_cuda.so): ", dlerror());
      return p;
    }
    auto entry = reinterpret_cast<const CudaBackendApi* (*)()>(dlsym(handle, "segps_cuda_backend_api"));
    if (entry == nullptr) {
      p.error = "libsegps_cuda.so has no segps_cuda_backend_api";
      return p;
    }
    p.api = entry();
#else
    p.error = "this build has no CUDA backend (rebuild with nvcc and cuBLAS present, -DSEGPS_WITH_CUDA=ON)";
#endif
    return p;
  }();
  return plugin;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& device, bool allow_tf32,
                                                       int cpu_threads) {
  if (cpu_threads < 1 || cpu_threads > kMaxCpuThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu_threads ", cpu_threads, ": expected 1..", kMaxCpuThreads));
  }
  if (device == "cpu") return CreateCpuBackend(cpu_threads);
  if (device == "auto") {
    const CudaPlugin& cuda = LoadCudaPlugin();
    if (cuda.api != nullptr && cuda.api->device_count() > 0) return cuda.api->create(0, allow_tf32);
    return CreateCpuBackend(cpu_threads);
  }
  if (absl::StartsWith(device, "cuda:")) {
    int index = -1;
    if (!absl::SimpleAtoi(device.substr(5), &index) || index < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--device ", device, ": expected cuda:N with N >= 0"));
    }
    const CudaPlugin& cuda = LoadCudaPlugin();
    if (cuda.api == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("--device ", device, ": ", cuda.error, "; use --device cpu"));
    }
    return cuda.api->create(index, allow_tf32);
  }
  return absl::InvalidArgumentError(absl::StrCat("--device ", device, ": expected cpu, cuda:N or auto"));
}

}  // namespace segps
