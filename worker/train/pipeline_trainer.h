// The training loop of one pipeline stage (combine: CHAIN): replica r of
// stage k. Each clock is one mini-batch of stage 0's data slice, cut into
// micro-batches; the stage runs their forwards and backwards in the
// configured schedule (GPIPE or ONE_F_ONE_B), passing activations forward
// and their gradients back over its links (pipeline_link.h), adds up the
// micro-batches' parameter gradients, and pushes their sum once per clock
// to the servers, pulling the next clock's parameters under the stage's
// staleness bound: the training engine (engine.h) over the stage's
// micro-batches (stage_compute.h). The parameters stay the same between a
// micro-batch's forward and its backward, whatever the schedule. A failure
// of the servers or of a link is recovered on the engine: where the stage
// cannot continue at its clock, its lane replays from a clean cut or the
// whole chain from a checkpoint every stage holds (docs/recovery.md).
#ifndef SEGPS_WORKER_TRAIN_PIPELINE_TRAINER_H_
#define SEGPS_WORKER_TRAIN_PIPELINE_TRAINER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "segps/v1/config.pb.h"
#include "worker/model/backend.h"
#include "worker/data/dataset.h"
#include "worker/train/pipeline_link.h"
#include "worker/client/ps_client.h"
#include "worker/train/trainer.h"
#include "worker/train/worker_metrics.h"

namespace segps {

struct StageOptions {
  int stage = 0;
  uint32_t replica = 0;
  // The link from the previous stage (null for stage 0) and to the next
  // (null for the last); both outlive the training.
  Upstream* upstream = nullptr;
  Downstream* downstream = nullptr;
  // How long a stage waits for a neighbour's next message.
  absl::Duration patience = absl::Minutes(5);
  // Stretches each forward and backward pass's compute time by this
  // factor (>= 1): a slower device (segps-worker --slowdown_factor).
  double slowdown_factor = 1;
  // Pads each forward pass to at least this long and each backward pass to
  // twice it, after any stretch: a device of fixed speed, whose stages all
  // take the same time, as GPipe's bubble formula assumes (--pass_ms).
  absl::Duration pass_time;
  // Where to report progress and the stage's own series (both may be null).
  WorkerMetrics* metrics = nullptr;
  StageMetrics* stage_metrics = nullptr;
  // The last stage (one replica) with training.test_every_epoch or
  // data.validation_fraction: the test set, the validation set (either may
  // be null), and a client of no registration that reads every stage's
  // parameters as each epoch ends, to score the whole chain on them. All
  // outlive the training.
  const Dataset* test = nullptr;
  const Dataset* validation = nullptr;
  ParameterClient* reader = nullptr;
};

// Trains the stage through `client` (not yet registered). `train` is read
// by stage 0 only (the others may pass null). Besides the usual report, the
// stage's idle share and peak resident memory are logged: the idle share is
// its time waiting for its neighbours over its time in the pipeline, from
// the end of its first clock on (which also waits for the others to start).
absl::StatusOr<TrainReport> TrainStage(const v1::JobConfig& config, const StageOptions& options,
                                       const Dataset* train, Backend* backend, ParameterClient* client);

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_PIPELINE_TRAINER_H_
