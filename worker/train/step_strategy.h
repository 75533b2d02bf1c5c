// How a training step gets its parameters and sends its gradient, by
// staleness bound:
// - synchronous rounds (staleness 0): each step's push and the next step's
//   pull go in the same calls, and the step waits for them (nothing could
//   compute meanwhile: the next step needs every worker's push);
// - prefetch and bounded pushes (staleness > 0 or unbounded): the pull for
//   the next step starts as soon as the current one lands, pushes go
//   without waiting (at most PushesInFlight outstanding), and a step waits
//   only while its parameters are staler than the bound allows.
#ifndef SEGPS_WORKER_TRAIN_STEP_STRATEGY_H_
#define SEGPS_WORKER_TRAIN_STEP_STRATEGY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/client/async_client.h"
#include "worker/model/backend.h"
#include "worker/model/segment_model.h"

namespace segps {

// What a strategy works with; everything outlives it.
struct StepContext {
  AsyncClient* client = nullptr;
  Backend* backend = nullptr;
  SegmentModel* model = nullptr;
  // Two pinned host buffers of the model's parameter count: one filled by
  // a pull while the other uploads.
  Buffer* pulled[2] = {nullptr, nullptr};
  int32_t staleness = 0;
  uint64_t start_clock = 0;  // the worker's first step
};

class StepStrategy {
 public:
  virtual ~StepStrategy() = default;
  // Brings the model's parameters to a version fresh enough for step
  // `clock`; returns the clock they reflect. Adds the time it waited to `*blocked`.
  virtual absl::StatusOr<uint64_t> Prepare(uint64_t clock, absl::Duration* blocked) = 0;
  // Sends the step's gradient; `last`: no step follows.
  virtual absl::Status Finish(std::unique_ptr<EncodedPush> push, bool last, absl::Duration* blocked) = 0;
  // Waits until every push is acknowledged.
  absl::Status Drain() { return context_.client->DrainPushes(); }

  // The strategy for the context's staleness bound.
  static std::unique_ptr<StepStrategy> For(const StepContext& context);

 protected:
  explicit StepStrategy(const StepContext& context) : context_(context) {}
  // Uploads pulled values into the model's parameters and waits for the copy.
  absl::Status Upload(const float* values);
  size_t params() const { return context_.model->num_params(); }

  const StepContext context_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_STEP_STRATEGY_H_
