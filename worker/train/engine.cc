#include "worker/train/engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/tensor_wire.h"
#include "worker/client/membership.h"
#include "worker/train/gradient_clip.h"

namespace segps {

TrainingEngine::TrainingEngine(const v1::JobConfig& config, const EngineOptions& options, Backend* backend,
                               ParameterClient* client, StepCompute* compute)
    : config_(config),
      options_(options),
      backend_(backend),
      client_(client),
      compute_(compute),
      staleness_(StalenessOf(config, options.segment)),
      heartbeat_period_(absl::Milliseconds(config.cluster().lease_ms()) / 3) {}

absl::Status TrainingEngine::Begin() {
  const size_t n = compute_->model()->num_params();
  for (Buffer& buffer : pulled_) {
    absl::StatusOr<Buffer> allocated = backend_->AllocateHost(n * sizeof(float));
    if (!allocated.ok()) return allocated.status();
    buffer = *std::move(allocated);
  }
  if (config_.training().has_early_stopping()) client_->SetEpochClocks(compute_->EpochClocks());
  // Servers may still be starting, or a worker of the rank still live (a
  // restarted process while its predecessor's lease runs): retried like a
  // rejoin.
  tag_ = config_.model().segments(options_.segment).name();
  absl::StatusOr<Registration> registration =
      Rejoin([&] { return Join(options_.rank, std::nullopt, false); },
             absl::Milliseconds(config_.cluster().recovery_timeout_ms()), options_.clock, tag_);
  if (!registration.ok()) return registration.status();
  rank_ = registration->rank;
  tag_ = absl::StrCat(config_.model().segments(options_.segment).name(), "/", rank_);
  SEGPS_RETURN_IF_ERROR(compute_->Start(*registration, tag_));
  heartbeat_.emplace(client_, heartbeat_period_);
  if (rewound_) {  // a stage started again: the chain went back to where every stage replays from
    SEGPS_LOG_WARNING << tag_ << ": started again mid-job; the chain replays from clock "
                      << registration->start_clock;
    SEGPS_RETURN_IF_ERROR(compute_->Rewind());
    report_.recoveries += 1;
  }
  if (options_.metrics != nullptr) options_.metrics->SetRank(rank_);
  // Top-k pushes carry k (index, value) pairs; pulls are always dense.
  if (config_.training().gradient_topk() > 0) topk_.emplace(n, config_.training().gradient_topk());
  const size_t element_bytes = DTypeBytes(config_.cluster().wire_dtype());
  pull_bytes_ = n * element_bytes;
  push_bytes_ = topk_ ? topk_->k() * (sizeof(uint32_t) + element_bytes) : pull_bytes_;
  step_context_.backend = backend_;
  step_context_.model = compute_->model();
  step_context_.pulled[0] = &pulled_[0];
  step_context_.pulled[1] = &pulled_[1];
  step_context_.staleness = staleness_;
  Connect(registration->start_clock);
  return absl::OkStatus();
}

void TrainingEngine::Connect(uint64_t at) {
  strategy_.reset();
  async_ = std::make_unique<AsyncClient>(client_, options_.segment, PushesInFlight(config_, options_.segment),
                                         options_.metrics, pull_bytes_, push_bytes_);
  step_context_.client = async_.get();
  step_context_.start_clock = at;
  strategy_ = StepStrategy::For(step_context_);
}

void TrainingEngine::CountBlocked(absl::Duration waited) {
  blocked_ += waited;
  step_blocked_ += waited;
  if (options_.metrics != nullptr) options_.metrics->ObserveBlocked(absl::ToDoubleSeconds(waited));
}

std::unique_ptr<EncodedPush> TrainingEngine::Encode(uint64_t clock, const StepResult& result) {
  const size_t n = compute_->model()->num_params();
  absl::Span<const float> grad(result.grad, n);
  if (ClipsGradient(config_.optimizer())) {  // on a copy: the model's gradient buffer stays as computed
    clipped_.assign(grad.begin(), grad.end());
    ClipGradient(config_.optimizer(), absl::MakeSpan(clipped_));
    grad = clipped_;
  }
  std::unique_ptr<EncodedPush> push;
  if (topk_) {
    topk_->Select(grad);
    push = client_->EncodeSparse(options_.segment, clock, topk_->indices(), topk_->values());
  } else {
    push = client_->Encode(options_.segment, clock, grad);
  }
  if (result.rows_pulled != nullptr) {
    client_->EncodeRows(push.get(), result.rows_pulled->ids(), result.rows_pulled->gradients());
  }
  if (result.samples_per_second.has_value()) {
    push->samples = result.rows;
    push->samples_per_second = *result.samples_per_second;
  }
  return push;
}

absl::Status TrainingEngine::Step(uint64_t clock, Failure* failure) {
  step_blocked_ = absl::ZeroDuration();
  absl::Duration waited;
  absl::StatusOr<uint64_t> have = strategy_->Prepare(clock, &waited);
  CountBlocked(waited);
  if (!have.ok()) {
    failure->servers = true;
    return have.status();
  }
  // A step computed before a failure and not yet taken by every server is
  // sent again as it was (a pipeline stage cannot compute it again).
  if (!unsent_.has_value() || unsent_->clock != clock) {
    unsent_.reset();
    if (absl::Status fetched = compute_->Fetch(clock); !fetched.ok()) {
      failure->servers = true;
      return fetched;
    }
    absl::StatusOr<StepResult> result = compute_->Compute(clock);
    if (!result.ok()) return result.status();
    unsent_ = Unsent{clock, *std::move(result), clock - std::min(clock, *have)};
  }
  sent_through_ = std::max(sent_through_, clock + 1);
  waited = absl::ZeroDuration();
  absl::Status sent = strategy_->Finish(Encode(clock, unsent_->result), compute_->IsLast(clock), &waited);
  CountBlocked(waited);
  if (!sent.ok()) {
    failure->servers = true;
    return sent;
  }
  if (options_.slowdown > absl::ZeroDuration()) absl::SleepFor(options_.slowdown);
  return Done();
}

absl::Status TrainingEngine::Done() {
  const Unsent step = *unsent_;
  unsent_.reset();
  recoveries_in_a_row_ = 0;
  const StepResult& result = step.result;
  if (options_.metrics != nullptr && result.stats.has_value() && result.rows > 0) {
    const double rows = result.rows;
    options_.metrics->ObserveStep(result.stats->loss_sum / rows, result.stats->correct / rows, result.rows, step.lag,
                                  step.clock + 1);
  } else if (options_.metrics != nullptr && !result.stats.has_value()) {
    options_.metrics->ObserveStep(result.rows, step.lag, step.clock + 1);
  }
  staleness_sum_ += static_cast<double>(step.lag);
  report_.max_staleness = std::max(report_.max_staleness, step.lag);
  StepRecord record;
  record.clock = step.clock;
  record.index = report_.steps;
  record.result = &result;
  record.lag = step.lag;
  record.blocked = step_blocked_;
  report_.steps += 1;
  report_.samples += result.rows;
  return compute_->Record(record, &report_);
}

absl::StatusOr<Registration> TrainingEngine::Join(std::optional<uint32_t> rank, std::optional<uint64_t> at,
                                                  bool link_failed) {
  rewound_ = false;
  absl::StatusOr<Registration> joined = client_->Register(options_.segment, rank);
  if (!joined.ok() || !compute_->Chained()) return joined;
  // A stage continues where it is only if its links hold, its segment was
  // not rolled back meanwhile (its lane's other stages replay the steps the
  // rollback undid, so it replays with them) and the servers continue there
  // too (or just after its step that every server took).
  const bool rolled_back = joined->generations != generations_;
  generations_ = joined->generations;
  const bool continues =
      at.has_value() ? !link_failed && !rolled_back &&
                           (joined->start_clock == *at ||
                            (unsent_.has_value() && joined->start_clock == unsent_->clock + 1))
                     : !(joined->known && joined->start_clock > 0);  // not a stage started again
  if (continues) return joined;
  for (int attempt = 0; attempt < 4; ++attempt) {
    // Every stage of its lane at this clock, none of it applied: the lane replays it.
    if (joined->lane_clock == joined->start_clock) {
      rewound_ = true;
      return joined;
    }
    if (joined->chain_checkpoint_clocks.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          tag_, ": the chain cannot replay from a clock every stage holds: the servers have no checkpoint of "
                "every stage yet (checkpoint.every_clocks) or keep none (--checkpoint_dir)"));
    }
    const uint64_t target = joined->chain_checkpoint_clocks.back();
    SEGPS_LOG_WARNING << tag_ << ": its lane's stages are at different clocks; rolling the chain back to clock "
                      << target << ", the newest checkpoint of every stage";
    SEGPS_RETURN_IF_ERROR(client_->RollBackChain(options_.segment, target));
    joined = client_->Register(options_.segment, joined->rank);  // the rollback dropped the registration
    if (!joined.ok()) return joined;
    generations_ = joined->generations;
  }
  return absl::UnavailableError(
      absl::StrCat(tag_, ": the chain kept moving while rolling it back; its stages keep failing"));
}

