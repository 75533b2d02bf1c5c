// A parameter server's Prometheus metrics. Created once per process when
// --metrics_listen is given; ParameterServer records into it.
//
// Thread safety: every Observe* may be called concurrently.
#ifndef SEGPS_SERVER_SERVER_METRICS_H_
#define SEGPS_SERVER_SERVER_METRICS_H_

#include <cstdint>
#include <vector>

#include "prometheus/registry.h"
#include "segps/v1/config.pb.h"

namespace segps {

class ServerMetrics {
 public:
  ServerMetrics(prometheus::Registry& registry, const v1::JobConfig& config, uint32_t server_index);

  // A pull answered: handler time, payload bytes, clocks the worker was ahead
  // of what the values reflect, time spent waiting on the staleness bound.
  void ObservePull(int segment, double seconds, uint64_t bytes, uint64_t staleness, double blocked_seconds);
  // A push handled; `applied` false for an acknowledged retry.
  void ObservePush(int segment, double seconds, uint64_t bytes, bool applied, double apply_seconds);
  void ObserveWorkerClock(int segment, uint32_t rank, uint64_t next_clock);
  void ObserveRejected(int segment);
  // Embedding rows read by a pull, or updated by a push after which this
  // server holds `held` rows of the segment taking `bytes` (values and optimizer state).
  void ObserveRowsPulled(int segment, uint64_t rows);
  void ObserveRowsPushed(int segment, uint64_t rows, uint64_t held, uint64_t bytes);
  // The listener was started again (server/listener_watch.h).
  void ObserveListenerRestart();
  // cluster.replicas: whether this server's link to server `backup` takes
  // its records now (server/replica_links.h).
  void ObserveBackup(uint32_t backup, bool reachable);
  // cluster.replicas: whether this server serves primary `primary`'s ranges
  // now, having taken them over (server/failover.h).
  void ObserveTakenOver(uint32_t primary, bool serving);

 private:
  struct PerSegment {
    prometheus::Counter* pulls;
    prometheus::Counter* pushes;
    prometheus::Counter* pull_bytes;
    prometheus::Counter* push_bytes;
    prometheus::Counter* blocked_seconds;
    prometheus::Counter* rejected;
    prometheus::Histogram* pull_latency;
    prometheus::Histogram* push_latency;
    prometheus::Histogram* apply_seconds;
    prometheus::Histogram* staleness;
  };
  std::vector<PerSegment> segments_;
  prometheus::Counter* listener_restarts_ = nullptr;
  std::vector<std::string> names_;
  const std::string server_;
  prometheus::Family<prometheus::Gauge>* worker_clock_;
  prometheus::Family<prometheus::Gauge>* backup_reachable_;
  prometheus::Family<prometheus::Gauge>* taken_over_;
  // Segments with embedding tables (null elsewhere).
  struct Rows {
    prometheus::Counter* pulled = nullptr;
    prometheus::Counter* pushed = nullptr;
    prometheus::Gauge* held = nullptr;
    prometheus::Gauge* bytes = nullptr;
  };
  std::vector<Rows> rows_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_SERVER_METRICS_H_
