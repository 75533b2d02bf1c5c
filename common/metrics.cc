#include "common/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace segps {
namespace {

class Endpoint final : public MetricsEndpoint {
 public:
  Endpoint(std::unique_ptr<prometheus::Exposer> exposer, std::string host)
      : exposer_(std::move(exposer)), host_(std::move(host)), registry_(std::make_shared<prometheus::Registry>()) {
    exposer_->RegisterCollectable(registry_);
  }
  prometheus::Registry& registry() override { return *registry_; }
  std::string address() const override {
    const auto ports = exposer_->GetListeningPorts();
    return absl::StrCat(host_, ":", ports.empty() ? 0 : ports.front());
  }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string host_;
  std::shared_ptr<prometheus::Registry> registry_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", listen, "': expected HOST:PORT"));
  }
  try {
    // civetweb takes "host:port"; one thread is plenty for scrapes.
    auto exposer = std::make_unique<prometheus::Exposer>(listen, 1);
    return std::unique_ptr<MetricsEndpoint>(new Endpoint(std::move(exposer), listen.substr(0, colon)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 10};
}

}  // namespace segps