absl::StatusOr<uint64_t> TrainingEngine::Recover(const Failure& failure, uint64_t at) {
  const absl::Time since = absl::Now();
  // What is in flight fails or is abandoned; the calls and the heartbeat
  // stop first. The pushes not every server acknowledged are kept.
  strategy_.reset();
  std::vector<std::shared_ptr<const EncodedPush>> held;
  if (async_ != nullptr) held = async_->Unacknowledged();
  async_.reset();
  heartbeat_.reset();
  if (++recoveries_in_a_row_ > kMaxRecoveriesInARow) {
    return absl::Status(failure.status.code(), absl::StrCat(tag_, ": ", kMaxRecoveriesInARow,
                                                            " recoveries in a row without a step done; at clock ",
                                                            at, ": ", failure.status.message()));
  }
  // An ensemble worker's steps in hand (its unsent step, its pushes not
  // acknowledged) are sent again where servers differ only on them.
  if (unsent_.has_value()) {
    held.erase(std::remove_if(held.begin(), held.end(), [&](const auto& p) { return p->clock >= unsent_->clock; }),
               held.end());
  }
  if (!compute_->Chained()) client_->HoldSteps(Held(held));
  absl::StatusOr<Registration> again =
      Rejoin([&] { return Join(rank_, at, IsLinkFailure(failure.status)); },
             absl::Milliseconds(config_.cluster().recovery_timeout_ms()), options_.clock, tag_);
  if (!again.ok()) {
    return absl::Status(again.status().code(), absl::StrCat(again.status().message(), " (it failed at clock ", at,
                                                            ": ", failure.status.message(), ")"));
  }
  const uint64_t resume = again->start_clock;
  // The pushes held from there on go again as they were, where they start
  // there (none missing); training continues after them.
  held.erase(held.begin(), std::find_if(held.begin(), held.end(), [&](const auto& p) { return p->clock >= resume; }));
  if (rewound_ || compute_->Chained() || held.empty() || held.front()->clock != resume) held.clear();
  const uint64_t next = held.empty() ? resume : held.back()->clock + 1;
  if (resume > sent_through_) {
    // Its rank went on without it (another process held the rank while it was away).
    SEGPS_LOG_WARNING << tag_ << ": the servers continue at clock " << resume << ", ahead of the " << sent_through_
                      << " steps this process sent: " << resume - sent_through_
                      << " steps of its rank were computed by another process";
    report_.taken_over += resume - sent_through_;
    sent_through_ = resume;
  }
  // Renewing the lease while a stage waits for a neighbour to start again.
  heartbeat_.emplace(client_, heartbeat_period_);
  if (rewound_) {
    unsent_.reset();  // the lane replays from its clean cut, or the chain from a checkpoint
    SEGPS_RETURN_IF_ERROR(compute_->Rewind());
  } else if (!compute_->Chained() && !(unsent_.has_value() && next >= unsent_->clock &&
                                        next <= unsent_->clock + 1)) {
    unsent_.reset();  // computed again from where the servers continue
  } else if (unsent_.has_value() && next == unsent_->clock + 1) {
    SEGPS_RETURN_IF_ERROR(Done());  // every server had taken it after all
  }  // else it continues at its clock: it sends its unsent step again as it was (a server that
     // took it acknowledges it; one that lost it with a failure applies it)
  // One line a recovery: what failed, where training continues, what it cost.
  const absl::Duration took = absl::Now() - since;
  const uint64_t again_steps = next < at ? at - next : 0;
  SEGPS_LOG_WARNING << tag_ << ": rejoined at clock " << resume << " after " << absl::FormatDuration(took)
                    << (held.empty() ? std::string()
                                     : absl::StrCat("; its pushes of steps ", resume, " to ", next - 1,
                                                    " are sent again as they were"))
                    << (again_steps > 0 ? absl::StrCat("; ", again_steps, " steps are computed again") : std::string())
                    << " (at clock " << at << ": " << failure.status.message() << ")";
  if (options_.metrics != nullptr) options_.metrics->ObserveRecovery(absl::ToDoubleSeconds(took), again_steps);
  report_.recoveries += 1;
  Connect(next);
  // A push that fails again is held again: the next step's call reports it.
  for (std::shared_ptr<const EncodedPush>& push : held) (void)async_->StartPush(std::move(push));
  return next;
}

