#include "common/shard_map.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/embedding.h"
#include "common/hash.h"

namespace segps {

std::string TensorName(const v1::ModelConfig& model, int k, const TensorLayout& t) {
  if (t.declared()) return absl::StrCat(model.segments(k).name(), "/", t.name);
  return absl::StrCat(model.segments(k).name(), "/dense_", t.layer, t.is_bias ? "/bias" : "/kernel");
}

std::vector<uint64_t> TensorShape(const TensorLayout& t) {
  if (t.declared()) return t.shape;
  return t.is_bias ? std::vector<uint64_t>{t.cols} : std::vector<uint64_t>{t.rows, t.cols};
}

namespace {

// Segment `seg`'s declared tensors (SegmentConfig.tensors) from `offset` on.
std::vector<TensorLayout> DeclaredTensors(const v1::SegmentConfig& seg, uint64_t offset) {
  std::vector<TensorLayout> tensors;
  for (int i = 0; i < seg.tensors_size(); ++i) {
    const v1::TensorConfig& config = seg.tensors(i);
    TensorLayout t;
    t.layer = static_cast<uint32_t>(i);
    t.offset = offset;
    t.name = config.name();
    t.shape.assign(config.shape().begin(), config.shape().end());
    t.rows = t.shape.empty() ? 0 : t.shape[0];
    t.cols = 1;
    for (size_t d = 1; d < t.shape.size(); ++d) t.cols *= t.shape[d];
    if (config.init_case() == v1::TensorConfig::kUniform) {
      t.init_bound = std::fabs(config.uniform());
    } else if (config.init_case() == v1::TensorConfig::kConstant) {
      t.init_value = config.constant();
    } else if (t.shape.size() > 1) {
      t.init_bound = 1.0 / std::sqrt(static_cast<double>(t.cols));
    }
    offset += t.size();
    tensors.push_back(std::move(t));
  }
  return tensors;
}

}  // namespace

Range BalancedRange(uint64_t n, uint32_t parts, uint32_t index) {
  const uint64_t q = n / parts, r = n % parts;
  Range range;
  range.offset = index * q + std::min<uint64_t>(index, r);
  range.count = q + (index < r ? 1 : 0);
  return range;
}

std::vector<uint32_t> ShardMap::holders(uint32_t range) const {
  std::vector<uint32_t> servers;
  for (uint32_t r = 0; r < replicas_; ++r) servers.push_back((range + r) % num_servers_);
  return servers;
}

std::vector<uint32_t> ShardMap::backed_by(uint32_t server) const {
  std::vector<uint32_t> ranges;
  for (uint32_t r = 1; r < replicas_; ++r) ranges.push_back((server + num_servers_ - r) % num_servers_);
  return ranges;
}

uint32_t SegmentInputWidth(const v1::ModelConfig& model, int k) {
  if (model.combine() != v1::CHAIN || k == 0) return model.input_width() + EmbeddingWidth(model.segments(k));
  const v1::SegmentConfig& previous = model.segments(k - 1);
  return previous.layers(previous.layers_size() - 1).units();
}

absl::StatusOr<ShardMap> ShardMap::Create(const v1::ModelConfig& model, uint32_t num_servers, uint32_t replicas) {
  if (num_servers == 0) return absl::InvalidArgumentError("shard map: need at least one server");
  if (replicas == 0 || replicas > num_servers) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard map: ", replicas, " replicas of each range need 1 to ", num_servers, " servers"));
  }
  ShardMap map;
  map.num_servers_ = num_servers;
  map.replicas_ = replicas;
  std::string digest = absl::StrCat("S=", num_servers, ";in=", model.input_width());
  // One copy keeps the fingerprint it always had (checkpoints resume).
  if (replicas > 1) absl::StrAppend(&digest, ";R=", replicas);
  if (model.combine() == v1::CHAIN) digest += ";chain";
  for (int k = 0; k < model.segments_size(); ++k) {
    const auto& seg = model.segments(k);
    Segment s;
    s.tensors = DeclaredTensors(seg, 0);
    for (const TensorLayout& t : s.tensors) s.size += t.size();
    uint64_t fan_in = SegmentInputWidth(model, k);
    for (int l = 0; l < seg.layers_size(); ++l) {
      TensorLayout kernel;
      kernel.layer = static_cast<uint32_t>(l);
      kernel.offset = s.size;
      kernel.rows = fan_in;
      kernel.cols = seg.layers(l).units();
      TensorLayout bias = kernel;
      bias.is_bias = true;
      bias.offset = kernel.offset + kernel.size();
      bias.rows = 1;
      s.size = bias.offset + bias.size();
      fan_in = kernel.cols;
      s.tensors.push_back(kernel);
      s.tensors.push_back(bias);
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
    if (tensor.is_bias || (tensor.declared() && tensor.init_bound == 0)) {
      std::fill(out + (lo - offset), out + (hi - offset), tensor.init_value);
      continue;
    }
    // Glorot uniform: U(-limit, limit) with limit = sqrt(6 / (fan_in + fan_out)).
    const double limit =
        tensor.declared() ? tensor.init_bound : std::sqrt(6.0 / static_cast<double>(tensor.rows + tensor.cols));
    for (uint64_t i = lo; i < hi; ++i) {
      const double u = UniformFromKey(seed, static_cast<uint64_t>(segment), t, i - tensor.offset);
      out[i - offset] = static_cast<float>((2.0 * u - 1.0) * limit);
    }
  }
}

}  // namespace segps
