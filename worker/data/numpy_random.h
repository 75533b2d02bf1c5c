// numpy's legacy global generator (np.random.seed / rand / randint),
// reproduced bit for bit so that segps trains on exactly the walk-through's
// data: MT19937 seeded by init_genrand, doubles built from two 32-bit draws
// (27 + 26 bits), and randint's masked rejection sampling.
#ifndef SEGPS_WORKER_DATA_NUMPY_RANDOM_H_
#define SEGPS_WORKER_DATA_NUMPY_RANDOM_H_

#include <cstdint>

namespace segps {

class NumpyLegacyRandom {
 public:
  // np.random.seed(seed) for an integer seed.
  explicit NumpyLegacyRandom(uint32_t seed);

  // The next 32-bit output of MT19937 (std::mt19937's sequence).
  uint32_t Next() {
    if (next_ == kStateWords) Refill();
    return outputs_[next_++];
  }

  // One value of np.random.rand(): a double in [0, 1) with 53 random bits.
  double Rand() {
    const uint32_t a = Next() >> 5;
    const uint32_t b = Next() >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
  }

  // One value of np.random.randint(high) for 1 <= high <= 2^32: draws 32
  // bits, masks to the smallest covering power of two, rejects values >= high.
  int64_t RandInt(uint64_t high) {
    const uint64_t max = high - 1;
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    uint64_t value;
    do {
      value = Next() & mask;
    } while (value > max);
    return static_cast<int64_t>(value);
  }

 private:
  static constexpr int kStateWords = 624;
  // Advances the state by a whole block and tempers it into outputs_, in
  // loops the compiler vectorises: a draw costs a fraction of
  // std::mt19937's one at a time, and a worker draws 1.2 million of them
  // for the walk-through's data before it can start.
  void Refill();

  uint32_t state_[kStateWords];
  uint32_t outputs_[kStateWords];
  int next_ = kStateWords;
};

}  // namespace segps

#endif  // SEGPS_WORKER_DATA_NUMPY_RANDOM_H_