std::optional<HeldSteps> TrainingEngine::Held(const std::vector<std::shared_ptr<const EncodedPush>>& pushes) const {
  if (pushes.empty() && !unsent_.has_value()) return std::nullopt;
  HeldSteps held;
  held.first = pushes.empty() ? unsent_->clock : pushes.front()->clock;
  held.last = unsent_.has_value() ? unsent_->clock : pushes.back()->clock;
  return held;
}

absl::StatusOr<TrainReport> TrainingEngine::Run() {
  SEGPS_RETURN_IF_ERROR(Begin());
  const absl::Time t0 = absl::Now();
  uint64_t clock = step_context_.start_clock;
  report_.first_clock = sent_through_ = clock;
  while (true) {
    Failure failure;
    // A step to send again has its data (a stage's micro-batches) already.
    absl::StatusOr<bool> more = unsent_.has_value() && unsent_->clock == clock ? true : compute_->HasStep(clock);
    if (!more.ok()) {
      failure.status = more.status();
    } else if (*more) {
      failure.status = Step(clock, &failure);
      if (failure.status.ok()) {
        ++clock;
        if (report_.end_at_clock.has_value()) break;  // early stopping, decided here
        continue;
      }
    } else {
      failure.status = strategy_->Drain();
      failure.servers = true;
      if (failure.status.ok()) break;
    }
    const bool recovers = (failure.servers && Recoverable(failure.status)) || IsLinkFailure(failure.status);
    absl::StatusOr<uint64_t> resume = recovers ? Recover(failure, clock) : failure.status;
    if ((failure.servers || recovers) && absl::IsOutOfRange(resume.status())) {  // its rank 0 stopped it early
      report_.stopped_early =
          "its segment stopped early (its rank 0 ended it at the best epoch's checkpoint), so it stops too";
      SEGPS_LOG_WARNING << tag_ << ": " << report_.stopped_early;
      break;
    }
    if (!resume.ok()) return resume.status();
    clock = *resume;
  }
  report_.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  report_.blocked_seconds = absl::ToDoubleSeconds(blocked_);
  report_.mean_staleness = report_.steps ? staleness_sum_ / report_.steps : 0;
  report_.history.set_segment(config_.model().segments(options_.segment).name());
  report_.history.set_rank(rank_);
  report_.last_clock = clock;
  SEGPS_RETURN_IF_ERROR(compute_->Complete(&report_));
  if (report_.end_at_clock.has_value()) {
    SEGPS_RETURN_IF_ERROR(EndSegment());
  } else if (report_.stopped_early.empty()) {
    SEGPS_RETURN_IF_ERROR(Leave());
  }
  return report_;
}

