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

// `values` encoded as `dtype` into one buffer the push holds; values[i]
// covers elements [cuts[i], cuts[i + 1]).
void EncodeInto(EncodedPush* push, absl::Span<const float> values, const std::vector<size_t>& cuts,
                const PushStorage& allocate) {
  const size_t width = DTypeBytes(push->dtype);
  std::shared_ptr<char> block = allocate ? allocate(values.size() * width) : nullptr;
  char* bytes = block.get();
  if (block != nullptr) {
    push->storage = std::move(block);
  } else {
    // Whole floats: the wire's readers take aligned pieces in place.
    bytes = reinterpret_cast<char*>(new float[(values.size() * width + sizeof(float) - 1) / sizeof(float) + 1]);
    push->storage = std::shared_ptr<const char>(bytes, [](const char* p) { delete[] reinterpret_cast<const float*>(p); });
  }
  EncodeValuesTo(values, push->dtype, bytes);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    push->values.emplace_back(bytes + cuts[i] * width, (cuts[i + 1] - cuts[i]) * width);
  }
}

}  // namespace

absl::Status LandRows(const v1::PullResponse& reply, const v1::SegmentConfig& config,
                      const std::vector<std::vector<uint64_t>>& ids, const std::vector<std::vector<size_t>>& positions,
                      absl::Span<const RowPlace> placed, std::vector<std::vector<float>>* values) {
  size_t tables = 0;
  for (const std::vector<size_t>& p : positions) tables += p.empty() ? 0 : 1;
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

std::vector<std::vector<v1::Rows>> RowsByServer(const v1::SegmentConfig& config, int segment, uint32_t num_servers,
                                                const std::vector<std::vector<uint64_t>>& ids,
                                                const std::vector<std::vector<float>>* values) {
  std::vector<std::vector<v1::Rows>> by_server(num_servers);
  std::vector<uint32_t> server_of;
  std::vector<size_t> count;
  for (size_t t = 0; t < ids.size(); ++t) {
    const size_t dim = config.embeddings(static_cast<int>(t)).dim();
    server_of.resize(ids[t].size());
    count.assign(num_servers, 0);
    for (size_t r = 0; r < ids[t].size(); ++r) {
      server_of[r] = RowServer(segment, static_cast<uint32_t>(t), ids[t][r], num_servers);
      ++count[server_of[r]];
    }
    std::vector<v1::Rows*> rows(num_servers, nullptr);
    for (uint32_t s = 0; s < num_servers; ++s) {
      if (count[s] == 0) continue;
      rows[s] = &by_server[s].emplace_back();
      rows[s]->set_table(static_cast<uint32_t>(t));
      rows[s]->mutable_ids()->reserve(count[s] * sizeof(uint64_t));
      if (values != nullptr) rows[s]->mutable_values()->reserve(count[s] * dim * sizeof(float));
    }
    for (size_t r = 0; r < ids[t].size(); ++r) {
      const uint32_t server = server_of[r];
      rows[server]->mutable_ids()->append(reinterpret_cast<const char*>(&ids[t][r]), sizeof(uint64_t));
      if (values != nullptr) {
        rows[server]->mutable_values()->append(reinterpret_cast<const char*>((*values)[t].data() + r * dim),
                                               dim * sizeof(float));
      }
    }
  }
  return by_server;
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
