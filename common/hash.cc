#include "common/hash.h"

#include <cstring>

#include "absl/strings/str_format.h"

namespace segps {

uint64_t Fnv1a64(absl::string_view bytes, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t Checksum64(absl::string_view bytes, uint64_t seed) {
  // Four independent lanes keep the multiplier busy; the tail and the
  // length are folded in at the end.
  uint64_t lane[4] = {Mix64(seed), Mix64(seed + 1), Mix64(seed + 2), Mix64(seed + 3)};
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n >= 32) {
    for (int j = 0; j < 4; ++j) {
      uint64_t word;
      std::memcpy(&word, p + 8 * j, 8);
      lane[j] = Mix64(lane[j] ^ word);
    }
    p += 32;
    n -= 32;
  }
  uint64_t h = Mix64(lane[0] ^ Mix64(lane[1] ^ Mix64(lane[2] ^ Mix64(lane[3] ^ bytes.size()))));
  for (; n > 0; --n, ++p) h = Mix64(h ^ static_cast<unsigned char>(*p));
  return h;
}

std::string HexFingerprint(absl::string_view bytes) {
  return absl::StrFormat("%016x", Fnv1a64(bytes));
}

}  // namespace segps
