// Top-k gradient sparsification with error feedback: each step sends the k
// entries of largest magnitude of the gradient plus everything earlier steps
// left out, and keeps the rest for the steps after. Every gradient entry is
// eventually applied; only when is delayed.
#ifndef SEGPS_WORKER_CLIENT_TOPK_H_
#define SEGPS_WORKER_CLIENT_TOPK_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace segps {

class TopK {
 public:
  // Gradients of `size` entries, of which round(fraction x size), at least
  // one, travel each step; 0 < fraction < 1.
  TopK(size_t size, double fraction);

  size_t k() const { return k_; }

  // Adds `grad` to what is left over, moves the k largest entries out into
  // indices() (ascending) and values(). A non-finite entry counts as the
  // largest, so that it travels and the server rejects it.
  void Select(absl::Span<const float> grad);

  absl::Span<const uint64_t> indices() const { return indices_; }
  absl::Span<const float> values() const { return values_; }
  // What has not travelled yet.
  absl::Span<const float> residual() const { return residual_; }

 private:
  size_t k_;
  std::vector<float> residual_;
  std::vector<float> magnitudes_;   // scratch for the selection
  std::vector<uint64_t> candidates_;
  std::vector<uint64_t> indices_;
  std::vector<float> values_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_TOPK_H_
