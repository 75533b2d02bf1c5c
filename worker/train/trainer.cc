#include "worker/train/trainer.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

#include "worker/train/batch_compute.h"
#include "worker/train/engine.h"

namespace segps {

std::string StepsComputed(const TrainReport& report) {
  return absl::StrCat(report.steps, " steps computed here (clocks ", report.first_clock, " to ", report.last_clock,
                      report.taken_over > 0 ? absl::StrCat("; ", report.taken_over, " by another process") : "",
                      report.end_at_clock.has_value()
                          ? absl::StrCat("; the servers ended the segment at clock ", *report.end_at_clock,
                                         ", the best epoch's end")
                      : report.confirmed       ? absl::StrCat("; every server applied ", report.last_clock)
                      : !report.stopped_early.empty() ? std::string("; its segment stopped early")
                                                      : std::string("; the servers' count unconfirmed"),
                      ")");
}

std::string LastEpoch(const TrainReport& report, const v1::ModelConfig& model) {
  if (report.samples == 0) return "no epoch trained here";
  return absl::StrCat("last epoch loss ", report.last_loss, " ", SecondStatName(model), " ", report.last_accuracy);
}

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
