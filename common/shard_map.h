// The shard map: where every parameter of every segment lives.
//
// A segment's parameters are flattened in a fixed order (per dense layer:
// kernel [fan_in, units] row-major, then bias [units]) into one vector of n
// elements, which is cut into S contiguous ranges, one per server, balanced by
// element count: server i holds [i*q + min(i, r), ...) with q = n / S and
// r = n % S, so no server holds more than ceil(n / S). A tensor may straddle
// two servers. The map is a pure function of (model, S): every process
// computes the same one, and its fingerprint proves it.
//
// Thread safety: immutable after Create; safe to share.
#ifndef SEGPS_COMMON_SHARD_MAP_H_
#define SEGPS_COMMON_SHARD_MAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"

namespace segps {

struct Range {
  uint64_t offset = 0;
  uint64_t count = 0;
  uint64_t end() const { return offset + count; }
};

// One tensor of a segment in the flat order: a dense layer's kernel or
// bias, or a tensor the config declares (SegmentConfig.tensors).
struct TensorLayout {
  uint32_t layer = 0;   // the layer's index, or the declared tensor's
  bool is_bias = false;
  uint64_t offset = 0;  // within the segment's flat vector
  uint64_t rows = 0;    // fan_in for a kernel, 1 for a bias; shape[0] declared
  uint64_t cols = 0;    // units; declared: the product of shape[1:]
  uint64_t size() const { return rows * cols; }
  // Declared only: the config's name and shape, and the initial values:
  // uniform in [-init_bound, init_bound], or init_value where init_bound is 0.
  std::string name;
  std::vector<uint64_t> shape;
  double init_bound = 0;
  float init_value = 0;
  bool declared() const { return !shape.empty(); }
};

// The width of segment k's input: model.input_width, or for stage k > 0 of
// a CHAIN the previous stage's output width; plus what its embedding
// tables add (common/embedding.h).
uint32_t SegmentInputWidth(const v1::ModelConfig& model, int k);

class ShardMap {
 public:
  // With `replicas` R >= 2, range i is also copied to the R - 1 servers
  // after i on the ring (cluster.replicas).
  static absl::StatusOr<ShardMap> Create(const v1::ModelConfig& model, uint32_t num_servers,
                                         uint32_t replicas = 1);

  uint32_t num_servers() const { return num_servers_; }
  uint32_t replicas() const { return replicas_; }
  // The servers that hold range i, its primary first: i, i+1, ..., i+R-1 (mod S).
  std::vector<uint32_t> holders(uint32_t range) const;
  // The ranges server `server` backs (holds, and is not the primary of):
  // server-1, ..., server-R+1 (mod S).
  std::vector<uint32_t> backed_by(uint32_t server) const;
  int num_segments() const { return static_cast<int>(segments_.size()); }
  // Elements in segment k's flat vector.
  uint64_t segment_size(int k) const { return segments_[k].size; }
  const std::vector<TensorLayout>& tensors(int k) const { return segments_[k].tensors; }
  // The range server `server` holds of segment k.
  Range range(int k, uint32_t server) const { return segments_[k].ranges[server]; }
  // Hex digest of (model, S, every range, and R where it is not 1).
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  struct Segment {
    uint64_t size = 0;
    std::vector<TensorLayout> tensors;
    std::vector<Range> ranges;
  };
  uint32_t num_servers_ = 0;
  uint32_t replicas_ = 1;
  std::vector<Segment> segments_;
  std::string fingerprint_;
};

// The name a user sees for tensor `t` of segment k, e.g.
// "segment1/dense_0/kernel" ("cnn/0.weight" declared), and its shape
// ([in, out], [out] for a bias, or the declared one): what exports and
// checkpoints call it.
std::string TensorName(const v1::ModelConfig& model, int k, const TensorLayout& t);
std::vector<uint64_t> TensorShape(const TensorLayout& t);

// Balanced contiguous cut of n elements over `parts` (the rule above).
Range BalancedRange(uint64_t n, uint32_t parts, uint32_t index);

// Fills `out` with the initial values of segment k's elements
// [offset, offset + out.size()): Glorot-uniform kernels, zero biases, the
// declared tensors' own initialisers (TensorConfig.init), each
// element a function of (seed, segment, tensor, element index) only, so the
// model is the same however it is sharded.
void InitializeRange(const ShardMap& map, int segment, uint64_t offset, uint64_t seed,
                     float* out, uint64_t count);

}  // namespace segps

#endif  // SEGPS_COMMON_SHARD_MAP_H_
