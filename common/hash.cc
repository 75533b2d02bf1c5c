#include "common/hash.h"

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

std::string HexFingerprint(absl::string_view bytes) {
  return absl::StrFormat("%016x", Fnv1a64(bytes));
}

}  // namespace segps
