// The transport-free helpers of ps_client.h.
#include "worker/client/ps_client.h"

#include "absl/strings/str_split.h"

namespace segps {

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