absl::Status TrainingEngine::EndSegment() {
  // The best epoch's cut may still wait for a peer behind it (staleness):
  // a server that has not cut it yet answers UNAVAILABLE, and so does one
  // restarting; others that ended the segment already answer again alike.
  const absl::Duration timeout = absl::Milliseconds(config_.cluster().recovery_timeout_ms());
  const absl::Time since = options_.clock->Now();
  while (true) {
    absl::StatusOr<std::vector<uint64_t>> ended = client_->Leave(report_.end_at_clock);
    if (ended.ok()) break;
    if (!absl::IsUnavailable(ended.status()) || options_.clock->Now() - since > timeout) {
      return absl::Status(ended.status().code(),
                          absl::StrCat(tag_, ": ending the segment at clock ", *report_.end_at_clock,
                                       " (early stopping): ", ended.status().message()));
    }
    options_.clock->SleepFor(absl::Milliseconds(50));
  }
  SEGPS_LOG_INFO << tag_ << ": every server ended the segment at its checkpoint of clock " << *report_.end_at_clock;
  report_.confirmed = true;
  return absl::OkStatus();
}

absl::Status TrainingEngine::Leave() {
  // Leaving also ends an outstanding prefetch that waits on peers.
  absl::StatusOr<std::vector<uint64_t>> applied = client_->Leave(std::nullopt);
  if (!applied.ok()) {  // a server restarting as the job ends: what it holds is its own to check
    SEGPS_LOG_WARNING << tag_ << ": leave: " << applied.status().message()
                      << " (the servers' count of this rank's steps is unconfirmed)";
    return absl::OkStatus();
  }
  for (size_t i = 0; i < applied->size(); ++i) {
    if ((*applied)[i] != report_.last_clock) {
      return absl::DataLossError(absl::StrCat(tag_, ": server ", i, " applied ", (*applied)[i],
                                              " steps of this rank, but its schedule ended at clock ",
                                              report_.last_clock, "; the model is not what the schedule trains"));
    }
  }
  report_.confirmed = true;
  return absl::OkStatus();
}

}  // namespace segps
