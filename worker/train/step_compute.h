// What one clock's step computes, by kind of worker: an ensemble worker's
// batch (batch_compute.h) or a pipeline stage's micro-batches over its
// links (stage_compute.h). The training engine (engine.h) drives either the
// same way: it brings the parameters, asks for the step's gradient, sends
// it, and recovers from the servers' failures; a StepCompute knows the
// data, the model and what to log.
//
// Thread safety: called from the engine's one training thread.
#ifndef SEGPS_WORKER_TRAIN_STEP_COMPUTE_H_
#define SEGPS_WORKER_TRAIN_STEP_COMPUTE_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/time/time.h"
#include "worker/client/ps_client.h"
#include "worker/model/embedding_lookup.h"
#include "worker/model/segment_model.h"
#include "worker/train/trainer.h"

namespace segps {

// The gradient of one step, on the host.
struct StepResult {
  const float* grad = nullptr;  // num_params floats, valid until the next Compute
  uint32_t rows = 0;            // samples behind it
  // Loss and correct predictions, where this worker computes the loss.
  std::optional<BatchStats> stats;
  absl::Duration compute;  // the worker's own computing
  // A segment with embedding tables: the step's rows and their gradients.
  const BatchRows* rows_pulled = nullptr;
  // Balanced training (training.balance): the worker's smoothed compute
  // throughput, which server 0 cuts the next clocks' shares by.
  std::optional<float> samples_per_second;
};

// A step done: what the engine measured around the compute.
struct StepRecord {
  uint64_t clock = 0;
  uint64_t index = 0;  // steps done before this one since the worker started
  const StepResult* result = nullptr;
  uint64_t lag = 0;        // clocks the step's parameters lagged behind it
  absl::Duration blocked;  // waiting for the servers in this step
};

// A step that failed on a link between pipeline stages (a neighbour died,
// stopped answering past its lease, or recovered and reopened the link):
// the engine recovers from it as from the servers' failures.
inline constexpr char kLinkFailureUrl[] = "segps.v1/link_failure";
inline absl::Status LinkFailure(absl::Status status) {
  if (!status.ok()) status.SetPayload(kLinkFailureUrl, absl::Cord("1"));
  return status;
}
inline bool IsLinkFailure(const absl::Status& status) {
  return status.GetPayload(kLinkFailureUrl).has_value();
}

class StepCompute {
 public:
  virtual ~StepCompute() = default;
  // The model the engine brings parameters into; it outlives the run.
  virtual SegmentModel* model() = 0;
  // Registered with the servers: sets up the worker's data. `tag` names it in logs.
  virtual absl::Status Start(const Registration& registration, const std::string& tag) = 0;
  // Early stopping: the clocks of the segment's epoch as its rank 0 counts
  // them (RegisterRequest.epoch_clocks), known before registering; 0 where
  // a compute has no epochs of its own.
  virtual uint64_t EpochClocks() const { return 0; }
  // Whether step `clock` is to be computed (false once training is over).
  virtual absl::StatusOr<bool> HasStep(uint64_t clock) = 0;
  // Whether step `clock` is the last; false when not yet known.
  virtual bool IsLast(uint64_t clock) const = 0;
  // Brings what step `clock` needs from the servers besides the
  // parameters (a batch's embedding rows), once the parameters are there.
  // Its failures are the servers' (the engine recovers from them).
  virtual absl::Status Fetch(uint64_t clock) {
    (void)clock;
    return absl::OkStatus();
  }
  // Computes step `clock` with the model's current parameters.
  virtual absl::StatusOr<StepResult> Compute(uint64_t clock) = 0;
  // After the step's push was sent: progress, logs, per-epoch work.
  virtual absl::Status Record(const StepRecord& record, TrainReport* report) = 0;
  // A pipeline stage: it cannot compute a step again alone (its
  // neighbours moved on). Where it cannot continue at its clock, its lane
  // replays from a clean cut or the whole chain from a checkpoint every
  // stage holds, every stage after a Rewind. Any other compute computes
  // again whatever the servers did not keep.
  virtual bool Chained() const { return false; }
  // Before a replay: drops what the compute holds of the clocks it had
  // begun and makes its links afresh (its data follows the clock).
  virtual absl::Status Rewind() { return absl::OkStatus(); }
  // Every step done and pushed: ends the run (fills the report's loss,
  // accuracy and history; a stage tells the next one that training is over).
  virtual absl::Status Complete(TrainReport* report) = 0;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_STEP_COMPUTE_H_
