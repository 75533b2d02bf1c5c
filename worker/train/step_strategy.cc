#include "worker/train/step_strategy.h"

#include <optional>

#include "absl/time/clock.h"
#include "common/staleness.h"
#include "common/status_macros.h"

namespace segps {
namespace {

class SynchronousRounds final : public StepStrategy {
 public:
  explicit SynchronousRounds(const StepContext& context) : StepStrategy(context) {}

  absl::StatusOr<uint64_t> Prepare(uint64_t clock, absl::Duration* blocked) override {
    if (have_.has_value() && FreshEnough(*have_, clock, context_.staleness)) return *have_;
    // The first step: a pull of its own.
    const absl::Time start = absl::Now();
    float* into = context_.pulled[0]->data();
    absl::StatusOr<uint64_t> r = context_.client->Pull(clock, absl::MakeSpan(into, params()));
    *blocked += absl::Now() - start;
    if (!r.ok()) return r.status();
    SEGPS_RETURN_IF_ERROR(Upload(into));
    have_ = *r;
    return *r;
  }

  absl::Status Finish(std::unique_ptr<EncodedPush> push, bool last, absl::Duration* blocked) override {
    if (last) return context_.client->StartPush(std::move(push));
    // Nothing computes meanwhile, so on the CPU the values land in the model itself.
    const bool device = !context_.backend->host_addressable();
    float* dest = device ? context_.pulled[0]->data() : context_.model->params();
    const absl::Time start = absl::Now();
    absl::StatusOr<uint64_t> r = context_.client->PushAndPull(std::move(push), absl::MakeSpan(dest, params()));
    *blocked += absl::Now() - start;
    if (!r.ok()) return r.status();
    if (device) SEGPS_RETURN_IF_ERROR(Upload(dest));
    have_ = *r;
    return absl::OkStatus();
  }

 private:
  std::optional<uint64_t> have_;  // the clock the model's parameters reflect
};

class PrefetchAndBoundedPushes final : public StepStrategy {
 public:
  explicit PrefetchAndBoundedPushes(const StepContext& context) : StepStrategy(context) {
    next_ = context_.client->StartPull(context_.start_clock, Into(fill_));
  }

  absl::StatusOr<uint64_t> Prepare(uint64_t clock, absl::Duration* blocked) override {
    // A pull that has landed is taken even when the parameters would do:
    // fresher values cost nothing more.
    while (!have_.has_value() || !FreshEnough(*have_, clock, context_.staleness) ||
           (next_.has_value() && next_->done())) {
      const absl::Time start = absl::Now();
      if (!next_.has_value()) next_ = context_.client->StartPull(clock, Into(fill_));
      absl::StatusOr<uint64_t> r = next_->Wait();
      next_.reset();
      *blocked += absl::Now() - start;
      if (!r.ok()) return r.status();
      // The next pull may land in the buffer just uploaded from: the copy is done first.
      SEGPS_RETURN_IF_ERROR(Upload(context_.pulled[fill_]->data()));
      have_ = *r;
      fill_ ^= 1;
      // Prefetch for the next step; the server answers once the bound allows.
      next_ = context_.client->StartPull(clock + 1, Into(fill_));
    }
    return *have_;
  }

  absl::Status Finish(std::unique_ptr<EncodedPush> push, bool, absl::Duration*) override {
    return context_.client->StartPush(std::move(push));
  }

 private:
  absl::Span<float> Into(int buffer) { return absl::MakeSpan(context_.pulled[buffer]->data(), params()); }

  std::optional<uint64_t> have_;
  int fill_ = 0;  // the buffer the outstanding pull fills
  // The outstanding pull. One left when training ends is abandoned: it may
  // wait on peers, and the server answers it or its deadline ends it.
  std::optional<Completion<absl::StatusOr<uint64_t>>> next_;
};

}  // namespace

absl::Status StepStrategy::Upload(const float* values) {
  SEGPS_RETURN_IF_ERROR(
      context_.backend->Upload(values, context_.model->params(), params() * sizeof(float)));
  return context_.backend->Synchronize();
}

std::unique_ptr<StepStrategy> StepStrategy::For(const StepContext& context) {
  if (context.staleness == 0) return std::make_unique<SynchronousRounds>(context);
  return std::make_unique<PrefetchAndBoundedPushes>(context);
}

}  // namespace segps
