#include "server/checkpoint_tables.h"

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

// Floats a stored row takes under `kind` (server/embedding_table.h).
uint64_t StrideOf(const v1::JobConfig& config, const v1::EmbeddingConfig& table) {
  const v1::OptimizerKind kind = config.optimizer().kind();
  const uint64_t slots = kind == v1::ADAM ? 2 : kind == v1::MOMENTUM || kind == v1::ADAGRAD ? 1 : 0;
  return table.dim() * (1 + slots);
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
    auto it = metadata.find("segps.embeddings." + table.name());
    const std::vector<std::string> words =
        it == metadata.end() ? std::vector<std::string>() : absl::StrSplit(it->second, ' ');
    uint64_t n = 0, stride = 0;
    if (words.size() != 2 || !absl::SimpleAtoi(words[0], &n) || !absl::SimpleAtoi(words[1], &stride)) {
      return corrupt("metadata segps.embeddings." + table.name() + " is missing or not \"ROWS WIDTH\"");
    }
    if (n == 0) continue;
    if (stride != StrideOf(config, table)) {
      return corrupt(absl::StrCat("rows of ", stride, " floats, but dim and optimizer give ", StrideOf(config, table)));
    }
    const std::string base = TensorBase(config.model(), segment, table);
    const auto ids = file.tensors().find(base + "/ids");
    const auto rows = file.tensors().find(base + "/rows");
    if (ids == file.tensors().end() || rows == file.tensors().end() || ids->second.dtype != "U64" ||
        rows->second.dtype != "F32" || ids->second.bytes.size() != n * 8 ||
        rows->second.bytes.size() != n * stride * sizeof(float)) {
      return corrupt(absl::StrCat("tensors ", base, "/ids (U64 [", n, "]) and /rows (F32 [", n, ", ", stride,
                                  "]) are missing or of another shape"));
    }
    TableState& state = (*tables)[t];
    state.ids.resize(n);
    std::memcpy(state.ids.data(), ids->second.bytes.data(), n * 8);
    state.rows.resize(n * stride);
    std::memcpy(state.rows.data(), rows->second.bytes.data(), n * stride * sizeof(float));
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

}  // namespace segps
