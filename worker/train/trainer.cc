#include "worker/train/trainer.h"

#include <memory>

#include "worker/train/batch_compute.h"
#include "worker/train/engine.h"

namespace segps {

absl::StatusOr<TrainReport> Train(const v1::JobConfig& config, const TrainerOptions& options, const Dataset& train,
                                  Backend* backend, ParameterClient* client) {
  absl::StatusOr<std::unique_ptr<BatchCompute>> compute =
      BatchCompute::Create(config, options, train, backend, client);
  if (!compute.ok()) return compute.status();
  EngineOptions engine;
  engine.segment = options.segment;
  engine.rank = options.rank;
  engine.metrics = options.metrics;
  engine.slowdown = options.slowdown;
  return TrainingEngine(config, engine, backend, client, compute->get()).Run();
}

}  // namespace segps
