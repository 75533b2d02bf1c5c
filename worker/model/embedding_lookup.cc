#include "worker/model/embedding_lookup.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "common/embedding.h"

namespace segps {

BatchRows::BatchRows(const v1::SegmentConfig& segment, uint32_t dense_width, int fields)
    : segment_(segment),
      dense_width_(dense_width),
      width_(dense_width + EmbeddingWidth(segment)),
      fields_(fields),
      ids_(segment.embeddings_size()),
      slots_(segment.embeddings_size()),
      values_(segment.embeddings_size()),
      grads_(segment.embeddings_size()) {}

void BatchRows::Collect(const uint64_t* ids, size_t rows) {
  rows_ = rows;
  absl::flat_hash_map<uint64_t, uint32_t> seen;
  for (int t = 0; t < segment_.embeddings_size(); ++t) {
    const v1::EmbeddingConfig& table = segment_.embeddings(t);
    const size_t per = static_cast<size_t>(table.field_size());
    seen.clear();
    ids_[t].clear();
    slots_[t].resize(rows * per);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t f = 0; f < per; ++f) {
        const uint64_t id = ids[r * fields_ + table.field(static_cast<int>(f))];
        auto [it, added] = seen.try_emplace(id, static_cast<uint32_t>(ids_[t].size()));
        if (added) ids_[t].push_back(id);
        slots_[t][r * per + f] = it->second;
      }
    }
  }
}

void BatchRows::FillInput(const float* dense, float* input) const {
  for (size_t r = 0; r < rows_; ++r) {
    float* out = input + r * width_;
    std::copy_n(dense + r * dense_width_, dense_width_, out);
    out += dense_width_;
    for (int t = 0; t < segment_.embeddings_size(); ++t) {
      const size_t dim = segment_.embeddings(t).dim(), per = segment_.embeddings(t).field_size();
      for (size_t f = 0; f < per; ++f) {
        std::copy_n(values_[t].data() + slots_[t][r * per + f] * dim, dim, out);
        out += dim;
      }
    }
  }
}

void BatchRows::SumGradients(const float* input_grad) {
  for (int t = 0; t < segment_.embeddings_size(); ++t) {
    grads_[t].assign(ids_[t].size() * segment_.embeddings(t).dim(), 0.0f);
  }
  for (size_t r = 0; r < rows_; ++r) {
    const float* in = input_grad + r * width_ + dense_width_;
    for (int t = 0; t < segment_.embeddings_size(); ++t) {
      const size_t dim = segment_.embeddings(t).dim(), per = segment_.embeddings(t).field_size();
      for (size_t f = 0; f < per; ++f) {
        float* g = grads_[t].data() + slots_[t][r * per + f] * dim;
        for (size_t j = 0; j < dim; ++j) g[j] += in[j];
        in += dim;
      }
    }
  }
}

}  // namespace segps
