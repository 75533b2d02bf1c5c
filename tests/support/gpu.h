// What a gpu-labelled test does where no GPU is usable: it skips, naming
// the reason, unless SEGPS_REQUIRE_GPU=1 (tests/gpu/check.sh sets it), where
// the same reason fails it. A GPU check that ran nothing is no check: a
// missing device, a plugin that cannot load libsegps_cuda.so's libraries
// and a driver too old for the toolkit all look alike from here.
#ifndef SEGPS_TESTS_SUPPORT_GPU_H_
#define SEGPS_TESTS_SUPPORT_GPU_H_

#include <cstdlib>
#include <string>

namespace segps {

inline bool GpuRequired() {
  const char* value = std::getenv("SEGPS_REQUIRE_GPU");
  return value != nullptr && std::string(value) == "1";
}

}  // namespace segps

// In a test body or SetUp: `status` is the outcome of creating a GPU
// backend (absl::Status).
#define SEGPS_REQUIRE_GPU_OR_SKIP(status)                                                         \
  do {                                                                                           \
    if (!(status).ok()) {                                                                        \
      if (::segps::GpuRequired()) {                                                              \
        FAIL() << "SEGPS_REQUIRE_GPU=1, and no GPU backend: " << (status).message();             \
      }                                                                                          \
      GTEST_SKIP() << "no usable GPU (SEGPS_REQUIRE_GPU=1 makes this a failure): " << (status).message(); \
    }                                                                                            \
  } while (0)

#endif  // SEGPS_TESTS_SUPPORT_GPU_H_
