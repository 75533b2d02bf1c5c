// Server-side optimizers: each applies a gradient to a contiguous range of
// parameters in place, element by element, keeping its own state (momentum,
// moments, accumulators) for exactly that range. An update may arrive in
// blocks (chunked pushes, payloads read block by block), so Apply takes the
// block's place in the range and the number of the update it belongs to.
//
// Thread safety: Apply calls on disjoint element ranges may run at once (an
// update split over threads); the owner (SegmentShard) serialises the rest.
#ifndef SEGPS_SERVER_OPTIMIZER_H_
#define SEGPS_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/vector_clones.h"
#include "segps/v1/config.pb.h"

namespace segps {

// optimizer.learning_rate at update number `step` (1 for the first) under
// optimizer.schedule: a linear rise over its first warmup_updates, then
// CONSTANT, STEP (times gamma every step_updates) or COSINE (half a cosine
// down to min_factor times the rate over decay_updates, then level).
float ScheduledRate(const v1::OptimizerConfig& config, uint64_t step);

class Optimizer {
 public:
  explicit Optimizer(const v1::OptimizerConfig& config) : config_(config) {}
  virtual ~Optimizer() = default;
  // Applies `grad` to `params`, the elements [first, first + params.size())
  // of the range, as part of update number `step` (1 for the first), with
  // the learning rate times `scale` (a balanced push's weight: its samples
  // over batch_size).
  virtual void Apply(uint64_t step, uint64_t first, absl::Span<float> params, absl::Span<const float> grad,
                     float scale) = 0;
  // No push may make the parameters or the state infinite, so an update is
  // admitted on bounds of the magnitudes it can reach: Admit says whether
  // update number `step`, its gradient's elements at most `max_abs` in
  // magnitude and its rate times `scale`, keeps every intermediate and
  // result of Apply within float32's range (with a margin for rounding),
  // and if so the bounds take the update. The bounds only grow from update
  // to update; where they would refuse one, they are first set again from
  // `params` (the whole range) and the state as they are, so that only an
  // update that could really overflow is refused, naming what would.
  absl::Status Admit(uint64_t step, float max_abs, float scale, absl::Span<const float> params);
  // Sets the bounds from `params` and the state: at the start, after a restore.
  virtual void Bound(absl::Span<const float> params) = 0;
  // Writes to `out` where `updates` more updates carrying no new gradient
  // would take `params` (elements [first, first + params.size()) of the
  // range) once `applied` updates have been made: the momentum's own drift.
  // Pulls use it to compensate a gradient for the updates it will miss.
  // Optimizers without momentum copy.
  virtual void Extrapolate(uint64_t applied, uint64_t updates, uint64_t first, absl::Span<const float> params,
                           absl::Span<float> out) const;

  // The optimizer's state, for checkpoints: named slots of range_size
  // floats each ("momentum"; "adam_m", "adam_v"; "adagrad_accumulator"),
  // in the order of SlotNames. SaveState copies; LoadState takes slots of
  // the same names and sizes (checked by the caller).
  virtual std::vector<std::string> SlotNames() const { return {}; }
  virtual void SaveState(std::vector<std::vector<float>>* slots) const { slots->clear(); }
  virtual void LoadState(const std::vector<std::vector<float>>& slots) { (void)slots; }

 protected:
  // The learning rate of update number `step`.
  float Rate(uint64_t step) const { return ScheduledRate(config_, step); }
  // Admit on the bounds as they are: an error if they could overflow, else
  // the bounds after the update.
  virtual absl::Status Grow(uint64_t step, float max_abs, float scale) = 0;

  const v1::OptimizerConfig config_;
};

// `config` must be a validated config (defaults filled in).
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const v1::OptimizerConfig& config,
                                                           uint64_t range_size);

}  // namespace segps

#endif  // SEGPS_SERVER_OPTIMIZER_H_
