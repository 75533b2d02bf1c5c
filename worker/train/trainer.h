// Training one worker of an ensemble's segment: the training engine
// (engine.h) over the segment's batches (batch_compute.h).
#ifndef SEGPS_WORKER_TRAIN_TRAINER_H_
#define SEGPS_WORKER_TRAIN_TRAINER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/report.pb.h"
#include "worker/model/backend.h"
#include "worker/data/dataset.h"
#include "worker/client/ps_client.h"
#include "worker/train/worker_metrics.h"

namespace segps {

struct TrainerOptions {
  int segment = 0;
  // Unset: the servers assign the lowest free rank.
  std::optional<uint32_t> rank = 0;
  // Prometheus metrics to update; may be null.
  WorkerMetrics* metrics = nullptr;
  // Extra time per step, to play a straggler in staleness experiments.
  absl::Duration slowdown = absl::ZeroDuration();
  // Stretches each step's compute time by this factor (>= 1): a slower
  // device, whose cost grows with its share of the samples.
  double slowdown_factor = 1;
  // Draw a progress bar on stdout (when it is a terminal).
  bool progress_bar = false;
  // When set, the segment is scored on it after every epoch.
  const Dataset* test = nullptr;
  // data.validation_fraction's rows: when set, scored after every epoch.
  const Dataset* validation = nullptr;
  // With `test`: receives the segment's test-set probabilities [test rows x
  // classes] after every epoch (for the ensemble's history), one an epoch
  // from the report's history.first_scored_epoch on. May be null.
  std::vector<std::vector<float>>* test_probabilities = nullptr;
};

struct TrainReport {
  uint64_t steps = 0;
  uint64_t samples = 0;
  double seconds = 0;
  double last_loss = 0;      // mean loss over the last epoch
  double last_accuracy = 0;  // training accuracy over the last epoch
  uint64_t max_staleness = 0;  // most clocks a step's parameters lagged behind it
  double mean_staleness = 0;
  double blocked_seconds = 0;  // time waiting for pulls
  uint64_t recoveries = 0;     // times the worker rejoined the servers after a failure
  // The clocks this process began and ended at (its rank's steps before the
  // first were computed by an earlier process), and the steps another
  // process computed while this one was away (it rejoined ahead of its
  // clock). `confirmed`: every server said it applied `last_clock` steps of
  // the rank (a server that was restarting as the job ended says nothing).
  uint64_t first_clock = 0, last_clock = 0, taken_over = 0;
  bool confirmed = false;
  v1::WorkerHistory history;  // one record per epoch
  // Early stopping (training.early_stopping). `end_at_clock`: set where this
  // worker (its segment's rank 0) decided to stop; leaving ends the segment
  // at its checkpoint of that clock, the best epoch's end. `stopped_early`:
  // why training ended before its schedule, here or by rank 0's decision.
  std::optional<uint64_t> end_at_clock;
  std::string stopped_early;
};

// "S steps computed here (clocks F to L...)": what a report's steps are.
std::string StepsComputed(const TrainReport& report);
// "last epoch loss L acc A" (mae under loss MSE), or that this process trained no epoch (a
// finished job resumed: nothing was left to train).
std::string LastEpoch(const TrainReport& report, const v1::ModelConfig& model);

// Trains a worker of `options.segment` on its slice of `train`
// through `client` (not yet registered). `config` must come from LoadConfig.
absl::StatusOr<TrainReport> Train(const v1::JobConfig& config, const TrainerOptions& options,
                                  const Dataset& train, Backend* backend, ParameterClient* client);

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_TRAINER_H_
