// 16-bit floating-point formats for the wire: conversions from and to
// float32 for bfloat16 (float32's range, 8 significant bits) and IEEE
// binary16 (magnitudes to 65504, 11 significant bits).
#ifndef SEGPS_COMMON_HALF_FLOAT_H_
#define SEGPS_COMMON_HALF_FLOAT_H_

#include <cstdint>

#include "absl/types/span.h"

namespace segps {

// float32 to bfloat16 (the upper half, rounded to nearest even; NaN stays
// NaN) and back (exact).
void ToBfloat16(absl::Span<const float> in, uint16_t* out);
void FromBfloat16(const uint16_t* in, absl::Span<float> out);

// float32 to binary16 (rounded to nearest even; from 65520 up to infinity,
// below 2^-14 to subnormals; NaN stays NaN) and back (exact). Uses the
// CPU's conversion instructions (F16C) where it has them.
void ToFloat16(absl::Span<const float> in, uint16_t* out);
void FromFloat16(const uint16_t* in, absl::Span<float> out);

namespace internal {
// The same conversions without the instructions (tests compare the two).
void ToFloat16Portable(absl::Span<const float> in, uint16_t* out);
void FromFloat16Portable(const uint16_t* in, absl::Span<float> out);
}  // namespace internal

}  // namespace segps

#endif  // SEGPS_COMMON_HALF_FLOAT_H_
