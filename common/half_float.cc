#include "common/half_float.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace segps {

void ToBfloat16(absl::Span<const float> in, uint16_t* out) {
  for (size_t i = 0; i < in.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &in[i], sizeof(bits));
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);  // to nearest, ties to even
    out[i] = static_cast<uint16_t>(nan ? (bits >> 16) | 0x40u : rounded >> 16);
  }
}

void FromBfloat16(const uint16_t* in, absl::Span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &bits, sizeof(bits));
  }
}

namespace internal {

void ToFloat16Portable(absl::Span<const float> in, uint16_t* out) {
  constexpr uint32_t kInfinity = 0xffu << 23;
  constexpr uint32_t kTooLarge = (127u + 16) << 23;     // 65536: rounds to infinity from 65520 up
  constexpr uint32_t kSmallestNormal = (127u - 14) << 23;  // 2^-14
  constexpr uint32_t kSubnormalShift = 126u << 23;        // 0.5f: its ulp is binary16's smallest subnormal
  for (size_t i = 0; i < in.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &in[i], sizeof(bits));
    const uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t magnitude = bits & 0x7fffffffu;
    uint16_t half;
    if (magnitude >= kTooLarge) {
      half = magnitude > kInfinity ? 0x7e00 : 0x7c00;  // NaN stays NaN; the rest overflow to infinity
    } else if (magnitude < kSmallestNormal) {
      // Adding 0.5 rounds the value to a multiple of 2^-24 (nearest even,
      // the FPU's mode) and leaves that multiple in the low mantissa bits.
      float shifted, shift;
      std::memcpy(&shifted, &magnitude, sizeof(shifted));
      std::memcpy(&shift, &kSubnormalShift, sizeof(shift));
      shifted += shift;
      uint32_t shifted_bits;
      std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
      half = static_cast<uint16_t>(shifted_bits - kSubnormalShift);
    } else {
      const uint32_t odd = (magnitude >> 13) & 1u;
      magnitude += ((15u - 127u) << 23) + 0xfffu + odd;  // rebias the exponent; round to nearest even
      half = static_cast<uint16_t>(magnitude >> 13);
    }
    out[i] = static_cast<uint16_t>(half | sign);
  }
}

void FromFloat16Portable(const uint16_t* in, absl::Span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    const uint32_t sign = static_cast<uint32_t>(in[i] & 0x8000u) << 16;
    const uint32_t exponent = (in[i] >> 10) & 0x1fu;
    const uint32_t mantissa = in[i] & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in float32
      const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
      out[i] = sign != 0 ? -magnitude : magnitude;
      continue;
    }
    const uint32_t bits = sign | (exponent == 31 ? 0x7f800000u : (exponent + 112) << 23) | (mantissa << 13);
    std::memcpy(&out[i], &bits, sizeof(bits));
  }
}

}  // namespace internal

#if defined(__x86_64__)
namespace {

// Eight elements an instruction, rounding to nearest even as the portable
// code does; the tail goes the portable way.
__attribute__((target("avx,f16c"))) void ToFloat16F16c(absl::Span<const float> in, uint16_t* out) {
  size_t i = 0;
  for (; i + 8 <= in.size(); i += 8) {
    const __m128i halves = _mm256_cvtps_ph(_mm256_loadu_ps(in.data() + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), halves);
  }
  internal::ToFloat16Portable(in.subspan(i), out + i);
}

__attribute__((target("avx,f16c"))) void FromFloat16F16c(const uint16_t* in, absl::Span<float> out) {
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out.data() + i, _mm256_cvtph_ps(halves));
  }
  internal::FromFloat16Portable(in + i, out.subspan(i));
}

bool HasF16c() {
  // F16C read from CPUID itself: clang's __builtin_cpu_supports does not know it.
  static const bool has = [] {
    unsigned eax, ebx, ecx, edx;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  }();
  return has;
}

}  // namespace
#endif

void ToFloat16(absl::Span<const float> in, uint16_t* out) {
#if defined(__x86_64__)
  if (HasF16c()) {
    ToFloat16F16c(in, out);
    return;
  }
#endif
  internal::ToFloat16Portable(in, out);
}

void FromFloat16(const uint16_t* in, absl::Span<float> out) {
#if defined(__x86_64__)
  if (HasF16c()) {
    FromFloat16F16c(in, out);
    return;
  }
#endif
  internal::FromFloat16Portable(in, out);
}

}  // namespace segps
