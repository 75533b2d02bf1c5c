#include "worker/client/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace segps {
namespace {

// |x|, with NaN as the largest.
float Magnitude(float x) {
  const float m = std::fabs(x);
  return std::isnan(m) ? std::numeric_limits<float>::infinity() : m;
}

}  // namespace

TopK::TopK(size_t size, double fraction)
    : k_(std::clamp<size_t>(static_cast<size_t>(std::llround(fraction * static_cast<double>(size))), 1,
                            std::max<size_t>(size, 1))),
      residual_(size, 0.0f) {
  indices_.reserve(k_);
  values_.reserve(k_);
}

void TopK::Select(absl::Span<const float> grad) {
  const size_t n = residual_.size();
  for (size_t i = 0; i < n; ++i) residual_[i] += grad[i];
  indices_.clear();
  values_.clear();
  if (n == 0) return;
  // A full selection over n entries costs more than the step's compute on
  // a small model. A strided sample gives a threshold that about 2k entries
  // pass; one scan gathers them, and the exact k-th magnitude is found among
  // those alone (or among all, when too few passed).
  const size_t samples = std::min<size_t>(n, 4096), stride = n / samples;
  magnitudes_.resize(samples);
  for (size_t j = 0; j < samples; ++j) magnitudes_[j] = Magnitude(residual_[j * stride]);
  const double passing = std::min(1.0, 2.0 * static_cast<double>(k_) / static_cast<double>(n));
  const size_t at = static_cast<size_t>((1.0 - passing) * static_cast<double>(samples - 1));
  std::nth_element(magnitudes_.begin(), magnitudes_.begin() + static_cast<ptrdiff_t>(at), magnitudes_.end());
  auto gather = [&](float floor) {
    candidates_.clear();
    for (size_t i = 0; i < n; ++i) {
      if (Magnitude(residual_[i]) >= floor) candidates_.push_back(i);
    }
  };
  gather(magnitudes_[at]);
  if (candidates_.size() < k_) gather(-1.0f);  // the sample misled: every entry is a candidate
  // The k-th largest magnitude among the candidates: every candidate above
  // it travels, and as many equal to it as fill k, the lowest positions first.
  const size_t c = candidates_.size();
  magnitudes_.resize(c);
  for (size_t j = 0; j < c; ++j) magnitudes_[j] = Magnitude(residual_[candidates_[j]]);
  std::nth_element(magnitudes_.begin(), magnitudes_.begin() + static_cast<ptrdiff_t>(c - k_), magnitudes_.end());
  const float threshold = magnitudes_[c - k_];
  size_t above = 0;
  for (uint64_t i : candidates_) above += Magnitude(residual_[i]) > threshold;
  size_t ties = k_ - above;
  for (uint64_t i : candidates_) {
    const float m = Magnitude(residual_[i]);
    if (m > threshold || (m == threshold && ties > 0)) {
      if (m == threshold) --ties;
      indices_.push_back(i);
      values_.push_back(residual_[i]);
      residual_[i] = 0.0f;
    }
  }
}

}  // namespace segps
