// Embedding tables (SegmentConfig.embeddings): where each row lives, what
// it starts as, and how a segment's input is laid out. Pure functions:
// every process computes the same answers, so a row never stored (never
// touched by a gradient) reads alike everywhere.
#ifndef SEGPS_COMMON_EMBEDDING_H_
#define SEGPS_COMMON_EMBEDDING_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "common/hash.h"
#include "segps/v1/config.pb.h"

namespace segps {

// Largest half-width of a row's initial values: uniform in [-kEmbeddingInit, kEmbeddingInit).
inline constexpr float kEmbeddingInit = 0.05f;

// The inputs a segment's tables add to its first layer: sum of dim x fields.
uint32_t EmbeddingWidth(const v1::SegmentConfig& segment);

// The server that holds row `id` of table `table` of segment `segment`:
// Mix64(Mix64(segment << 32 | table) ^ id) modulo the servers, so
// neighbouring ids spread evenly.
uint32_t RowServer(int segment, uint32_t table, uint64_t id, uint32_t num_servers);
// RowServer for the rows of one table, its part of the hash computed once
// and the modulo taken by multiplication (a 64-bit division is the
// slowest step of a batch's split otherwise): with M = ceil(2^128 / n),
// the fraction (M x h mod 2^128) / 2^128 lies within h / n's fractional
// part plus less than 1/n, so multiplying it by n and keeping the integer
// part gives exactly h mod n, for every 64-bit h and n > 0.
class RowServers {
 public:
  RowServers(int segment, uint32_t table, uint32_t num_servers)
      : table_key_(Mix64(static_cast<uint64_t>(segment) << 32 | table)),
        num_servers_(num_servers),
        inverse_(~static_cast<unsigned __int128>(0) / num_servers + 1) {}
  uint32_t Of(uint64_t id) const {
    const unsigned __int128 fraction = inverse_ * Mix64(table_key_ ^ id);  // mod 2^128
    // floor(fraction x n / 2^128), from its two 64-bit halves.
    const unsigned __int128 low = (fraction & ~uint64_t{0}) * num_servers_ >> 64;
    return static_cast<uint32_t>(((fraction >> 64) * num_servers_ + low) >> 64);
  }

 private:
  uint64_t table_key_;
  uint64_t num_servers_;
  unsigned __int128 inverse_;
};

// Row `id`'s initial values (dim floats into `out`): with key =
// Mix64(seed ^ Mix64(segment ^ Mix64(table ^ Mix64(id)))) and, for each
// pair of elements p, bits = Mix64(key + p x 0x9e3779b97f4a7c15) (common/hash.h),
// element 2p is u(bits >> 40) and element 2p + 1 is u((bits >> 16) & 0xffffff),
// where u(b) = b / 2^24 x 0.1 - 0.05.
void InitialRow(uint64_t seed, int segment, uint32_t table, uint64_t id, absl::Span<float> out);

// The smallest vocab of the tables of any segment that look up `field`
// (0 when none does): ids of that field must lie below it.
uint64_t FieldVocab(const v1::ModelConfig& model, uint32_t field);

}  // namespace segps

#endif  // SEGPS_COMMON_EMBEDDING_H_
