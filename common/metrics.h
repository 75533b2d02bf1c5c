// Prometheus metrics over HTTP: one prometheus-cpp registry
// and one endpoint per process, at http://HOST:PORT/metrics.
//
// Thread safety: prometheus-cpp metrics are safe to update from any thread.
#ifndef SEGPS_COMMON_METRICS_H_
#define SEGPS_COMMON_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace segps {

class MetricsEndpoint {
 public:
  // Serves the registry on `listen` ("host:port"; port 0 picks one). A port
  // alone (or ":port") is loopback: other hosts reach the endpoint only when
  // an address is named, e.g. "0.0.0.0:9100", and only with `insecure`
  // (--insecure: the endpoint is plaintext HTTP, and the series tell a
  // job's progress and sizes); without it such an address is refused.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen, bool insecure = false);
  virtual ~MetricsEndpoint() = default;
  virtual prometheus::Registry& registry() = 0;
  // "host:port" actually bound.
  virtual std::string address() const = 0;
};

// Latency buckets in seconds, 50 us .. 10 s.
prometheus::Histogram::BucketBoundaries LatencyBuckets();

}  // namespace segps

#endif  // SEGPS_COMMON_METRICS_H_
