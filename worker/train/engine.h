// The training engine: one loop for every kind of worker. Per clock it
// brings the model's parameters (the exchange with the servers, by the
// staleness bound: step_strategy.h), has its StepCompute compute the
// step's gradient (an ensemble worker's batch or a pipeline stage's
// micro-batches), encodes and sends it, and hands the step to the compute
// for its progress. Failures the servers cause (a restart, a pause past the
// lease, a rollback) are recovered by registering again and continuing
// where the servers agree (client/membership.h). A pipeline stage continues
// where it is when it can: a step it computed that not every server took
// is sent again as it was. Where it cannot (it started again, a link to a
// neighbour broke, the servers went back), it rolls the whole chain back
// to the newest clock every stage's segment holds a checkpoint of
// (RollbackRequest.chain), and every stage replays from there.
//
// Thread safety: Run is called once, from one thread; the engine's helpers
// (the heartbeat, the client's calls in flight) are its own.
#ifndef SEGPS_WORKER_TRAIN_ENGINE_H_
#define SEGPS_WORKER_TRAIN_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "segps/v1/config.pb.h"
#include "worker/client/async_client.h"
#include "worker/client/heartbeat_loop.h"
#include "worker/client/ps_client.h"
#include "worker/client/topk.h"
#include "worker/model/backend.h"
#include "worker/train/step_compute.h"
#include "worker/train/step_strategy.h"
#include "worker/train/trainer.h"
#include "worker/train/worker_metrics.h"

namespace segps {

struct EngineOptions {
  int segment = 0;
  // Unset: the servers assign the lowest free rank.
  std::optional<uint32_t> rank = 0;
  WorkerMetrics* metrics = nullptr;  // may be null
  // Extra time per step, to play a straggler in staleness experiments.
  absl::Duration slowdown;
  // Time for the recovery's backoff and budget.
  Clock* clock = Clock::Real();
};

class TrainingEngine {
 public:
  // Everything passed outlives the engine; `client` is not yet registered.
  TrainingEngine(const v1::JobConfig& config, const EngineOptions& options, Backend* backend,
                 ParameterClient* client, StepCompute* compute);
  TrainingEngine(const TrainingEngine&) = delete;
  TrainingEngine& operator=(const TrainingEngine&) = delete;

  // Registers, trains every step, leaves the servers.
  absl::StatusOr<TrainReport> Run();

 private:
  // Where a step failed: in the exchange with the servers, or elsewhere.
  struct Failure {
    absl::Status status;
    bool servers = false;
  };
  // A step computed whose push not every server has acknowledged yet.
  struct Unsent {
    uint64_t clock = 0;
    StepResult result;  // its gradient stays valid until the next Compute
    uint64_t lag = 0;
  };
  absl::Status Begin();
  // Makes the client's calls in flight and the strategy afresh, from clock `at`.
  void Connect(uint64_t at);
  absl::Status Step(uint64_t clock, Failure* failure);
  // The unsent step is acknowledged by every server: its metrics, report and record.
  absl::Status Done();
  std::unique_ptr<EncodedPush> Encode(uint64_t clock, const StepResult& result);
  // Registers (again after a failure at `at`; first when nullopt) and,
  // for a pipeline stage that cannot continue where it is, rolls the
  // chain back (rewound_).
  absl::StatusOr<Registration> Join(std::optional<uint32_t> rank, std::optional<uint64_t> at, bool link_failed);
  // Registers again after `failure` at `at`; the clock to continue at.
  absl::StatusOr<uint64_t> Recover(const Failure& failure, uint64_t at);
  // The steps whose pushes this worker holds: `pushes` (not acknowledged
  // by every server, in clock order) and the unsent step, if any.
  std::optional<HeldSteps> Held(const std::vector<std::shared_ptr<const EncodedPush>>& pushes) const;
  void CountBlocked(absl::Duration waited);
  // Leaves the servers, checking that each applied the schedule's steps of this rank.
  absl::Status Leave();
  // Early stopping, decided here: every server ends the segment at the
  // best epoch's checkpoint (report_.end_at_clock).
  absl::Status EndSegment();

  const v1::JobConfig& config_;
  const EngineOptions options_;
  Backend* const backend_;
  ParameterClient* const client_;
  StepCompute* const compute_;
  const int32_t staleness_;
  const absl::Duration heartbeat_period_;

  uint32_t rank_ = 0;
  std::string tag_;
  // Two pinned host buffers a pull fills (one while the other uploads).
  Buffer pulled_[2];
  std::optional<TopK> topk_;  // top-k pushes (training.gradient_topk)
  std::vector<float> clipped_;  // the gradient clipped (optimizer.clip_value, clip_gradient_norm)
  uint64_t pull_bytes_ = 0, push_bytes_ = 0;
  StepContext step_context_;
  // The calls in flight and how steps make them; made again after a recovery.
  std::unique_ptr<AsyncClient> async_;
  std::unique_ptr<StepStrategy> strategy_;
  std::optional<HeartbeatLoop> heartbeat_;

  std::optional<Unsent> unsent_;
  bool rewound_ = false;  // the last Join rolled the chain back (or found it rolled back)
  std::vector<uint64_t> generations_;  // the segment's generations at the last Join
  // A chain whose stages keep failing recovers this often, then gives up.
  static constexpr int kMaxRecoveriesInARow = 20;
  int recoveries_in_a_row_ = 0;
  uint64_t sent_through_ = 0;  // the clock after the last step this process computed and sent
  TrainReport report_;
  absl::Duration blocked_, step_blocked_;
  double staleness_sum_ = 0;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_ENGINE_H_
