#include "common/shard_map.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/embedding.h"
#include "common/hash.h"

namespace segps {

std::string TensorName(const v1::ModelConfig& model, int k, const TensorLayout& t) {
  return absl::StrCat(model.segments(k).name(), "/dense_", t.layer, t.is_bias ? "/bias" : "/kernel");
}

std::vector<uint64_t> TensorShape(const TensorLayout& t) {
  return t.is_bias ? std::vector<uint64_t>{t.cols} : std::vector<uint64_t>{t.rows, t.cols};
}

Range BalancedRange(uint64_t n, uint32_t parts, uint32_t index) {
  const uint64_t q = n / parts, r = n % parts;
  Range range;
  range.offset = index * q + std::min<uint64_t>(index, r);
  range.count = q + (index < r ? 1 : 0);
  return range;
}

uint32_t SegmentInputWidth(const v1::ModelConfig& model, int k) {
  if (model.combine() != v1::CHAIN || k == 0) return model.input_width() + EmbeddingWidth(model.segments(k));
  const v1::SegmentConfig& previous = model.segments(k - 1);
  return previous.layers(previous.layers_size() - 1).units();
}

absl::StatusOr<ShardMap> ShardMap::Create(const v1::ModelConfig& model, uint32_t num_servers) {
  if (num_servers == 0) return absl::InvalidArgumentError("shard map: need at least one server");
  ShardMap map;
  map.num_servers_ = num_servers;
  std::string digest = absl::StrCat("S=", num_servers, ";in=", model.input_width());
  if (model.combine() == v1::CHAIN) digest += ";chain";
  for (int k = 0; k < model.segments_size(); ++k) {
    const auto& seg = model.segments(k);
    Segment s;
    uint64_t fan_in = SegmentInputWidth(model, k);
    for (int l = 0; l < seg.layers_size(); ++l) {
      const uint64_t units = seg.layers(l).units();
      s.tensors.push_back({static_cast<uint32_t>(l), false, s.size, fan_in, units});
      s.size += fan_in * units;
      s.tensors.push_back({static_cast<uint32_t>(l), true, s.size, 1, units});
      s.size += units;
      fan_in = units;
    }
    absl::StrAppend(&digest, ";seg", k, ":n=", s.size);
    for (uint32_t i = 0; i < num_servers; ++i) {
      s.ranges.push_back(BalancedRange(s.size, num_servers, i));
      absl::StrAppend(&digest, ",", s.ranges.back().offset, "+", s.ranges.back().count);
    }
    map.segments_.push_back(std::move(s));
  }
  map.fingerprint_ = HexFingerprint(digest);
  return map;
}

void InitializeRange(const ShardMap& map, int segment, uint64_t offset, uint64_t seed, float* out,
                     uint64_t count) {
  const uint64_t end = offset + count;
  const auto& tensors = map.tensors(segment);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorLayout& tensor = tensors[t];
    const uint64_t lo = std::max(offset, tensor.offset);
    const uint64_t hi = std::min(end, tensor.offset + tensor.size());
    if (lo >= hi) continue;
    if (tensor.is_bias) {
      std::fill(out + (lo - offset), out + (hi - offset), 0.0f);
      continue;
    }
    // Glorot uniform: U(-limit, limit) with limit = sqrt(6 / (fan_in + fan_out)).
    const double limit = std::sqrt(6.0 / static_cast<double>(tensor.rows + tensor.cols));
    for (uint64_t i = lo; i < hi; ++i) {
      const double u = UniformFromKey(seed, static_cast<uint64_t>(segment), t, i - tensor.offset);
      out[i - offset] = static_cast<float>((2.0 * u - 1.0) * limit);
    }
  }
}

}  // namespace segps
