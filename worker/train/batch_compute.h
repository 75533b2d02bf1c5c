// An ensemble worker's step: one batch of its data slice (or, balanced, its
// share of the segment's clock), staged on the host and uploaded while the
// previous batch computes, then forward and backward through the segment.
// Clocks are the steps of the worker's whole schedule: clock c is step
// c % steps_per_epoch of epoch c / steps_per_epoch, whose order depends on
// the epoch only, so a step computed again after a recovery sees the same
// batch.
//
// Thread safety: used from the training thread only.
#ifndef SEGPS_WORKER_TRAIN_BATCH_COMPUTE_H_
#define SEGPS_WORKER_TRAIN_BATCH_COMPUTE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/shard_map.h"
#include "segps/v1/config.pb.h"
#include "worker/client/ps_client.h"
#include "worker/data/dataset.h"
#include "worker/model/backend.h"
#include "worker/model/segment_model.h"
#include "worker/train/progress.h"
#include "worker/train/step_compute.h"
#include "worker/train/trainer.h"

namespace segps {

class BatchCompute final : public StepCompute {
 public:
  // Everything passed outlives the result.
  static absl::StatusOr<std::unique_ptr<BatchCompute>> Create(const v1::JobConfig& config,
                                                              const TrainerOptions& options, const Dataset& train,
                                                              Backend* backend, ParameterClient* client);

  ~BatchCompute() override;

  SegmentModel* model() override { return &model_; }
  absl::Status Start(const Registration& registration, const std::string& tag) override;
  uint64_t EpochClocks() const override;
  absl::StatusOr<bool> HasStep(uint64_t clock) override { return clock < schedule_.total_steps; }
  bool IsLast(uint64_t clock) const override { return clock + 1 == schedule_.total_steps; }
  absl::Status Fetch(uint64_t clock) override;
  absl::StatusOr<StepResult> Compute(uint64_t clock) override;
  absl::Status Record(const StepRecord& record, TrainReport* report) override;
  absl::Status Complete(TrainReport* report) override;

 private:
  BatchCompute(const v1::JobConfig& config, const TrainerOptions& options, const Dataset& train, Backend* backend,
               ParameterClient* client, SegmentModel model, uint32_t capacity);
  absl::Status Allocate();
  // The rows of `clock` this worker computes, as positions in the epoch's
  // order; balanced, by the shares server 0 decided (nullopt: not final yet).
  std::optional<Range> RowsOf(uint64_t clock);
  // Gathers rows `mine` of `clock`'s epoch order on the host and enqueues
  // their upload into input slot `slot` (on the CPU, gathers straight into the slot).
  absl::Status Stage(uint64_t clock, Range mine, int slot);
  const std::vector<uint32_t>& OrderOf(uint32_t epoch);
  // The step's gradient, on the host: a device's through pinned memory.
  absl::StatusOr<const float*> HostGradient();
  // A segment with embedding tables: the batch's dense features and its
  // rows (fetched) make the input; the input gradient gives the rows'.
  absl::Status ComputeWithRows(uint64_t clock, StepResult* result);
  // The distinct ids of `clock`'s batch (its rows `mine`) into `rows`.
  void CollectRows(uint64_t clock, Range mine, BatchRows* rows);
  // Waits for the next clock's row pull, if one is out, and forgets it.
  void DropNextRows();
  // An error naming the step when its loss is not finite.
  absl::Status CheckLoss(uint64_t clock, const BatchStats& stats) const;

  const v1::JobConfig& config_;
  const TrainerOptions& options_;
  const Dataset& train_;
  Backend* const backend_;
  ParameterClient* const client_;
  SegmentModel model_;
  const bool device_;
  const bool balanced_;  // training.balance
  const uint32_t workers_;
  // Samples a clock takes (balanced: of the whole segment), and the most one worker computes.
  const uint32_t clock_samples_, capacity_;
  // On a device: one gradient buffer (encoded for the wire before reuse) and
  // a batch for each of the model's two input slots (the next uploads while one computes).
  Buffer grad_host_, batch_x_[2], batch_y_[2];

  uint32_t rank_ = 0;
  std::string tag_;
  Range slice_;  // the rows this worker draws from: its slice, or a balanced segment's rows
  Schedule schedule_;
  std::vector<uint32_t> order_;
  std::optional<uint32_t> order_epoch_;
  std::vector<uint32_t> shares_;  // as of the last clock staged
  int slot_ = 0;
  std::optional<uint64_t> staged_clock_;  // the clock whose batch is in slot_
  size_t staged_rows_ = 0;                // its rows
  std::vector<float> no_gradient_;        // a share of no rows pushes zeros
  // Embedding tables: the batch's rows, the next clock's (pulled while
  // this one computes: next_pull_), and the host copies of its ids,
  // features, labels, whole input and input gradient.
  std::unique_ptr<BatchRows> rows_, next_rows_;
  std::optional<Completion<absl::Status>> next_pull_;
  uint64_t next_clock_ = 0;
  std::vector<uint64_t> batch_ids_;
  std::vector<float> dense_, input_host_, input_grad_host_;
  std::vector<int32_t> labels_host_;
  Throughput throughput_;
  Progress progress_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_BATCH_COMPUTE_H_
