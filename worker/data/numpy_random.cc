#include "worker/data/numpy_random.h"

namespace segps {
namespace {

constexpr uint32_t kUpperBit = 0x80000000u;
constexpr uint32_t kLowerBits = 0x7fffffffu;
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr int kShift = 397;  // MT19937's middle word

// The new word at i from the old words i and i + 1 and the word m away
// (branch-free, so that the loops below vectorise).
inline uint32_t Twist(uint32_t word, uint32_t next, uint32_t far) {
  const uint32_t y = (word & kUpperBit) | (next & kLowerBits);
  return far ^ (y >> 1) ^ ((0u - (y & 1u)) & kMatrixA);
}

}  // namespace

NumpyLegacyRandom::NumpyLegacyRandom(uint32_t seed) {
  state_[0] = seed;
  for (int i = 1; i < kStateWords; ++i) {
    state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
}

void NumpyLegacyRandom::Refill() {
  constexpr int kSplit = kStateWords - kShift;  // 227
  // Words below kSplit take the old word m ahead; the rest the new word
  // kSplit behind, already written (227 apart: far more than a vector).
  for (int i = 0; i < kSplit; ++i) state_[i] = Twist(state_[i], state_[i + 1], state_[i + kShift]);
  for (int i = kSplit; i < kStateWords - 1; ++i) state_[i] = Twist(state_[i], state_[i + 1], state_[i - kSplit]);
  state_[kStateWords - 1] = Twist(state_[kStateWords - 1], state_[0], state_[kShift - 1]);
  for (int i = 0; i < kStateWords; ++i) {
    uint32_t y = state_[i];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    outputs_[i] = y;
  }
  next_ = 0;
}

}  // namespace segps
