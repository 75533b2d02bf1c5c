#include "common/embedding.h"

#include <algorithm>

#include "common/hash.h"

namespace segps {

uint32_t EmbeddingWidth(const v1::SegmentConfig& segment) {
  uint32_t width = 0;
  for (const v1::EmbeddingConfig& table : segment.embeddings()) {
    width += table.dim() * static_cast<uint32_t>(table.field_size());
  }
  return width;
}

uint32_t RowServer(int segment, uint32_t table, uint64_t id, uint32_t num_servers) {
  return RowServers(segment, table, num_servers).Of(id);
}

void InitialRow(uint64_t seed, int segment, uint32_t table, uint64_t id, absl::Span<float> out) {
  const uint64_t key = Mix64(seed ^ Mix64(static_cast<uint64_t>(segment) ^ Mix64(table ^ Mix64(id))));
  auto uniform = [](uint64_t bits24) {
    return static_cast<float>(bits24) * (1.0f / 16777216.0f) * (2 * kEmbeddingInit) - kEmbeddingInit;
  };
  for (size_t j = 0; j < out.size(); j += 2) {
    const uint64_t bits = Mix64(key + (j / 2) * 0x9e3779b97f4a7c15ull);
    out[j] = uniform(bits >> 40);
    if (j + 1 < out.size()) out[j + 1] = uniform((bits >> 16) & 0xFFFFFF);
  }
}

uint64_t FieldVocab(const v1::ModelConfig& model, uint32_t field) {
  uint64_t vocab = 0;
  for (const v1::SegmentConfig& segment : model.segments()) {
    for (const v1::EmbeddingConfig& table : segment.embeddings()) {
      if (std::find(table.field().begin(), table.field().end(), field) == table.field().end()) continue;
      vocab = vocab == 0 ? table.vocab() : std::min(vocab, table.vocab());
    }
  }
  return vocab;
}

}  // namespace segps
