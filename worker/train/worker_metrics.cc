#include "worker/train/worker_metrics.h"

#include "common/metrics.h"

namespace segps {

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry, const std::string& segment, bool reports_loss) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  const prometheus::Labels labels = {{"segment", segment}};
  auto gauge = [&](const char* name, const char* help) { return &BuildGauge().Name(name).Help(help).Register(registry).Add(labels); };
  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
  };
  rank_ = gauge("segps_worker_rank", "This worker's rank within its segment");
  if (reports_loss) {
    loss_ = gauge("segps_worker_training_loss", "Mean cross-entropy of the last batch");
    accuracy_ = gauge("segps_worker_training_accuracy", "Accuracy on the last batch");
  }
  clock_ = gauge("segps_worker_clock", "Steps pushed so far, as a clock");
  samples_per_second_ = gauge("segps_worker_samples_per_second", "Training throughput over the last log interval");
  share_ = gauge("segps_worker_share_samples", "Samples this worker computes per clock (training.balance: its share)");
  compute_samples_per_second_ = gauge("segps_worker_compute_samples_per_second",
                                      "Samples per second of this worker's own computing, waits excluded");
  steps_ = counter("segps_worker_steps_total", "Training steps done");
  samples_ = counter("segps_worker_samples_total", "Training samples processed");
  blocked_seconds_ = counter("segps_worker_blocked_seconds_total", "Time waiting for parameters the bound requires");
  recoveries_ = counter("segps_worker_recoveries_total", "Times this worker rejoined the servers after a failure");
  recovery_seconds_ = counter("segps_worker_recovery_seconds_total", "Time from a failure to training again");
  recomputed_steps_ = counter("segps_worker_recomputed_steps_total", "Steps computed again after a recovery");
  pull_bytes_ = counter("segps_worker_pull_bytes_total", "Parameter bytes pulled");
  push_bytes_ = counter("segps_worker_push_bytes_total", "Gradient bytes pushed");
  staleness_ = &BuildHistogram()
                    .Name("segps_worker_observed_staleness_clocks")
                    .Help("Clocks a step's parameters lagged behind the step")
                    .Register(registry)
                    .Add(labels, prometheus::Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64});
  pull_seconds_ = &BuildHistogram()
                       .Name("segps_worker_pull_seconds")
                       .Help("Pull latency, all servers, waiting included")
                       .Register(registry)
                       .Add(labels, LatencyBuckets());
  push_seconds_ = &BuildHistogram()
                       .Name("segps_worker_push_seconds")
                       .Help("Push latency, all servers")
                       .Register(registry)
                       .Add(labels, LatencyBuckets());
}

void WorkerMetrics::ObserveStep(double loss, double accuracy, uint64_t rows, uint64_t staleness, uint64_t clock) {
  if (loss_ != nullptr) {
    loss_->Set(loss);
    accuracy_->Set(accuracy);
  }
  ObserveStep(rows, staleness, clock);
}

void WorkerMetrics::ObserveRecovery(double seconds, uint64_t recomputed_steps) {
  recoveries_->Increment();
  recovery_seconds_->Increment(seconds);
  recomputed_steps_->Increment(static_cast<double>(recomputed_steps));
}

void WorkerMetrics::ObserveStep(uint64_t rows, uint64_t staleness, uint64_t clock) {
  clock_->Set(static_cast<double>(clock));
  steps_->Increment();
  samples_->Increment(static_cast<double>(rows));
  staleness_->Observe(static_cast<double>(staleness));
}

void WorkerMetrics::ObservePull(double seconds, uint64_t bytes) {
  pull_seconds_->Observe(seconds);
  pull_bytes_->Increment(static_cast<double>(bytes));
}

void WorkerMetrics::ObservePush(double seconds, uint64_t bytes) {
  push_seconds_->Observe(seconds);
  push_bytes_->Increment(static_cast<double>(bytes));
}

StageMetrics::StageMetrics(prometheus::Registry& registry, const std::string& segment, int stage) {
  const prometheus::Labels labels = {{"segment", segment}, {"stage", std::to_string(stage)}};
  auto with = [&](const char* name, const char* value) {
    prometheus::Labels more = labels;
    more.emplace(name, value);
    return more;
  };
  auto family = [&](const char* name, const char* help) -> prometheus::Family<prometheus::Counter>& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
  };
  busy_seconds_ = &family("segps_worker_stage_busy_seconds_total", "Time in forward and backward passes").Add(labels);
  auto& waiting = family("segps_worker_stage_waiting_seconds_total", "Time waiting for a neighbouring stage's message");
  waiting_previous_seconds_ = &waiting.Add(with("neighbour", "previous"));
  waiting_next_seconds_ = &waiting.Add(with("neighbour", "next"));
  auto& activations = family("segps_worker_stage_activation_bytes_total", "Activation bytes crossing this stage's links");
  activation_bytes_sent_ = &activations.Add(with("direction", "sent"));
  activation_bytes_received_ = &activations.Add(with("direction", "received"));
  auto& gradients =
      family("segps_worker_stage_gradient_bytes_total", "Activation-gradient bytes crossing this stage's links");
  gradient_bytes_sent_ = &gradients.Add(with("direction", "sent"));
  gradient_bytes_received_ = &gradients.Add(with("direction", "received"));
  idle_share_ = &prometheus::BuildGauge()
                     .Name("segps_worker_stage_idle_share")
                     .Help("Share of the time since the first clock spent waiting for neighbours")
                     .Register(registry)
                     .Add(labels);
}

void StageMetrics::ObserveWaiting(Neighbour from, double seconds) {
  (from == Neighbour::kPrevious ? waiting_previous_seconds_ : waiting_next_seconds_)->Increment(seconds);
}

}  // namespace segps
