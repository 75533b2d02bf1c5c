// Server-side optimizers: each applies a gradient to a contiguous range of
// parameters in place, element by element, keeping its own state (momentum,
// moments, accumulators) for exactly that range.
//
// Thread safety: none; the owner (SegmentShard) serialises calls.
#ifndef SEGPS_SERVER_OPTIMIZER_H_
#define SEGPS_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "segps/v1/config.pb.h"

namespace segps {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update: params.size() == grad.size() == the range size given at creation.
  virtual void Apply(absl::Span<float> params, absl::Span<const float> grad) = 0;
  // Updates applied so far.
  virtual uint64_t steps() const = 0;
};

// `config` must be a validated config (defaults filled in).
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const v1::OptimizerConfig& config,
                                                           uint64_t range_size);

}  // namespace segps

#endif  // SEGPS_SERVER_OPTIMIZER_H_
