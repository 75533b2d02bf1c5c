#include "worker/client/async_client.h"

#include <utility>

#include "absl/time/clock.h"

namespace segps {

AsyncClient::AsyncClient(ParameterClient* client, int segment, uint32_t max_pushes, CallObserver* metrics,
                         uint64_t pull_bytes, uint64_t push_bytes)
    : client_(client), segment_(segment), max_pushes_(max_pushes), metrics_(metrics), pull_bytes_(pull_bytes),
      push_bytes_(push_bytes) {}

AsyncClient::~AsyncClient() {
  MutexLock lock(&mu_);
  while (calls_ > 0) changed_.Wait(&mu_);
}

void AsyncClient::Ended(bool push, const absl::Status& status) {
  MutexLock lock(&mu_);
  --calls_;
  if (push) {
    --pushes_;
    if (!status.ok() && error_.ok()) error_ = status;
  }
  changed_.SignalAll();
}

Completion<PulledAt> AsyncClient::StartPull(uint64_t clock, absl::Span<float> dest) {
  {
    MutexLock lock(&mu_);
    ++calls_;
  }
  const absl::Time start = absl::Now();
  Completion<PulledAt> pulled = client_->StartPull(segment_, clock, dest);
  pulled.OnDone([this, start](const PulledAt& r) {
    if (metrics_ != nullptr && r.ok()) metrics_->ObservePull(absl::ToDoubleSeconds(absl::Now() - start), pull_bytes_);
    Ended(false, r.status());
  });
  return pulled;
}

PulledAt AsyncClient::Pull(uint64_t clock, absl::Span<float> dest) {
  const absl::Time start = absl::Now();
  PulledAt result = client_->Pull(segment_, clock, dest);
  if (metrics_ != nullptr && result.ok()) metrics_->ObservePull(absl::ToDoubleSeconds(absl::Now() - start), pull_bytes_);
  return result;
}

absl::Status AsyncClient::StartPush(std::shared_ptr<const EncodedPush> push) {
  const uint64_t clock = push->clock;
  {
    MutexLock lock(&mu_);
    while (!HasRoom()) changed_.Wait(&mu_);
    unacknowledged_[clock] = push;  // sent or not, it is not acknowledged
    if (!error_.ok()) return error_;
    ++pushes_;
    ++calls_;
  }
  const absl::Time start = absl::Now();
  client_->StartSend(std::move(push)).OnDone([this, start, clock](const absl::Status& status) {
    if (metrics_ != nullptr && status.ok()) {
      metrics_->ObservePush(absl::ToDoubleSeconds(absl::Now() - start), push_bytes_);
    }
    if (status.ok()) {
      MutexLock lock(&mu_);
      unacknowledged_.erase(clock);
    }
    Ended(true, status);
  });
  return absl::OkStatus();
}

std::vector<std::shared_ptr<const EncodedPush>> AsyncClient::Unacknowledged() {
  MutexLock lock(&mu_);
  while (calls_ > 0) changed_.Wait(&mu_);
  std::vector<std::shared_ptr<const EncodedPush>> pushes;
  for (const auto& [clock, push] : unacknowledged_) pushes.push_back(push);
  return pushes;
}

absl::Status AsyncClient::DrainPushes() {
  MutexLock lock(&mu_);
  while (error_.ok() && pushes_ > 0) changed_.Wait(&mu_);
  return error_;
}

PulledAt AsyncClient::PushAndPull(std::unique_ptr<EncodedPush> push, absl::Span<float> dest) {
  {
    MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  // The client sends it after the pushes started before it.
  const absl::Time start = absl::Now();
  PulledAt result = client_->SendAndPull(std::move(push), dest);
  if (metrics_ != nullptr && result.ok()) {
    const double took = absl::ToDoubleSeconds(absl::Now() - start);
    metrics_->ObservePush(took, push_bytes_);
    metrics_->ObservePull(took, pull_bytes_);
  }
  return result;
}

}  // namespace segps
