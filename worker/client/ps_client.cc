// The transport-free helpers of ps_client.h.
#include "worker/client/ps_client.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/embedding.h"
#include "common/tensor_wire.h"

namespace segps {
namespace {

// A block of `bytes` from `allocate`, else from the heap; whole floats
// either way (the wire's readers take aligned pieces in place).
std::shared_ptr<char> PushBytes(size_t bytes, const PushStorage& allocate) {
  if (std::shared_ptr<char> block = allocate ? allocate(bytes) : nullptr) return block;
  return std::shared_ptr<char>(reinterpret_cast<char*>(new float[(bytes + sizeof(float) - 1) / sizeof(float) + 1]),
                               [](char* p) { delete[] reinterpret_cast<float*>(p); });
}

// `values` encoded as `dtype` into one buffer the push holds; values[i]
// covers elements [cuts[i], cuts[i + 1]).
void EncodeInto(EncodedPush* push, absl::Span<const float> values, const std::vector<size_t>& cuts,
                const PushStorage& allocate) {
  const size_t width = DTypeBytes(push->dtype);
  std::shared_ptr<char> block = PushBytes(values.size() * width, allocate);
  char* bytes = block.get();
  push->storage = std::move(block);
  EncodeValuesTo(values, push->dtype, bytes);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    push->values.emplace_back(bytes + cuts[i] * width, (cuts[i + 1] - cuts[i]) * width);
  }
}

}  // namespace

absl::Status LandRows(const v1::PullResponse& reply, const v1::SegmentConfig& config,
                      const std::vector<std::vector<uint64_t>>& ids, const std::vector<std::vector<uint32_t>>& positions,
                      absl::Span<const RowPlace> placed, std::vector<std::vector<float>>* values) {
  size_t tables = 0;
  for (const std::vector<uint32_t>& p : positions) tables += p.empty() ? 0 : 1;
  if (static_cast<size_t>(reply.rows_size()) != tables) {
    return absl::DataLossError(absl::StrCat("PullRows reply: ", reply.rows_size(), " tables for ", tables, " asked"));
  }
  for (const v1::Rows& rows : reply.rows()) {
    const uint32_t t = rows.table();
    if (t >= positions.size() || positions[t].empty()) {
      return absl::DataLossError(absl::StrCat("PullRows reply: table ", t, " was not asked for"));
    }
    const size_t n = positions[t].size(), dim = config.embeddings(static_cast<int>(t)).dim();
    const RowPlace place = t < placed.size() ? placed[t] : RowPlace();
    if (rows.has_values_region_offset() != (place.data != nullptr) ||
        (place.data != nullptr && rows.values_region_offset() != place.offset)) {
      return absl::DataLossError(absl::StrCat("PullRows reply: table ", t, "'s values are not where they were asked"));
    }
    const absl::string_view given =
        place.data != nullptr ? absl::string_view(place.data, n * dim * sizeof(float)) : rows.values();
    if (rows.ids().size() != n * sizeof(uint64_t) || given.size() != n * dim * sizeof(float) ||
        (place.data != nullptr && !rows.values().empty())) {
      return absl::DataLossError(absl::StrCat("PullRows reply: table ", t, " has ", rows.ids().size() / 8, " ids and ",
                                              rows.values().size(), " bytes of values for ", n, " rows asked"));
    }
    for (size_t k = 0; k < n; ++k) {
      uint64_t id = 0;
      std::memcpy(&id, rows.ids().data() + k * sizeof(uint64_t), sizeof(id));
      const size_t at = positions[t][k];
      if (id != ids[t][at]) {
        return absl::DataLossError(absl::StrCat("PullRows reply: table ", t, " row ", k, " is id ", id, ", not ", ids[t][at]));
      }
      std::memcpy((*values)[t].data() + at * dim, given.data() + k * dim * sizeof(float), dim * sizeof(float));
    }
  }
  return absl::OkStatus();
}

RowSplit SplitRows(int segment, uint32_t num_servers, const std::vector<std::vector<uint64_t>>& ids) {
  // Up to this many servers, each server's positions are gathered in a
  // pass of their own, with no branch on the row's server (appending row
  // after row to its server's list is several times slower).
  constexpr uint32_t kPassesUpTo = 8;
  RowSplit split(num_servers, std::vector<std::vector<uint32_t>>(ids.size()));
  std::vector<uint32_t> server_of;
  for (size_t t = 0; t < ids.size(); ++t) {
    const RowServers servers(segment, static_cast<uint32_t>(t), num_servers);
    const size_t n = ids[t].size();
    server_of.resize(n);
    for (size_t r = 0; r < n; ++r) server_of[r] = servers.Of(ids[t][r]);
    if (num_servers > kPassesUpTo) {
      for (size_t r = 0; r < n; ++r) split[server_of[r]][t].push_back(static_cast<uint32_t>(r));
      continue;
    }
    for (uint32_t s = 0; s < num_servers; ++s) {
      std::vector<uint32_t>& positions = split[s][t];
      positions.resize(n);
      size_t k = 0;
      for (size_t r = 0; r < n; ++r) {
        positions[k] = static_cast<uint32_t>(r);
        k += server_of[r] == s ? 1 : 0;
      }
      positions.resize(k);
    }
  }
  return split;
}

