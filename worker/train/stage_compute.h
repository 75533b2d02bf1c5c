// A pipeline stage's step (combine: CHAIN): replica r of stage k. A clock
// is one mini-batch of stage 0's data slice, cut into micro-batches; the
// stage runs their forwards and backwards in the configured schedule
// (GPIPE or ONE_F_ONE_B), passing activations forward and their gradients
// back over its links (pipeline_link.h), and adds up the micro-batches'
// parameter gradients into the clock's one gradient. The parameters stay
// the same between a micro-batch's forward and its backward, whatever the
// schedule. Stage 0 follows its data's schedule of clocks; the others
// follow the activations, and learn that training is over from stage 0.
//
// Thread safety: used from the training thread only.
#ifndef SEGPS_WORKER_TRAIN_STAGE_COMPUTE_H_
#define SEGPS_WORKER_TRAIN_STAGE_COMPUTE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shard_map.h"
#include "segps/v1/config.pb.h"
#include "worker/data/dataset.h"
#include "worker/model/backend.h"
#include "worker/model/segment_model.h"
#include "worker/train/pipeline_link.h"
#include "worker/train/pipeline_trainer.h"
#include "worker/train/step_compute.h"

namespace segps {

class StageCompute final : public StepCompute {
 public:
  // Everything passed outlives the result; `train` is read by stage 0 only.
  static absl::StatusOr<std::unique_ptr<StageCompute>> Create(const v1::JobConfig& config,
                                                              const StageOptions& options, const Dataset* train,
                                                              Backend* backend);

  SegmentModel* model() override { return &model_; }
  absl::Status Start(const Registration& registration, const std::string& tag) override;
  absl::StatusOr<bool> HasStep(uint64_t clock) override;
  bool IsLast(uint64_t clock) const override { return first_stage_ && clock + 1 == total_steps_; }
  absl::StatusOr<StepResult> Compute(uint64_t clock) override;
  absl::Status Record(const StepRecord& record, TrainReport* report) override;
  bool Chained() const override { return true; }
  absl::Status Rewind() override;
  absl::Status Complete(TrainReport* report) override;

 private:
  StageCompute(const v1::JobConfig& config, const StageOptions& options, const Dataset* train, Backend* backend,
               SegmentModel model, uint32_t slots);
  // The last stage's record of the epoch that ends, in the report's
  // history, with the whole chain's validation and test scores where it
  // keeps them.
  absl::Status CloseEpoch(TrainReport* report);
  // A micro-batch's forward and backward; `first`: its first row in the
  // model's slots. The last stage's forward adds its loss to `clock_stats`.
  absl::Status Forward(uint64_t clock, uint32_t m, uint32_t rows, int first, BatchStats* clock_stats);
  absl::Status Backward(uint64_t clock, uint32_t m, uint32_t rows, int first);
  // Stage 0: gathers micro-batch rows from the data; the others receive them.
  absl::Status Gather(uint64_t clock, uint32_t first_row, uint32_t rows, int first);
  absl::Status Receive(uint64_t clock, uint32_t m, uint32_t rows, int first);
  absl::StatusOr<MicroBatch> ReceiveNext();
  // Copies host bytes to the device and waits for the copy: the host buffers
  // (a received message, the staging buffer) are freed or reused right after.
  absl::Status Upload(const void* host, void* device, size_t bytes);
  // `count` floats of the device's `from` on the host (in place on the CPU).
  absl::StatusOr<absl::Span<const float>> ToHost(const float* from, size_t count);
  // Ends the pass that started at `start`: on a slower device it takes
  // slowdown_factor times as long, and at least `weight` x pass_time.
  absl::Status EndPass(absl::Time start, int weight);
  // Accounts a wait for a neighbour that began at `start`, and values that
  // crossed a link, for the log and the stage's metrics.
  void Waited(StageMetrics::Neighbour neighbour, absl::Time start);
  void Crossed(void (StageMetrics::*observe)(uint64_t), size_t floats);

  const v1::JobConfig& config_;
  const StageOptions& options_;
  const Dataset* const train_;
  Backend* const backend_;
  SegmentModel model_;
  const int stage_, stages_;
  const bool first_stage_, last_stage_;
  const uint32_t batch_, micro_, micro_rows_;
  const uint32_t slots_;  // micro-batches held at once
  const size_t in_width_, out_width_;

  std::string tag_;
  // Stage 0's schedule of clocks.
  Range slice_;
  uint64_t steps_per_epoch_ = 0, total_steps_ = 0;
  std::vector<uint32_t> order_;
  std::optional<uint64_t> order_epoch_;
  // Stage > 0: the first message of the next clock, already received.
  std::optional<MicroBatch> pending_;
  uint32_t batch_rows_ = 0;              // the rows of the clock being computed
  std::vector<int32_t> labels_;          // per slot, for the next stage
  std::vector<float> host_values_, host_grad_;
  bool accumulate_ = false;  // later backwards of a clock add to its gradient

  absl::Duration waiting_;  // for a neighbour's message
  uint64_t link_bytes_ = 0;  // activations and their gradients, both ways, both links
  absl::Time t0_ = absl::Now(), next_log_;
  // The idle share counts from the end of the first clock.
  absl::Time steady_start_;
  absl::Duration steady_waiting_;
  // The epoch of the clock in hand (the first stage's data says it, and
  // each stage passes it on); the last stage keeps a record of each.
  uint32_t epoch_ = 0;
  std::optional<uint32_t> recorded_epoch_;
  absl::Time epoch_start_;
  double epoch_loss_ = 0;
  double epoch_correct_ = 0;  // or, under loss MSE, summed absolute error
  uint64_t epoch_samples_ = 0;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_STAGE_COMPUTE_H_
