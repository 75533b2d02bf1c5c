#include "worker/client/async_client.h"

#include "absl/time/clock.h"

namespace segps {

Lane::Lane() : thread_([this] { Loop(); }) {}

Lane::~Lane() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    changed_.SignalAll();
  }
  thread_.join();
}

void Lane::Post(absl::AnyInvocable<void() &&> call) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(call));
  changed_.SignalAll();
}

void Lane::RunHere(absl::FunctionRef<void()> call) {
  {
    MutexLock lock(&mu_);
    while (busy_ || !queue_.empty()) changed_.Wait(&mu_);
    busy_ = true;
  }
  call();
  MutexLock lock(&mu_);
  busy_ = false;
  changed_.SignalAll();
}

void Lane::Loop() {
  while (true) {
    absl::AnyInvocable<void() &&> call;
    {
      MutexLock lock(&mu_);
      while (!stop_ && (busy_ || queue_.empty())) changed_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, nothing left
      while (busy_) changed_.Wait(&mu_);
      call = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::move(call)();
    MutexLock lock(&mu_);
    busy_ = false;
    changed_.SignalAll();
  }
}

AsyncClient::AsyncClient(ParameterClient* client, int segment, uint32_t max_pushes, CallObserver* metrics,
                         uint64_t pull_bytes, uint64_t push_bytes)
    : client_(client), segment_(segment), max_pushes_(max_pushes), metrics_(metrics), pull_bytes_(pull_bytes),
      push_bytes_(push_bytes) {}

Completion<absl::StatusOr<uint64_t>> AsyncClient::StartPull(uint64_t clock, absl::Span<float> dest) {
  Completion<absl::StatusOr<uint64_t>> done;
  pulls_.Post([this, clock, dest, done] {
    const absl::Time start = absl::Now();
    absl::StatusOr<uint64_t> result = client_->Pull(segment_, clock, dest);
    if (metrics_ != nullptr && result.ok()) metrics_->ObservePull(absl::ToDoubleSeconds(absl::Now() - start), pull_bytes_);
    done.Set(std::move(result));
  });
  return done;
}

absl::StatusOr<uint64_t> AsyncClient::Pull(uint64_t clock, absl::Span<float> dest) {
  absl::StatusOr<uint64_t> result;
  const absl::Time start = absl::Now();
  pulls_.RunHere([&] { result = client_->Pull(segment_, clock, dest); });
  if (metrics_ != nullptr && result.ok()) metrics_->ObservePull(absl::ToDoubleSeconds(absl::Now() - start), pull_bytes_);
  return result;
}

void AsyncClient::Acknowledge(const absl::Status& status) {
  MutexLock lock(&mu_);
  --in_flight_;
  if (!status.ok() && error_.ok()) error_ = status;
  changed_.SignalAll();
}

absl::Status AsyncClient::StartPush(std::unique_ptr<EncodedPush> push) {
  {
    MutexLock lock(&mu_);
    while (!HasRoom()) changed_.Wait(&mu_);
    if (!error_.ok()) return error_;
    ++in_flight_;
  }
  pushes_.Post([this, push = std::move(push)] {
    const absl::Time start = absl::Now();
    absl::Status status = client_->Send(*push);
    if (metrics_ != nullptr && status.ok()) metrics_->ObservePush(absl::ToDoubleSeconds(absl::Now() - start), push_bytes_);
    Acknowledge(status);
  });
  return absl::OkStatus();
}

absl::Status AsyncClient::DrainPushes() {
  MutexLock lock(&mu_);
  while (error_.ok() && in_flight_ > 0) changed_.Wait(&mu_);
  return error_;
}

absl::StatusOr<uint64_t> AsyncClient::PushAndPull(std::unique_ptr<EncodedPush> push, absl::Span<float> dest) {
  {
    MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  absl::StatusOr<uint64_t> result;
  absl::Duration took;
  pushes_.RunHere([&] {
    const absl::Time start = absl::Now();
    result = client_->SendAndPull(*push, dest);
    took = absl::Now() - start;
  });
  if (metrics_ != nullptr && result.ok()) {
    metrics_->ObservePush(absl::ToDoubleSeconds(took), push_bytes_);
    metrics_->ObservePull(absl::ToDoubleSeconds(took), pull_bytes_);
  }
  return result;
}

}  // namespace segps
