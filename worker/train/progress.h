// An ensemble worker's progress: a log line (or progress bar) every
// training.log_interval_s and at each epoch's end, the worker's metrics,
// and one record per epoch in the report's history, scored on the test set
// when there is one.
//
// Thread safety: used from the training thread only.
#ifndef SEGPS_WORKER_TRAIN_PROGRESS_H_
#define SEGPS_WORKER_TRAIN_PROGRESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "segps/v1/config.pb.h"
#include "worker/model/backend.h"
#include "worker/model/evaluator.h"
#include "worker/model/segment_model.h"
#include "worker/train/early_stop.h"
#include "worker/train/step_compute.h"
#include "worker/train/trainer.h"

namespace segps {

// A worker's compute throughput, smoothed over its last 20 or so steps (a
// balanced segment's share follows it; the waits of the staleness bound are
// not in it).
class Throughput {
 public:
  void Observe(size_t rows, absl::Duration compute);
  double rate() const { return seconds_ > 0 ? samples_ / seconds_ : 0; }

 private:
  double samples_ = 0, seconds_ = 0;
};

// The schedule a worker's clocks follow.
struct Schedule {
  uint64_t steps_per_epoch = 1;
  uint64_t total_steps = 0;
  uint32_t epochs = 0;
};

class Progress {
 public:
  // Everything passed outlives this.
  Progress(const v1::JobConfig& config, const TrainerOptions& options, Backend* backend, SegmentModel* model);

  // Where scoring gets a segment's embedding rows (the servers' current ones).
  void set_rows(RowSource rows) { rows_ = std::move(rows); }
  // Starts counting for worker `tag` (rank `rank`) on `schedule`;
  // `balanced`: log the share.
  void Start(const std::string& tag, uint32_t rank, const Schedule& schedule, bool balanced);
  // A step done; `throughput` as of it.
  absl::Status Record(const StepRecord& record, const Throughput& throughput, TrainReport* report);
  // Seconds training since Start, scoring left out: what the epochs' records count.
  double TrainSeconds() const { return absl::ToDoubleSeconds(absl::Now() - t0_ - scoring_time_); }
  // Ends the progress bar's line.
  void Finish();

 private:
  RowSource rows_;
  // Progress between two log lines, or over an epoch.
  struct Window {
    double loss = 0;
    double correct = 0;  // or, under loss MSE, summed absolute error
    uint64_t samples = 0, steps = 0;
    double staleness = 0;
    uint64_t max_staleness = 0;
    absl::Duration blocked;
    absl::Duration compute;  // the worker's own computing
    absl::Time start = absl::Now();
  };
  void Log(uint64_t clock, const Throughput& throughput);
  absl::Status EndEpoch(uint32_t epoch, TrainReport* report);
  // Scores the model's parameters (`segments`, this segment's filled in) on
  // the validation set, and on the test set, into `record`.
  absl::Status Validate(uint32_t epoch, const std::vector<std::vector<float>>& segments, v1::EpochRecord* record);
  absl::Status Score(uint32_t epoch, const std::vector<std::vector<float>>& segments, v1::EpochRecord* record,
                     v1::WorkerHistory* history);
  // Early stopping, on rank 0: after `epoch`'s validation, whether the
  // segment stops (report->end_at_clock, its history's best_epoch).
  void MaybeStop(uint32_t epoch, const v1::EpochRecord& record, TrainReport* report);

  const v1::JobConfig& config_;
  const TrainerOptions& options_;
  Backend* const backend_;
  SegmentModel* const model_;
  const absl::Duration log_every_;
  std::string tag_;
  uint32_t rank_ = 0;
  Schedule schedule_;
  std::optional<EarlyStop> early_stop_;  // training.early_stopping, on rank 0
  bool balanced_ = false;
  absl::Time t0_ = absl::Now(), next_log_;
  Window window_, epoch_window_;
  absl::Time last_step_end_;  // an epoch's window starts where its first step did
  std::optional<uint32_t> window_epoch_;  // the epoch epoch_window_ counts
  absl::Duration scoring_time_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_PROGRESS_H_
