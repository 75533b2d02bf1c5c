// A worker's Prometheus metrics: progress, loss and accuracy, throughput,
// staleness, time blocked, pull and push latency and bytes; a pipeline
// stage's busy and waiting time and the bytes on its links.
//
// Thread safety: every method may be called from any thread.
#ifndef SEGPS_WORKER_TRAIN_WORKER_METRICS_H_
#define SEGPS_WORKER_TRAIN_WORKER_METRICS_H_

#include <cstdint>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/client/async_client.h"

namespace segps {

class WorkerMetrics final : public CallObserver {
 public:
  // `reports_loss` false: a pipeline stage before the last, which has no
  // loss or accuracy to report (the series are left out).
  WorkerMetrics(prometheus::Registry& registry, const std::string& segment, bool reports_loss = true);

  void SetRank(uint32_t rank) { rank_->Set(rank); }
  // One training step: its batch's mean loss and accuracy, its rows, the
  // clocks its parameters lagged behind it, and the worker's clock after it.
  void ObserveStep(double loss, double accuracy, uint64_t rows, uint64_t staleness, uint64_t clock);
  // The same for a pipeline stage before the last, which computes no loss.
  void ObserveStep(uint64_t rows, uint64_t staleness, uint64_t clock);
  void SetSamplesPerSecond(double rate) { samples_per_second_->Set(rate); }
  // Balanced training: the samples this worker computes per clock, and its
  // compute throughput (waits excluded), which its share follows.
  void SetShare(uint32_t samples) { share_->Set(samples); }
  void SetComputeSamplesPerSecond(double rate) { compute_samples_per_second_->Set(rate); }
  void ObserveBlocked(double seconds) { blocked_seconds_->Increment(seconds); }
  // A recovery (a server restarted, paused past the lease, unreachable; a
  // rollback): from the failure to training again, and the steps it
  // computes again.
  void ObserveRecovery(double seconds, uint64_t recomputed_steps);
  void ObservePull(double seconds, uint64_t bytes) override;
  void ObservePush(double seconds, uint64_t bytes) override;

 private:
  prometheus::Gauge* rank_;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Gauge* accuracy_ = nullptr;
  prometheus::Gauge* clock_;
  prometheus::Gauge* samples_per_second_;
  prometheus::Gauge* share_;
  prometheus::Gauge* compute_samples_per_second_;
  prometheus::Counter* steps_;
  prometheus::Counter* samples_;
  prometheus::Counter* blocked_seconds_;
  prometheus::Counter* recoveries_;
  prometheus::Counter* recovery_seconds_;
  prometheus::Counter* recomputed_steps_;
  prometheus::Counter* pull_bytes_;
  prometheus::Counter* push_bytes_;
  prometheus::Histogram* staleness_;
  prometheus::Histogram* pull_seconds_;
  prometheus::Histogram* push_seconds_;
};

// A pipeline stage's series (model.combine: CHAIN), labelled with its
// segment and stage: where its time goes and what crosses its links.
class StageMetrics {
 public:
  StageMetrics(prometheus::Registry& registry, const std::string& segment, int stage);

  enum class Neighbour { kPrevious, kNext };
  // Time in forward and backward passes (a --pass_ms or --slowdown_factor stretch included).
  void ObserveBusy(double seconds) { busy_seconds_->Increment(seconds); }
  // Time waiting for a neighbour's message: activations from the previous
  // stage, gradients from the next.
  void ObserveWaiting(Neighbour from, double seconds);
  // Activation bytes (float32 values) sent to the next stage and received
  // from the previous one; gradient bytes go the other way.
  void ObserveActivationsSent(uint64_t bytes) { activation_bytes_sent_->Increment(static_cast<double>(bytes)); }
  void ObserveActivationsReceived(uint64_t bytes) { activation_bytes_received_->Increment(static_cast<double>(bytes)); }
  void ObserveGradientsSent(uint64_t bytes) { gradient_bytes_sent_->Increment(static_cast<double>(bytes)); }
  void ObserveGradientsReceived(uint64_t bytes) { gradient_bytes_received_->Increment(static_cast<double>(bytes)); }
  // Waiting over time in the pipeline, from the end of the first clock.
  void SetIdleShare(double share) { idle_share_->Set(share); }

 private:
  prometheus::Counter* busy_seconds_;
  prometheus::Counter* waiting_previous_seconds_;
  prometheus::Counter* waiting_next_seconds_;
  prometheus::Counter* activation_bytes_sent_;
  prometheus::Counter* activation_bytes_received_;
  prometheus::Counter* gradient_bytes_sent_;
  prometheus::Counter* gradient_bytes_received_;
  prometheus::Gauge* idle_share_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_WORKER_METRICS_H_
