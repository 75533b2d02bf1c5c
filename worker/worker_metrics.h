// A worker's Prometheus metrics: progress, loss and accuracy, throughput,
// staleness, time blocked, pull and push latency and bytes.
//
// Thread safety: every method may be called from any thread.
#ifndef SEGPS_WORKER_WORKER_METRICS_H_
#define SEGPS_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace segps {

class WorkerMetrics {
 public:
  WorkerMetrics(prometheus::Registry& registry, const std::string& segment);

  void SetRank(uint32_t rank) { rank_->Set(rank); }
  // One training step: its batch's mean loss and accuracy, its rows, the
  // clocks its parameters lagged behind it, and the worker's clock after it.
  void ObserveStep(double loss, double accuracy, uint64_t rows, uint64_t staleness, uint64_t clock);
  void SetSamplesPerSecond(double rate) { samples_per_second_->Set(rate); }
  // Balanced training: the samples this worker computes per clock, and its
  // compute throughput (waits excluded), which its share follows.
  void SetShare(uint32_t samples) { share_->Set(samples); }
  void SetComputeSamplesPerSecond(double rate) { compute_samples_per_second_->Set(rate); }
  void ObserveBlocked(double seconds) { blocked_seconds_->Increment(seconds); }
  void ObservePull(double seconds, uint64_t bytes);
  void ObservePush(double seconds, uint64_t bytes);

 private:
  prometheus::Gauge* rank_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* accuracy_;
  prometheus::Gauge* clock_;
  prometheus::Gauge* samples_per_second_;
  prometheus::Gauge* share_;
  prometheus::Gauge* compute_samples_per_second_;
  prometheus::Counter* steps_;
  prometheus::Counter* samples_;
  prometheus::Counter* blocked_seconds_;
  prometheus::Counter* pull_bytes_;
  prometheus::Counter* push_bytes_;
  prometheus::Histogram* staleness_;
  prometheus::Histogram* pull_seconds_;
  prometheus::Histogram* push_seconds_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_WORKER_METRICS_H_
