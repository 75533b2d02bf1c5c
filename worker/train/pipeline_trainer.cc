#include "worker/train/pipeline_trainer.h"

#include <memory>

#include "worker/train/engine.h"
#include "worker/train/stage_compute.h"

namespace segps {

absl::StatusOr<TrainReport> TrainStage(const v1::JobConfig& config, const StageOptions& options,
                                       const Dataset* train, Backend* backend, ParameterClient* client) {
  absl::StatusOr<std::unique_ptr<StageCompute>> compute = StageCompute::Create(config, options, train, backend);
  if (!compute.ok()) return compute.status();
  EngineOptions engine;
  engine.segment = options.stage;
  engine.rank = options.replica;
  engine.metrics = options.metrics;
  return TrainingEngine(config, engine, backend, client, compute->get()).Run();
}

}  // namespace segps
