// Tensor payloads on the wire: packed little-endian elements with an explicit
// dtype (proto TensorSlice). Only FLOAT32 is implemented; the other dtypes are
// reserved and rejected with a clear error.
#ifndef SEGPS_COMMON_TENSOR_BYTES_H_
#define SEGPS_COMMON_TENSOR_BYTES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "segps/v1/parameter_server.pb.h"

namespace segps {

// Fills `slice` with `values` as FLOAT32 starting at flat `offset`.
// Reuses the slice's byte buffer capacity.
void EncodeFloat32(absl::Span<const float> values, uint64_t offset, v1::TensorSlice* slice);

// Checks that `slice` is a FLOAT32 slice of exactly [offset, offset + count)
// with the matching byte length. `what` names the slice in the error.
absl::Status ValidateFloat32Slice(const v1::TensorSlice& slice, uint64_t offset, uint64_t count,
                                  const char* what);

// Copies a validated FLOAT32 slice into `out` (out.size() == slice.count()).
void DecodeFloat32(const v1::TensorSlice& slice, absl::Span<float> out);

// A view of a validated FLOAT32 slice's elements without copying, when its
// bytes are suitably aligned; otherwise copies into `scratch` and views that.
absl::Span<const float> Float32View(const v1::TensorSlice& slice, std::string* scratch);

}  // namespace segps

#endif  // SEGPS_COMMON_TENSOR_BYTES_H_
