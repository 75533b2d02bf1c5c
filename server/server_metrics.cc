#include "server/server_metrics.h"

#include <string>

#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace segps {

ServerMetrics::ServerMetrics(prometheus::Registry& registry, const v1::JobConfig& config, uint32_t server_index)
    : server_(std::to_string(server_index)) {
  using prometheus::BuildCounter;
  using prometheus::BuildHistogram;
  auto& pulls = BuildCounter().Name("segps_server_pulls_total").Help("Pulls answered").Register(registry);
  auto& pushes = BuildCounter().Name("segps_server_pushes_total").Help("Pushes applied or acknowledged").Register(registry);
  auto& pull_bytes = BuildCounter().Name("segps_server_pull_bytes_total").Help("Parameter bytes sent in pulls").Register(registry);
  auto& push_bytes = BuildCounter().Name("segps_server_push_bytes_total").Help("Gradient bytes received in pushes").Register(registry);
  auto& blocked = BuildCounter()
                      .Name("segps_server_staleness_blocked_seconds_total")
                      .Help("Time pulls waited on the staleness bound")
                      .Register(registry);
  auto& rejected = BuildCounter().Name("segps_server_rejected_total").Help("Requests rejected as invalid").Register(registry);
  auto& pull_latency =
      BuildHistogram().Name("segps_server_pull_seconds").Help("Pull handling time, waiting included").Register(registry);
  auto& push_latency = BuildHistogram().Name("segps_server_push_seconds").Help("Push handling time").Register(registry);
  auto& apply = BuildHistogram()
                    .Name("segps_server_optimizer_apply_seconds")
                    .Help("Time to apply one gradient to this server's range")
                    .Register(registry);
  auto& staleness = BuildHistogram()
                        .Name("segps_server_observed_staleness_clocks")
                        .Help("Clocks a pulling worker was ahead of the values it received")
                        .Register(registry);
  worker_clock_ = &prometheus::BuildGauge()
                       .Name("segps_server_worker_clock")
                       .Help("Next clock this server expects from each worker")
                       .Register(registry);
  auto& rows_pulled = BuildCounter()
                          .Name("segps_server_embedding_rows_pulled_total")
                          .Help("Embedding rows read by pulls")
                          .Register(registry);
  auto& rows_pushed = BuildCounter()
                          .Name("segps_server_embedding_rows_pushed_total")
                          .Help("Embedding rows updated by pushes")
                          .Register(registry);
  auto& rows_held = prometheus::BuildGauge()
                        .Name("segps_server_embedding_rows")
                        .Help("Embedding rows this server stores (touched)")
                        .Register(registry);
  auto& rows_bytes = prometheus::BuildGauge()
                         .Name("segps_server_embedding_bytes")
                         .Help("Bytes of the stored embedding rows' values and optimizer state")
                         .Register(registry);
  listener_restarts_ = &BuildCounter()
                            .Name("segps_server_listener_restarts_total")
                            .Help("Times the listener was started again after gRPC abandoned it (out of file "
                                  "descriptors)")
                            .Register(registry)
                            .Add({{"server", server_}});
  backup_reachable_ = &prometheus::BuildGauge()
                           .Name("segps_server_backup_reachable")
                           .Help("cluster.replicas: 1 while the server's link to a backup takes its records, 0 while "
                                 "the backup is unreachable and pushes to the server's ranges wait for it")
                           .Register(registry);
  taken_over_ = &prometheus::BuildGauge()
                     .Name("segps_server_serving_taken_over")
                     .Help("cluster.replicas: 1 while the server serves a lost primary's ranges it took over, with "
                           "one copy fewer, 0 once they are handed back")
                     .Register(registry);
  const prometheus::Histogram::BucketBoundaries staleness_buckets = {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64};
  for (const auto& seg : config.model().segments()) {
    const prometheus::Labels labels = {{"segment", seg.name()}, {"server", server_}};
    names_.push_back(seg.name());
    segments_.push_back({&pulls.Add(labels), &pushes.Add(labels), &pull_bytes.Add(labels), &push_bytes.Add(labels),
                         &blocked.Add(labels), &rejected.Add(labels), &pull_latency.Add(labels, LatencyBuckets()),
                         &push_latency.Add(labels, LatencyBuckets()), &apply.Add(labels, LatencyBuckets()),
                         &staleness.Add(labels, staleness_buckets)});
    rows_.push_back(seg.embeddings_size() == 0 ? Rows{}
                                               : Rows{&rows_pulled.Add(labels), &rows_pushed.Add(labels),
                                                      &rows_held.Add(labels), &rows_bytes.Add(labels)});
  }
}

void ServerMetrics::ObservePull(int segment, double seconds, uint64_t bytes, uint64_t staleness,
                                double blocked_seconds) {
  PerSegment& s = segments_[segment];
  s.pulls->Increment();
  s.pull_bytes->Increment(static_cast<double>(bytes));
  s.pull_latency->Observe(seconds);
  s.staleness->Observe(static_cast<double>(staleness));
  s.blocked_seconds->Increment(blocked_seconds);
}

void ServerMetrics::ObservePush(int segment, double seconds, uint64_t bytes, bool applied, double apply_seconds) {
  PerSegment& s = segments_[segment];
  s.pushes->Increment();
  s.push_bytes->Increment(static_cast<double>(bytes));
  s.push_latency->Observe(seconds);
  if (applied) s.apply_seconds->Observe(apply_seconds);
}

void ServerMetrics::ObserveWorkerClock(int segment, uint32_t rank, uint64_t next_clock) {
  worker_clock_->Add({{"segment", names_[segment]}, {"rank", std::to_string(rank)}, {"server", server_}})
      .Set(static_cast<double>(next_clock));
}

void ServerMetrics::ObserveRowsPulled(int segment, uint64_t rows) {
  if (rows_[segment].pulled != nullptr) rows_[segment].pulled->Increment(static_cast<double>(rows));
}

void ServerMetrics::ObserveRowsPushed(int segment, uint64_t rows, uint64_t held, uint64_t bytes) {
  const Rows& r = rows_[segment];
  if (r.pushed == nullptr) return;
  r.pushed->Increment(static_cast<double>(rows));
  r.held->Set(static_cast<double>(held));
  r.bytes->Set(static_cast<double>(bytes));
}

void ServerMetrics::ObserveListenerRestart() { listener_restarts_->Increment(); }

void ServerMetrics::ObserveBackup(uint32_t backup, bool reachable) {
  backup_reachable_->Add({{"server", server_}, {"backup", std::to_string(backup)}}).Set(reachable ? 1 : 0);
}

void ServerMetrics::ObserveTakenOver(uint32_t primary, bool serving) {
  taken_over_->Add({{"server", server_}, {"primary", std::to_string(primary)}}).Set(serving ? 1 : 0);
}

void ServerMetrics::ObserveRejected(int segment) {
  if (segment >= 0 && static_cast<size_t>(segment) < segments_.size()) segments_[segment].rejected->Increment();
}

}  // namespace segps
