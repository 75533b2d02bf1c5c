// Clipping a worker's gradient before it is pushed (optimizer.clip_value,
// optimizer.clip_gradient_norm): a worker whose loss explodes sends a
// bounded step instead of one the servers would refuse or that would throw
// the model far off.
#ifndef SEGPS_WORKER_TRAIN_GRADIENT_CLIP_H_
#define SEGPS_WORKER_TRAIN_GRADIENT_CLIP_H_

#include <algorithm>
#include <cmath>

#include "absl/types/span.h"
#include "segps/v1/config.pb.h"

namespace segps {

inline bool ClipsGradient(const v1::OptimizerConfig& optimizer) {
  return optimizer.clip_value() > 0 || optimizer.clip_gradient_norm() > 0;
}

// Bounds every element to [-clip_value, clip_value], then scales `grad`
// down to clip_gradient_norm when its L2 norm (summed in double) is larger.
// Returns the norm before the scaling.
inline double ClipGradient(const v1::OptimizerConfig& optimizer, absl::Span<float> grad) {
  if (const float c = optimizer.clip_value(); c > 0) {
    for (float& g : grad) g = std::clamp(g, -c, c);
  }
  double squares = 0;
  for (float g : grad) squares += static_cast<double>(g) * g;
  const double norm = std::sqrt(squares);
  if (const double c = optimizer.clip_gradient_norm(); c > 0 && norm > c) {
    const float scale = static_cast<float>(c / norm);
    for (float& g : grad) g *= scale;
  }
  return norm;
}

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_GRADIENT_CLIP_H_
