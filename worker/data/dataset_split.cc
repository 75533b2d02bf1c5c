// dataset.h's splits: which rows of the training set each segment and
// worker trains on, and the order a worker visits its slice in each epoch.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/shard_map.h"
#include "worker/data/dataset.h"

namespace segps {

Range SegmentRows(const v1::JobConfig& config, size_t train_size, int segment) {
  // A CHAIN's stages train one network: stage 0 reads all of it.
  if (config.data().split() == v1::BY_SEGMENT && config.model().combine() != v1::CHAIN) return BalancedRange(train_size, config.model().segments_size(), segment);
  return {0, train_size};
}

std::optional<std::string> MissingClassesWarning(const v1::JobConfig& config, const Dataset& train, int segment) {
  const Range rows = SegmentRows(config, train.size(), segment);
  if (rows.count == train.size() || train.classes <= 0 || train.regression) return std::nullopt;
  std::vector<bool> anywhere(train.classes, false), mine(train.classes, false);
  for (size_t i = 0; i < train.size(); ++i) {
    const int32_t c = train.y[i];
    if (c < 0 || c >= train.classes) continue;
    anywhere[c] = true;
    if (i >= rows.offset && i < rows.end()) mine[c] = true;
  }
  std::vector<int> missing;
  for (int c = 0; c < train.classes; ++c) {
    if (anywhere[c] && !mine[c]) missing.push_back(c);
  }
  if (missing.empty()) return std::nullopt;
  return absl::StrCat(config.model().segments(segment).name(), ": its training rows [", rows.offset, ", ", rows.end(),
                      ") of ", train.size(), " have no sample of class", missing.size() == 1 ? " " : "es ",
                      absl::StrJoin(missing, ", "),
                      ", which other rows have: with data.split BY_SEGMENT each segment trains on a contiguous part "
                      "of the file, and a file sorted by class leaves some classes out. Use data.split: SAME (every "
                      "segment trains on every row), or data.shuffle: true (the rows in a seeded order)");
}

Range WorkerSlice(const v1::JobConfig& config, size_t train_size, int segment, uint32_t rank) {
  const Range seg = SegmentRows(config, train_size, segment);
  Range mine = BalancedRange(seg.count, WorkersOf(config, segment), rank);
  mine.offset += seg.offset;
  return mine;
}

std::vector<uint32_t> EpochOrder(Range slice, uint64_t seed, int segment, uint32_t rank,
                                 uint32_t epoch) {
  std::vector<uint32_t> order(slice.count);
  for (uint64_t i = 0; i < slice.count; ++i) order[i] = static_cast<uint32_t>(slice.offset + i);
  uint64_t state = Mix64(seed ^ Mix64(static_cast<uint64_t>(segment) << 32 | rank) ^ Mix64(epoch + 1));
  for (uint64_t i = slice.count; i > 1; --i) {
    state = Mix64(state);
    // Multiply-shift maps 64 random bits onto [0, i) without modulo bias worth noting.
    const uint64_t j = static_cast<uint64_t>((static_cast<unsigned __int128>(state) * i) >> 64);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

}  // namespace segps
