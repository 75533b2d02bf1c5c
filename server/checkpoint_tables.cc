#include "server/checkpoint_tables.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/embedding.h"

namespace segps {
namespace {

constexpr char kPrefix[] = "embeddings/";

std::string TensorBase(const v1::ModelConfig& model, int segment, const v1::EmbeddingConfig& table) {
  return absl::StrCat(kPrefix, model.segments(segment).name(), "/", table.name());
}

// Optimizer slots a stored row carries beside its values under `kind`
// (server/embedding_table.h).
uint64_t SlotsOf(v1::OptimizerKind kind) {
  return kind == v1::ADAM ? 2 : kind == v1::MOMENTUM || kind == v1::ADAGRAD ? 1 : 0;
}

// Floats a stored row takes.
uint64_t StrideOf(const v1::JobConfig& config, const v1::EmbeddingConfig& table) {
  return table.dim() * (1 + SlotsOf(config.optimizer().kind()));
}

// "N WIDTH" metadata: false unless it reads so.
bool RowsAndWidth(const std::map<std::string, std::string>& metadata, const std::string& key, uint64_t* n,
                  uint64_t* width) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return false;
  const std::vector<std::string> words = absl::StrSplit(it->second, ' ');
  return words.size() == 2 && absl::SimpleAtoi(words[0], n) && absl::SimpleAtoi(words[1], width);
}

// Table `base`'s tensors in `file`, if they are U64 [n] and F32 [n, width]:
// copied into `out` (the file's bytes may sit at any alignment).
bool ReadTableTensors(const SafetensorsFile& file, const std::string& base, uint64_t n, uint64_t width,
                      TableState* out) {
  const auto ids = file.tensors().find(base + "/ids");
  const auto rows = file.tensors().find(base + "/rows");
  if (ids == file.tensors().end() || rows == file.tensors().end() || ids->second.dtype != "U64" ||
      rows->second.dtype != "F32" || ids->second.bytes.size() != n * 8 ||
      rows->second.bytes.size() != n * width * sizeof(float)) {
    return false;
  }
  out->ids.resize(n);
  std::memcpy(out->ids.data(), ids->second.bytes.data(), n * 8);
  out->rows.resize(n * width);
  std::memcpy(out->rows.data(), rows->second.bytes.data(), n * width * sizeof(float));
  return true;
}

}  // namespace

bool IsTableTensor(const std::string& name) { return name.rfind(kPrefix, 0) == 0; }

void AddTableTensors(const v1::ModelConfig& model, int segment, const std::vector<TableState>& tables,
                     std::vector<TensorToWrite>* tensors, std::map<std::string, std::string>* metadata,
                     std::map<std::string, absl::string_view>* by_name) {
  for (size_t t = 0; t < tables.size(); ++t) {
    const v1::EmbeddingConfig& config = model.segments(segment).embeddings(static_cast<int>(t));
    const TableState& state = tables[t];
    const uint64_t n = state.ids.size();
    (*metadata)["segps.embeddings." + config.name()] = absl::StrCat(n, " ", n == 0 ? 0 : state.rows.size() / n);
    if (n == 0) continue;
    const std::string base = TensorBase(model, segment, config);
    tensors->push_back({base + "/ids", {n}, {}, state.ids});
    tensors->push_back({base + "/rows", {n, state.rows.size() / n}, state.rows, {}});
    (*by_name)[base + "/ids"] = absl::string_view(reinterpret_cast<const char*>(state.ids.data()), n * 8);
    (*by_name)[base + "/rows"] =
        absl::string_view(reinterpret_cast<const char*>(state.rows.data()), state.rows.size() * sizeof(float));
  }
}

