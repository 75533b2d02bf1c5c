// The transport-free helpers of ps_client.h.
#include "worker/client/ps_client.h"

#include <algorithm>

#include "absl/strings/str_split.h"
#include "common/tensor_wire.h"

namespace segps {
namespace {

// `values` encoded as `dtype` into one buffer the push holds; values[i]
// covers elements [cuts[i], cuts[i + 1]).
void EncodeInto(EncodedPush* push, absl::Span<const float> values, const std::vector<size_t>& cuts) {
  const size_t width = DTypeBytes(push->dtype);
  // Whole floats: the wire's readers take aligned pieces in place.
  char* bytes = reinterpret_cast<char*>(new float[(values.size() * width + sizeof(float) - 1) / sizeof(float) + 1]);
  push->storage = std::shared_ptr<const char>(bytes, [](const char* p) { delete[] reinterpret_cast<const float*>(p); });
  EncodeValuesTo(values, push->dtype, bytes);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    push->values.emplace_back(bytes + cuts[i] * width, (cuts[i + 1] - cuts[i]) * width);
  }
}

}  // namespace

std::unique_ptr<EncodedPush> EncodeDense(const ShardMap& map, v1::DType dtype, int segment, uint64_t clock,
                                         absl::Span<const float> grad) {
  auto push = std::make_unique<EncodedPush>();
  push->segment = segment;
  push->clock = clock;
  push->dtype = dtype;
  std::vector<size_t> cuts;
  for (uint32_t i = 0; i < map.num_servers(); ++i) cuts.push_back(map.range(segment, i).offset);
  cuts.push_back(grad.size());
  EncodeInto(push.get(), grad, cuts);
  return push;
}

std::unique_ptr<EncodedPush> EncodeSparse(const ShardMap& map, v1::DType dtype, int segment, uint64_t clock,
                                          absl::Span<const uint64_t> indices, absl::Span<const float> values) {
  auto push = std::make_unique<EncodedPush>();
  push->segment = segment;
  push->clock = clock;
  push->dtype = dtype;
  push->sparse = true;
  push->indices.assign(indices.begin(), indices.end());
  push->server_entries.push_back(0);
  for (uint32_t i = 0; i < map.num_servers(); ++i) {
    const uint64_t end = map.range(segment, i).end();
    push->server_entries.push_back(std::lower_bound(indices.begin() + push->server_entries.back(), indices.end(), end) -
                                   indices.begin());
  }
  EncodeInto(push.get(), values, push->server_entries);
  return push;
}

std::vector<std::string> ServerAddresses(const std::string& flag, const v1::JobConfig& config) {
  if (!flag.empty()) return absl::StrSplit(flag, ',', absl::SkipEmpty());
  return {config.cluster().server_addresses().begin(), config.cluster().server_addresses().end()};
}

absl::StatusOr<std::vector<std::vector<float>>> PullParameters(ParameterClient& client,
                                                               const v1::ModelConfig& model, uint32_t num_servers) {
  absl::StatusOr<ShardMap> map = ShardMap::Create(model, num_servers);
  if (!map.ok()) return map.status();
  std::vector<std::vector<float>> params;
  for (int k = 0; k < map->num_segments(); ++k) {
    params.emplace_back(map->segment_size(k));
    absl::StatusOr<uint64_t> clock = client.Pull(k, 0, absl::MakeSpan(params.back()));
    if (!clock.ok()) return clock.status();
  }
  return params;
}

}  // namespace segps
