#include "server/row_requests.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/embedding.h"
#include "common/tensor_wire.h"

namespace segps {
namespace {

// Where `rows`' values lie in the caller's region: `bytes` of them, at a
// whole float's offset.
absl::StatusOr<char*> InRegion(const v1::Rows& rows, size_t bytes, const SharedRegion* region) {
  if (region == nullptr) {
    return absl::InvalidArgumentError(
        "values_region_offset is set, but this registration handed over no shared region");
  }
  if (!rows.values().empty()) return absl::InvalidArgumentError("both values and values_region_offset are set");
  if (rows.values_region_offset() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("values_region_offset ", rows.values_region_offset(), " is not a multiple of 4"));
  }
  // The caller names the call and table before this.
  return region->At(rows.values_region_offset(), bytes, "values_region_offset");
}

// Why `ids` cannot be rows of `table` on server `server`: an id not below
// the vocab, held by another server, or repeated. Ids in ascending order
// (as a client that sorts them sends them) show that none repeats without
// a set of them.
std::optional<std::string> BadIds(absl::Span<const uint64_t> ids, const v1::EmbeddingConfig& table,
                                  const RowServers& servers, uint32_t server) {
  bool ascending = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t id = ids[i];
    if (id >= table.vocab()) return absl::StrCat("id ", id, " (row ", i, ") is not below vocab ", table.vocab());
    if (const uint32_t holder = servers.Of(id); holder != server) {
      return absl::StrCat("id ", id, " (row ", i, ") is held by server ", holder, ", not this one (", server, ")");
    }
    ascending = ascending && (i == 0 || id > ids[i - 1]);
  }
  if (ascending) return std::nullopt;
  absl::flat_hash_set<uint64_t> seen;
  seen.reserve(ids.size());
  for (const uint64_t id : ids) {
    if (!seen.insert(id).second) return absl::StrCat("id ", id, " appears twice");
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<RowGradients>> ParseRows(const v1::SegmentConfig& config, int segment, uint32_t server,
                                                    uint32_t num_servers,
                                                    const google::protobuf::RepeatedPtrField<v1::Rows>& rows,
                                                    bool values, const SharedRegion* region, const char* call) {
  std::vector<RowGradients> parsed;
  absl::flat_hash_set<uint32_t> tables;
  for (const v1::Rows& r : rows) {
    if (r.table() >= static_cast<uint32_t>(config.embeddings_size())) {
      return absl::InvalidArgumentError(absl::StrCat(call, " rows: table ", r.table(), " does not exist (segment \"",
                                                     config.name(), "\" has ", config.embeddings_size(), ")"));
    }
    const v1::EmbeddingConfig& table = config.embeddings(static_cast<int>(r.table()));
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat(call, " rows of table \"", table.name(), "\": ", what, "; nothing was applied"));
    };
    if (!tables.insert(r.table()).second) return bad("the table appears twice");
    if (r.ids().size() % sizeof(uint64_t) != 0) return bad(absl::StrCat("ids has ", r.ids().size(), " bytes, not a multiple of 8"));
    const size_t n = r.ids().size() / sizeof(uint64_t);
    const size_t row_bytes = table.dim() * sizeof(float);
    RowGradients out;
    absl::string_view given = r.values();
    if (r.has_values_region_offset()) {
      absl::StatusOr<char*> place = InRegion(r, n * row_bytes, region);
      if (!place.ok()) return bad(std::string(place.status().message()));
      if (values) {
        given = absl::string_view(*place, n * row_bytes);
      } else {
        out.region_values = reinterpret_cast<float*>(*place);
        out.region_offset = r.values_region_offset();
      }
    }
    const size_t want = values ? n * row_bytes : 0;
    if (given.size() != want) {
      return bad(absl::StrCat("values has ", given.size(), " bytes for ", n, " ids of dim ", table.dim(), " (", want,
                              " expected)"));
    }
    out.table = r.table();
    out.ids.resize(n);
    std::memcpy(out.ids.data(), r.ids().data(), r.ids().size());
    if (std::optional<std::string> why = BadIds(out.ids, table, RowServers(segment, r.table(), num_servers), server)) {
      return bad(*why);
    }
    // Out of a shared region before it is checked: the client could change it meanwhile.
    // Whole floats: a string's buffer is aligned for them, a region's place is checked to be.
    out.values.resize(want / sizeof(float));
    const absl::Span<const float> from(reinterpret_cast<const float*>(given.data()), out.values.size());
    if (const std::optional<size_t> i = CopyFinite(from, out.values.data()); i.has_value()) {
      return bad(absl::StrCat("the gradient of id ", out.ids[*i / table.dim()], " is ", out.values[*i],
                              "; gradients must be finite"));
    }
    parsed.push_back(std::move(out));
  }
  return parsed;
}

size_t RegionRowBytes(const v1::SegmentConfig& config, const google::protobuf::RepeatedPtrField<v1::Rows>& rows) {
  size_t bytes = 0;
  for (const v1::Rows& r : rows) {
    if (!r.has_values_region_offset()) continue;
    bytes += r.ids().size() / sizeof(uint64_t) * config.embeddings(static_cast<int>(r.table())).dim() * sizeof(float);
  }
  return bytes;
}

void ReadTableRows(const EmbeddingTables& tables, const std::vector<RowGradients>& asked,
              google::protobuf::RepeatedPtrField<v1::Rows>* out) {
  for (const RowGradients& a : asked) {
    const EmbeddingTable& table = *tables[a.table];
    v1::Rows* rows = out->Add();
    rows->set_table(a.table);
    rows->mutable_ids()->assign(reinterpret_cast<const char*>(a.ids.data()), a.ids.size() * sizeof(uint64_t));
    if (a.region_values != nullptr) {
      table.Read(a.ids, absl::MakeSpan(a.region_values, a.ids.size() * table.dim()));
      rows->set_values_region_offset(a.region_offset);
      continue;
    }
    // Read straight into the reply (whole floats: a string's buffer is aligned for them).
    std::string* values = rows->mutable_values();
    values->resize(a.ids.size() * table.dim() * sizeof(float));
    table.Read(a.ids, absl::MakeSpan(reinterpret_cast<float*>(values->data()), a.ids.size() * table.dim()));
  }
}

}  // namespace segps
