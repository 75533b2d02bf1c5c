#include "server/row_requests.h"

#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/embedding.h"

namespace segps {

absl::StatusOr<std::vector<RowGradients>> ParseRows(const v1::SegmentConfig& config, int segment, uint32_t server,
                                                    uint32_t num_servers,
                                                    const google::protobuf::RepeatedPtrField<v1::Rows>& rows,
                                                    bool values, const char* call) {
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
    const size_t want = values ? n * table.dim() * sizeof(float) : 0;
    if (r.values().size() != want) {
      return bad(absl::StrCat("values has ", r.values().size(), " bytes for ", n, " ids of dim ", table.dim(),
                              " (", want, " expected)"));
    }
    RowGradients out;
    out.table = r.table();
    out.ids.resize(n);
    std::memcpy(out.ids.data(), r.ids().data(), r.ids().size());
    absl::flat_hash_set<uint64_t> seen;
    seen.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = out.ids[i];
      if (id >= table.vocab()) return bad(absl::StrCat("id ", id, " (row ", i, ") is not below vocab ", table.vocab()));
      if (RowServer(segment, r.table(), id, num_servers) != server) {
        return bad(absl::StrCat("id ", id, " (row ", i, ") is held by server ",
                                RowServer(segment, r.table(), id, num_servers), ", not this one (", server, ")"));
      }
      if (!seen.insert(id).second) return bad(absl::StrCat("id ", id, " appears twice"));
    }
    out.values.resize(want / sizeof(float));
    if (want > 0) std::memcpy(out.values.data(), r.values().data(), want);
    for (size_t i = 0; i < out.values.size(); ++i) {
      if (!std::isfinite(out.values[i])) {
        return bad(absl::StrCat("the gradient of id ", out.ids[i / table.dim()], " is ", out.values[i],
                                "; gradients must be finite"));
      }
    }
    parsed.push_back(std::move(out));
  }
  return parsed;
}

void ReadTableRows(const EmbeddingTables& tables, const std::vector<RowGradients>& asked,
              google::protobuf::RepeatedPtrField<v1::Rows>* out) {
  for (const RowGradients& a : asked) {
    const EmbeddingTable& table = *tables[a.table];
    v1::Rows* rows = out->Add();
    rows->set_table(a.table);
    rows->mutable_ids()->assign(reinterpret_cast<const char*>(a.ids.data()), a.ids.size() * sizeof(uint64_t));
    // Read straight into the reply (whole floats: a string's buffer is aligned for them).
    std::string* values = rows->mutable_values();
    values->resize(a.ids.size() * table.dim() * sizeof(float));
    table.Read(a.ids, absl::MakeSpan(reinterpret_cast<float*>(values->data()), a.ids.size() * table.dim()));
  }
}

}  // namespace segps