absl::Status ReadTables(const SafetensorsFile& file, const std::map<std::string, std::string>& metadata,
                        const v1::JobConfig& config, int segment, uint32_t server, uint32_t num_servers,
                        std::vector<TableState>* tables) {
  const v1::SegmentConfig& seg = config.model().segments(segment);
  tables->assign(seg.embeddings_size(), TableState());
  for (int t = 0; t < seg.embeddings_size(); ++t) {
    const v1::EmbeddingConfig& table = seg.embeddings(t);
    auto corrupt = [&](const std::string& what) {
      return absl::DataLossError(absl::StrCat(file.path(), ": embedding table \"", table.name(), "\": ", what));
    };
    uint64_t n = 0, stride = 0;
    if (!RowsAndWidth(metadata, "segps.embeddings." + table.name(), &n, &stride)) {
      return corrupt("metadata segps.embeddings." + table.name() + " is missing or not \"ROWS WIDTH\"");
    }
    if (n == 0) continue;
    if (stride != StrideOf(config, table)) {
      return corrupt(absl::StrCat("rows of ", stride, " floats, but dim and optimizer give ", StrideOf(config, table)));
    }
    const std::string base = TensorBase(config.model(), segment, table);
    TableState& state = (*tables)[t];
    if (!ReadTableTensors(file, base, n, stride, &state)) {
      return corrupt(absl::StrCat("tensors ", base, "/ids (U64 [", n, "]) and /rows (F32 [", n, ", ", stride,
                                  "]) are missing or of another shape"));
    }
    for (uint64_t r = 0; r < n; ++r) {
      const uint64_t id = state.ids[r];
      if (id >= table.vocab() || (r > 0 && id <= state.ids[r - 1]) ||
          RowServer(segment, static_cast<uint32_t>(t), id, num_servers) != server) {
        return corrupt(absl::StrCat("id ", id, " (row ", r, ") is out of order, not below vocab ", table.vocab(),
                                    ", or held by another server"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AddTableRows(const SafetensorsFile& file, const std::map<std::string, std::string>& metadata,
                          const std::string& segment, v1::OptimizerKind kind, bool slots,
                          std::map<std::string, MergedTable>* tables) {
  const std::string prefix = "segps.embeddings.";
  for (auto it = metadata.lower_bound(prefix); it != metadata.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    const std::string base = absl::StrCat(kPrefix, segment, "/", it->first.substr(prefix.size()));
    uint64_t n = 0, stride = 0;
    if (!RowsAndWidth(metadata, it->first, &n, &stride)) {
      return absl::DataLossError(absl::StrCat("merge: ", file.path(), ": metadata ", it->first, " is not \"ROWS WIDTH\""));
    }
    MergedTable& merged = (*tables)[base];
    if (n == 0) continue;
    const uint64_t width = slots ? stride : stride / (1 + SlotsOf(kind));
    TableState read;
    if (!ReadTableTensors(file, base, n, stride, &read) || (merged.width != 0 && merged.width != width)) {
      return absl::DataLossError(absl::StrCat("merge: ", file.path(), ": table ", base,
                                              ": its tensors disagree with its metadata or another server's"));
    }
    merged.width = width;
    merged.ids.insert(merged.ids.end(), read.ids.begin(), read.ids.end());
    for (uint64_t r = 0; r < n; ++r) {
      merged.rows.insert(merged.rows.end(), read.rows.begin() + r * stride, read.rows.begin() + r * stride + width);
    }
  }
  return absl::OkStatus();
}

absl::Status AddMergedTables(std::map<std::string, MergedTable>* tables, std::vector<TensorToWrite>* tensors,
                             std::map<std::string, std::string>* metadata) {
  for (auto& [base, table] : *tables) {
    const uint64_t n = table.ids.size();
    std::vector<size_t> order(n);
    for (size_t r = 0; r < n; ++r) order[r] = r;
    const std::vector<uint64_t>& ids = table.ids;
    std::sort(order.begin(), order.end(), [&ids](size_t a, size_t b) { return ids[a] < ids[b]; });
    MergedTable sorted{std::vector<uint64_t>(n), std::vector<float>(n * table.width), table.width};
    for (size_t r = 0; r < n; ++r) {
      sorted.ids[r] = table.ids[order[r]];
      if (r > 0 && sorted.ids[r] == sorted.ids[r - 1]) {
        return absl::DataLossError(absl::StrCat("merge: table ", base, ": id ", sorted.ids[r], " held twice"));
      }
      std::copy_n(table.rows.data() + order[r] * table.width, table.width, sorted.rows.data() + r * table.width);
    }
    table = std::move(sorted);
    (*metadata)["segps.embeddings." + base.substr(std::strlen(kPrefix))] = absl::StrCat(n, " ", table.width);
    if (n == 0) continue;
    tensors->push_back({base + "/ids", {n}, {}, table.ids});
    tensors->push_back({base + "/rows", {n, table.width}, table.rows, {}});
  }
  return absl::OkStatus();
}

absl::Status SplitTables(const SafetensorsFile& merged, const v1::JobConfig& config, int segment, uint32_t server,
                         uint32_t num_servers, std::vector<TableState>* tables) {
  const v1::SegmentConfig& seg = config.model().segments(segment);
  tables->assign(seg.embeddings_size(), TableState());
  for (int t = 0; t < seg.embeddings_size(); ++t) {
    const v1::EmbeddingConfig& table = seg.embeddings(t);
    const std::string base = TensorBase(config.model(), segment, table);
    uint64_t n = 0, width = 0;
    if (!RowsAndWidth(merged.metadata(), "segps.embeddings." + base.substr(std::strlen(kPrefix)), &n, &width)) {
      return absl::NotFoundError(absl::StrCat("split: ", merged.path(), " has no table ", base));
    }
    if (n == 0) continue;
    if (width != StrideOf(config, table)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "split: ", merged.path(), ": table ", base, " rows hold ", width, " floats, but the job's rows carry ",
          StrideOf(config, table), " (values and optimizer slots); merge with --optimizer_slots"));
    }
    TableState all;
    if (!ReadTableTensors(merged, base, n, width, &all)) {
      return absl::DataLossError(absl::StrCat("split: ", merged.path(), ": table ", base,
                                              ": its tensors disagree with its metadata"));
    }
    TableState& state = (*tables)[t];
    for (uint64_t r = 0; r < n; ++r) {
      const uint64_t id = all.ids[r];
      if (id >= table.vocab() || (r > 0 && id <= all.ids[r - 1])) {
        return absl::DataLossError(absl::StrCat("split: ", merged.path(), ": table ", base, ": id ", id, " (row ", r,
                                                ") is out of order or not below vocab ", table.vocab()));
      }
      if (RowServer(segment, static_cast<uint32_t>(t), id, num_servers) != server) continue;
      state.ids.push_back(id);
      state.rows.insert(state.rows.end(), all.rows.begin() + r * width, all.rows.begin() + (r + 1) * width);
    }
  }
  return absl::OkStatus();
}

}  // namespace segps