std::vector<std::vector<v1::Rows>> RowsByServer(const RowSplit& split, const std::vector<std::vector<uint64_t>>& ids) {
  std::vector<std::vector<v1::Rows>> by_server(split.size());
  for (size_t s = 0; s < split.size(); ++s) {
    for (size_t t = 0; t < split[s].size(); ++t) {
      const std::vector<uint32_t>& positions = split[s][t];
      if (positions.empty()) continue;
      v1::Rows& rows = by_server[s].emplace_back();
      rows.set_table(static_cast<uint32_t>(t));
      std::string* out = rows.mutable_ids();
      out->resize(positions.size() * sizeof(uint64_t));
      for (size_t k = 0; k < positions.size(); ++k) {
        std::memcpy(out->data() + k * sizeof(uint64_t), &ids[t][positions[k]], sizeof(uint64_t));
      }
    }
  }
  return by_server;
}

void EncodeRows(const v1::SegmentConfig& config, uint32_t num_servers, const std::vector<std::vector<uint64_t>>& ids,
                const std::vector<std::vector<float>>& grads, const PushStorage& allocate, EncodedPush* push) {
  const RowSplit split = SplitRows(push->segment, num_servers, ids);
  push->rows = RowsByServer(split, ids);
  size_t floats = 0;
  for (size_t t = 0; t < ids.size(); ++t) floats += ids[t].size() * config.embeddings(static_cast<int>(t)).dim();
  std::shared_ptr<char> block = PushBytes(floats * sizeof(float), allocate);
  float* at = reinterpret_cast<float*>(block.get());
  push->row_storage = std::move(block);
  push->row_values.assign(num_servers, {});
  for (size_t s = 0; s < split.size(); ++s) {
    for (size_t t = 0; t < split[s].size(); ++t) {
      if (split[s][t].empty()) continue;
      const size_t dim = config.embeddings(static_cast<int>(t)).dim();
      const float* first = at;
      for (const uint32_t r : split[s][t]) at = std::copy_n(grads[t].data() + r * dim, dim, at);
      push->row_values[s].emplace_back(reinterpret_cast<const char*>(first), (at - first) * sizeof(float));
    }
  }
}

std::unique_ptr<EncodedPush> EncodeDense(const ShardMap& map, v1::DType dtype, int segment, uint64_t clock,
                                         absl::Span<const float> grad, const PushStorage& allocate) {
  auto push = std::make_unique<EncodedPush>();
  push->segment = segment;
  push->clock = clock;
  push->dtype = dtype;
  std::vector<size_t> cuts;
  for (uint32_t i = 0; i < map.num_servers(); ++i) cuts.push_back(map.range(segment, i).offset);
  cuts.push_back(grad.size());
  EncodeInto(push.get(), grad, cuts, allocate);
  return push;
}

std::unique_ptr<EncodedPush> EncodeSparse(const ShardMap& map, v1::DType dtype, int segment, uint64_t clock,
                                          absl::Span<const uint64_t> indices, absl::Span<const float> values,
                                          const PushStorage& allocate) {
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
  EncodeInto(push.get(), values, push->server_entries, allocate);
  return push;
}

absl::StatusOr<ShardMap> MapOfServers(const v1::JobConfig& config, const std::vector<std::string>& addresses) {
  if (addresses.size() != config.cluster().num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat(addresses.size(), " server addresses given, but the config has ",
                                                   config.cluster().num_servers(), " servers"));
  }
  return ShardMap::Create(config.model(), config.cluster().num_servers(), config.cluster().replicas());
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

absl::StatusOr<std::vector<std::vector<std::vector<float>>>> PullTables(ParameterClient& client,
                                                                        const v1::ModelConfig& model,
                                                                        uint64_t max_bytes, uint64_t page_rows) {
  for (const v1::SegmentConfig& segment : model.segments()) {
    for (const v1::EmbeddingConfig& table : segment.embeddings()) {
      if (table.vocab() > max_bytes / (std::max<uint64_t>(table.dim(), 1) * sizeof(float))) {
        return absl::FailedPreconditionError(absl::StrCat(
            "table ", segment.name(), "/", table.name(), " (", table.vocab(), " rows of ", table.dim(),
            " floats) is more than the ", max_bytes, " bytes a dense table may take: its rows stay on the servers "
            "(segps-eval scores the model; segps-checkpoint merge writes the rows they hold)"));
      }
    }
  }
  std::vector<std::vector<std::vector<float>>> tables(model.segments_size());
  for (int k = 0; k < model.segments_size(); ++k) {
    const v1::SegmentConfig& segment = model.segments(k);
    for (int t = 0; t < segment.embeddings_size(); ++t) {
      const uint64_t vocab = segment.embeddings(t).vocab(), dim = segment.embeddings(t).dim();
      std::vector<float>& rows = tables[k].emplace_back(vocab * dim);
      std::vector<std::vector<uint64_t>> ids(segment.embeddings_size());
      std::vector<std::vector<float>> values;
      for (uint64_t first = 0; first < vocab; first += page_rows) {
        ids[t].resize(std::min(page_rows, vocab - first));
        for (size_t r = 0; r < ids[t].size(); ++r) ids[t][r] = first + r;
        if (absl::Status pulled = client.PullRows(k, 0, ids, &values); !pulled.ok()) return pulled;
        std::copy(values[t].begin(), values[t].end(), rows.begin() + static_cast<ptrdiff_t>(first * dim));
      }
    }
  }
  return tables;
}

}  // namespace segps
