// Stable, platform-independent hashing and counter-based random numbers.
// Everything here is a pure function: every process computes the same value.
#ifndef SEGPS_COMMON_HASH_H_
#define SEGPS_COMMON_HASH_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace segps {

// 64-bit FNV-1a, printed as 16 hex digits.
uint64_t Fnv1a64(absl::string_view bytes, uint64_t seed = 14695981039346656037ull);
std::string HexFingerprint(absl::string_view bytes);

// SplitMix64 finaliser: a bijective mix of 64 bits.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A fast 64-bit checksum of `bytes` (8 bytes a step, mixed with Mix64):
// detects flipped and truncated data, not tampering.
uint64_t Checksum64(absl::string_view bytes, uint64_t seed = 0);

// A uniform double in [0, 1) that depends only on its key: the same key gives
// the same value in every process, whatever the order of evaluation.
inline double UniformFromKey(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = Mix64(seed ^ Mix64(a ^ Mix64(b ^ Mix64(c))));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace segps

#endif  // SEGPS_COMMON_HASH_H_
