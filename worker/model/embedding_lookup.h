// A batch's embedding rows on a worker (SegmentConfig.embeddings): the
// distinct ids each table looks up, their rows as pulled, where each
// sample's rows go in the first layer's input (after the dense features,
// table by table, field by field), and the rows' summed gradients taken
// back from the input gradient.
//
// Thread safety: none; a worker's training thread owns it.
#ifndef SEGPS_WORKER_MODEL_EMBEDDING_LOOKUP_H_
#define SEGPS_WORKER_MODEL_EMBEDDING_LOOKUP_H_

#include <cstdint>
#include <vector>

#include "segps/v1/config.pb.h"

namespace segps {

class BatchRows {
 public:
  // For segment `segment` whose samples have `dense_width` features and `fields` id columns.
  BatchRows(const v1::SegmentConfig& segment, uint32_t dense_width, int fields);

  // The distinct ids of a batch's `rows` samples (ids [rows x fields]), per
  // table, in order of first use, and each sample's place among them.
  void Collect(const uint64_t* ids, size_t rows);
  const std::vector<std::vector<uint64_t>>& ids() const { return ids_; }
  // Per table: ids x dim floats, the rows pulled (filled by the caller).
  std::vector<std::vector<float>>* mutable_values() { return &values_; }

  // The model's input [rows x (dense_width + the tables' width)]: `dense`
  // [rows x dense_width] followed by each sample's rows.
  void FillInput(const float* dense, float* input) const;
  // The rows' gradients: per table, ids x dim, each the sum over the
  // samples and fields that looked it up of the input gradient's columns.
  void SumGradients(const float* input_grad);
  const std::vector<std::vector<float>>& gradients() const { return grads_; }

 private:
  const v1::SegmentConfig& segment_;
  const uint32_t dense_width_, width_;
  const int fields_;
  size_t rows_ = 0;
  std::vector<std::vector<uint64_t>> ids_;
  std::vector<std::vector<uint32_t>> slots_;  // per table: [rows x its fields], index into ids_
  std::vector<std::vector<float>> values_, grads_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_MODEL_EMBEDDING_LOOKUP_H_
