// numpy's legacy global generator (np.random.seed / rand / randint),
// reproduced bit for bit so that segps trains on exactly the walk-through's
// data: MT19937 seeded by init_genrand, doubles built from two 32-bit draws
// (27 + 26 bits), and randint's masked rejection sampling.
#ifndef SEGPS_WORKER_NUMPY_RANDOM_H_
#define SEGPS_WORKER_NUMPY_RANDOM_H_

#include <cstdint>
#include <random>

namespace segps {

class NumpyLegacyRandom {
 public:
  // np.random.seed(seed) for an integer seed.
  explicit NumpyLegacyRandom(uint32_t seed) : mt_(seed) {}

  // One value of np.random.rand(): a double in [0, 1) with 53 random bits.
  double Rand() {
    const uint32_t a = static_cast<uint32_t>(mt_()) >> 5;
    const uint32_t b = static_cast<uint32_t>(mt_()) >> 6;
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
      value = static_cast<uint32_t>(mt_()) & mask;
    } while (value > max);
    return static_cast<int64_t>(value);
  }

 private:
  std::mt19937 mt_;  // identical to numpy's MT19937 with init_genrand seeding
};

}  // namespace segps

#endif  // SEGPS_WORKER_NUMPY_RANDOM_H_
