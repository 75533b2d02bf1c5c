#include "worker/train/stage_compute.h"

#include <sys/resource.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/model/evaluator.h"

namespace segps {
namespace {

// Micro-batch m of a mini-batch of n rows cut into `count` parts: its first row and rows.
struct Part {
  uint32_t first, rows;
};
Part MicroPart(uint32_t n, uint32_t count, uint32_t m) {
  const uint64_t begin = uint64_t{m} * n / count, end = uint64_t{m + 1} * n / count;
  return {static_cast<uint32_t>(begin), static_cast<uint32_t>(end - begin)};
}

// The order of a clock's passes: (micro-batch, forward?) pairs. GPIPE runs
// every forward, then every backward; ONE_F_ONE_B runs `warmup` forwards,
// then alternates one forward and one backward, then the remaining
// backwards. Backwards go in micro-batch order in both, so both add the
// same gradients in the same order.
std::vector<std::pair<uint32_t, bool>> Passes(v1::PipelineSchedule schedule, uint32_t count, uint32_t warmup) {
  std::vector<std::pair<uint32_t, bool>> passes;
  if (schedule == v1::GPIPE) warmup = count;
  warmup = std::min(warmup, count);
  for (uint32_t m = 0; m < warmup; ++m) passes.push_back({m, true});
  for (uint32_t m = 0; m < count; ++m) {
    if (m + warmup < count) passes.push_back({m + warmup, true});
    passes.push_back({m, false});
  }
  return passes;
}

// A link's UNAVAILABLE (a neighbour died, stopped answering, or reopened
// the link as it recovered) is recovered from; its other errors end the stage.
absl::Status OnLink(absl::Status status) {
  return absl::IsUnavailable(status) ? LinkFailure(std::move(status)) : status;
}

double PeakResidentMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
}

}  // namespace

absl::StatusOr<std::unique_ptr<StageCompute>> StageCompute::Create(const v1::JobConfig& config,
                                                                   const StageOptions& options,
                                                                   const Dataset* train, Backend* backend) {
  const int stage = options.stage;
  const int stages = config.model().segments_size();
  const bool first_stage = stage == 0, last_stage = stage + 1 == stages;
  if ((options.upstream == nullptr) != first_stage || (options.downstream == nullptr) != last_stage ||
      (first_stage && train == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " of ", stages, ": links or data do not fit its place in the chain"));
  }
  const uint32_t micro = config.training().micro_batches();
  const uint32_t micro_rows = (config.training().batch_size() + micro - 1) / micro;
  // GPIPE holds every micro-batch of a clock; 1F1B at most K - k at once.
  const uint32_t slots = config.training().schedule() == v1::GPIPE
                             ? micro
                             : std::min<uint32_t>(micro, static_cast<uint32_t>(stages - stage));
  absl::StatusOr<SegmentModel> model =
      SegmentModel::Create(backend, config.model(), stage, static_cast<int>(slots * micro_rows));
  if (!model.ok()) return model.status();
  return std::unique_ptr<StageCompute>(
      new StageCompute(config, options, train, backend, *std::move(model), slots));
}

StageCompute::StageCompute(const v1::JobConfig& config, const StageOptions& options, const Dataset* train,
                           Backend* backend, SegmentModel model, uint32_t slots)
    : config_(config),
      options_(options),
      train_(train),
      backend_(backend),
      model_(std::move(model)),
      stage_(options.stage),
      stages_(config.model().segments_size()),
      first_stage_(stage_ == 0),
      last_stage_(stage_ + 1 == stages_),
      batch_(config.training().batch_size()),
      micro_(config.training().micro_batches()),
      micro_rows_((batch_ + micro_ - 1) / micro_),
      slots_(slots),
      in_width_(static_cast<size_t>(model_.input_width())),
      out_width_(static_cast<size_t>(model_.output_width())),
      labels_(static_cast<size_t>(slots) * micro_rows_),
      host_grad_(backend->host_addressable() ? 0 : model_.num_params()) {}

absl::Status StageCompute::Start(const Registration& registration, const std::string& tag) {
  tag_ = tag;
  if (first_stage_) {
    slice_ = WorkerSlice(config_, train_->size(), 0, options_.replica);
    if (slice_.count == 0) return absl::FailedPreconditionError(absl::StrCat(tag, ": its data slice is empty"));
    SEGPS_RETURN_IF_ERROR(train_->MapRows(slice_));
    steps_per_epoch_ = StepsPerEpoch(slice_.count, batch_);
    total_steps_ = steps_per_epoch_ * config_.training().epochs();
  }
  SEGPS_LOG_INFO << tag << ": stage " << stage_ << " of " << stages_ << ", registered at clock "
                 << registration.start_clock << " on " << backend_->name() << "; " << model_.num_params()
                 << " parameters, " << micro_ << " micro-batches of up to " << micro_rows_ << " rows, "
                 << (config_.training().schedule() == v1::GPIPE ? "GPIPE" : "ONE_F_ONE_B") << " (" << slots_
                 << " held at once)"
                 << (first_stage_ ? absl::StrCat("; ", slice_.count, " samples, ", total_steps_, " steps")
                                  : std::string());
  t0_ = steady_start_ = absl::Now();
  next_log_ = t0_ + absl::Seconds(config_.training().log_interval_s());
  return absl::OkStatus();
}

absl::StatusOr<bool> StageCompute::HasStep(uint64_t clock) {
  if (first_stage_) {
    if (clock >= total_steps_) return false;
    epoch_ = static_cast<uint32_t>(clock / steps_per_epoch_);
    if (order_epoch_ != epoch_) {
      order_ = EpochOrder(slice_, config_.seed(), 0, options_.replica, epoch_);
      order_epoch_ = epoch_;
    }
    const uint64_t begin = (clock % steps_per_epoch_) * batch_;
    batch_rows_ = static_cast<uint32_t>(std::min<uint64_t>(batch_, slice_.count - begin));
    return true;
  }
  if (!pending_.has_value()) {
    absl::StatusOr<MicroBatch> got = ReceiveNext();
    if (!got.ok()) return got.status();
    pending_ = *std::move(got);
  }
  if (pending_->done) return false;
  if (pending_->clock != clock || pending_->micro_batch != 0) {
    // The previous stage continues elsewhere (it recovered to another clock): the chain agrees again.
    return LinkFailure(absl::FailedPreconditionError(
        absl::StrCat(tag_, ": expected clock ", clock, " micro-batch 0 from stage ", stage_ - 1, ", got clock ",
                     pending_->clock, " micro-batch ", pending_->micro_batch)));
  }
  batch_rows_ = pending_->batch_rows;
  epoch_ = pending_->epoch;
  if (batch_rows_ > batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat(tag_, ": a mini-batch of ", batch_rows_, " rows (batch_size ", batch_, ")"));
  }
  return true;
}

absl::StatusOr<StepResult> StageCompute::Compute(uint64_t clock) {
  const absl::Time start = absl::Now();
  const uint32_t count = std::min(micro_, batch_rows_);
  BatchStats clock_stats;  // the last stage's loss over the clock's micro-batches
  accumulate_ = false;
  for (const auto& [m, forward] :
       Passes(config_.training().schedule(), count, static_cast<uint32_t>(stages_ - stage_ - 1))) {
    const Part part = MicroPart(batch_rows_, count, m);
    const int first = static_cast<int>((m % slots_) * micro_rows_);
    if (forward) {
      SEGPS_RETURN_IF_ERROR(Forward(clock, m, part.rows, first, &clock_stats));
    } else {
      SEGPS_RETURN_IF_ERROR(Backward(clock, m, part.rows, first));
    }
  }
  // One update per mini-batch: the sum of its micro-batches' gradients.
  SEGPS_RETURN_IF_ERROR(backend_->Synchronize());
  StepResult result;
  result.rows = batch_rows_;
  result.grad = model_.grad();
  if (!backend_->host_addressable()) {
    SEGPS_RETURN_IF_ERROR(backend_->Download(result.grad, host_grad_.data(), host_grad_.size() * sizeof(float)));
    SEGPS_RETURN_IF_ERROR(backend_->Synchronize());
    result.grad = host_grad_.data();
  }
  if (last_stage_) result.stats = clock_stats;
  result.compute = absl::Now() - start;
  return result;
}

absl::Status StageCompute::Forward(uint64_t clock, uint32_t m, uint32_t rows, int first, BatchStats* clock_stats) {
  if (first_stage_) {
    const Part part = MicroPart(batch_rows_, std::min(micro_, batch_rows_), m);
    SEGPS_RETURN_IF_ERROR(Gather(clock, part.first, rows, first));
  } else {
    SEGPS_RETURN_IF_ERROR(Receive(clock, m, rows, first));
  }
  int32_t* slot_labels = labels_.data() + first;
  if (last_stage_) SEGPS_RETURN_IF_ERROR(Upload(slot_labels, model_.labels() + first, rows * sizeof(int32_t)));
  SEGPS_RETURN_IF_ERROR(backend_->StartTiming());
  const absl::Time compute = absl::Now();
  SEGPS_RETURN_IF_ERROR(model_.StageForward(first, static_cast<int>(rows), 1.0f / static_cast<float>(batch_rows_),
                                            DropoutSeed(config_.seed(), options_.stage, options_.replica, clock)));
  SEGPS_RETURN_IF_ERROR(EndPass(compute, 1));
  if (last_stage_) {
    SEGPS_RETURN_IF_ERROR(model_.DownloadStats());
    SEGPS_RETURN_IF_ERROR(backend_->Synchronize());
    clock_stats->loss_sum += model_.stats().loss_sum;
    clock_stats->correct += model_.stats().correct;
    return absl::OkStatus();
  }
  absl::StatusOr<absl::Span<const float>> out = ToHost(model_.output(first), rows * out_width_);
  if (!out.ok()) return out.status();
  SEGPS_RETURN_IF_ERROR(
      OnLink(options_.downstream->Send(clock, epoch_, m, batch_rows_, *out, absl::MakeConstSpan(slot_labels, rows))));
  Crossed(&StageMetrics::ObserveActivationsSent, out->size());
  return absl::OkStatus();
}

absl::Status StageCompute::Backward(uint64_t clock, uint32_t m, uint32_t rows, int first) {
  if (!last_stage_) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<float>> grad = options_.downstream->ReceiveGradient(options_.patience);
    Waited(StageMetrics::Neighbour::kNext, start);
    if (!grad.ok()) return OnLink(grad.status());
    Crossed(&StageMetrics::ObserveGradientsReceived, grad->size());
    SEGPS_RETURN_IF_ERROR(Upload(grad->data(), model_.output_grad(first), grad->size() * sizeof(float)));
  }
  SEGPS_RETURN_IF_ERROR(backend_->StartTiming());
  const absl::Time compute = absl::Now();
  SEGPS_RETURN_IF_ERROR(model_.StageBackward(first, static_cast<int>(rows), accumulate_, !first_stage_,
                                             DropoutSeed(config_.seed(), options_.stage, options_.replica, clock)));
  SEGPS_RETURN_IF_ERROR(EndPass(compute, 2));
  accumulate_ = true;
  if (first_stage_) return absl::OkStatus();
  absl::StatusOr<absl::Span<const float>> d_in = ToHost(model_.input_grad(first), rows * in_width_);
  if (!d_in.ok()) return d_in.status();
  SEGPS_RETURN_IF_ERROR(OnLink(options_.upstream->SendGradient(clock, m, *d_in)));
  Crossed(&StageMetrics::ObserveGradientsSent, d_in->size());
  return absl::OkStatus();
}

absl::Status StageCompute::Gather(uint64_t clock, uint32_t first_row, uint32_t rows, int first) {
  const uint64_t begin = (clock % steps_per_epoch_) * batch_ + first_row;
  int32_t* slot_labels = labels_.data() + first;
  float* input = model_.input() + first * in_width_;
  if (backend_->host_addressable()) {
    GatherBatch(*train_, order_, begin, rows, input, slot_labels);
    return absl::OkStatus();
  }
  host_values_.resize(rows * in_width_);
  GatherBatch(*train_, order_, begin, rows, host_values_.data(), slot_labels);
  return Upload(host_values_.data(), input, host_values_.size() * sizeof(float));
}

absl::Status StageCompute::Receive(uint64_t clock, uint32_t m, uint32_t rows, int first) {
  MicroBatch got;
  if (m == 0) {
    got = *std::move(pending_);
    pending_.reset();
  } else {
    absl::StatusOr<MicroBatch> next = ReceiveNext();
    if (!next.ok()) return next.status();
    got = *std::move(next);
  }
  if (got.done || got.clock != clock || got.micro_batch != m || got.rows != rows || got.batch_rows != batch_rows_) {
    return LinkFailure(absl::FailedPreconditionError(absl::StrCat(
        tag_, ": expected clock ", clock, " micro-batch ", m, " of ", rows, " rows from stage ", stage_ - 1,
        got.done ? ", got the end of training"
                 : absl::StrCat(", got clock ", got.clock, " micro-batch ", got.micro_batch, " of ", got.rows,
                                " rows"))));
  }
  std::copy(got.labels.begin(), got.labels.end(), labels_.data() + first);
  return Upload(got.values.data(), model_.input() + first * in_width_, got.values.size() * sizeof(float));
}

absl::StatusOr<MicroBatch> StageCompute::ReceiveNext() {
  const absl::Time start = absl::Now();
  absl::StatusOr<MicroBatch> got = options_.upstream->Receive(options_.patience);
  Waited(StageMetrics::Neighbour::kPrevious, start);
  if (!got.ok()) return OnLink(got.status());
  Crossed(&StageMetrics::ObserveActivationsReceived, got->values.size());
  return got;
}

absl::Status StageCompute::Upload(const void* host, void* device, size_t bytes) {
  SEGPS_RETURN_IF_ERROR(backend_->Upload(host, device, bytes));
  return backend_->host_addressable() ? absl::OkStatus() : backend_->Synchronize();
}

absl::StatusOr<absl::Span<const float>> StageCompute::ToHost(const float* from, size_t count) {
  if (backend_->host_addressable()) return absl::MakeConstSpan(from, count);
  host_values_.resize(count);
  SEGPS_RETURN_IF_ERROR(backend_->Download(from, host_values_.data(), count * sizeof(float)));
  SEGPS_RETURN_IF_ERROR(backend_->Synchronize());
  return absl::MakeConstSpan(host_values_);
}

absl::Status StageCompute::EndPass(absl::Time start, int weight) {
  // The pass's time on the device (a GPU runs it after the calls return).
  absl::StatusOr<absl::Duration> busy = backend_->StopTiming();
  if (!busy.ok()) return busy.status();
  if (options_.slowdown_factor > 1 || options_.pass_time > absl::ZeroDuration()) {
    // A device of another speed: the pass lasts as long as it is made to.
    absl::SleepFor(*busy * (options_.slowdown_factor - 1));
    absl::SleepFor(start + options_.pass_time * weight - absl::Now());
    *busy = absl::Now() - start;
  }
  if (options_.stage_metrics != nullptr) options_.stage_metrics->ObserveBusy(absl::ToDoubleSeconds(*busy));
  return absl::OkStatus();
}

void StageCompute::Waited(StageMetrics::Neighbour neighbour, absl::Time start) {
  const absl::Duration wait = absl::Now() - start;
  waiting_ += wait;
  if (options_.stage_metrics != nullptr) options_.stage_metrics->ObserveWaiting(neighbour, absl::ToDoubleSeconds(wait));
}

void StageCompute::Crossed(void (StageMetrics::*observe)(uint64_t), size_t floats) {
  link_bytes_ += floats * sizeof(float);
  if (options_.stage_metrics != nullptr) (options_.stage_metrics->*observe)(floats * sizeof(float));
}

absl::Status StageCompute::Record(const StepRecord& record, TrainReport* report) {
  if (record.index == 0) {
    steady_start_ = absl::Now();
    steady_waiting_ = waiting_;
  } else if (options_.stage_metrics != nullptr) {
    options_.stage_metrics->SetIdleShare(absl::ToDoubleSeconds(waiting_ - steady_waiting_) /
                                         std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - steady_start_)));
  }
  if (epoch_ != recorded_epoch_) {  // the clock begins an epoch
    if (last_stage_) SEGPS_RETURN_IF_ERROR(CloseEpoch(report));
    recorded_epoch_ = epoch_;
    epoch_start_ = absl::Now();
    epoch_loss_ = 0;
    epoch_correct_ = 0;
    epoch_samples_ = 0;
  }
  if (record.result->stats.has_value()) {  // the last stage's loss
    epoch_loss_ += record.result->stats->loss_sum;
    epoch_correct_ += record.result->stats->correct;
  }
  epoch_samples_ += record.result->rows;
  if (last_stage_ && epoch_samples_ > 0) {
    report->last_loss = epoch_loss_ / static_cast<double>(epoch_samples_);
    report->last_accuracy = epoch_correct_ / static_cast<double>(epoch_samples_);
  }
  if (absl::Now() >= next_log_) {
    next_log_ = absl::Now() + absl::Seconds(config_.training().log_interval_s());
    SEGPS_LOG_INFO << tag_ << ": step " << record.clock + 1
                   << (first_stage_ ? absl::StrCat("/", total_steps_) : std::string())
                   << (last_stage_ ? absl::StrCat(" loss ", report->last_loss, " ", SecondStatName(config_.model()), " ",
                                                report->last_accuracy)
                                   : std::string());
  }
  return absl::OkStatus();
}

absl::Status StageCompute::Rewind() {
  pending_.reset();
  if (options_.upstream != nullptr) options_.upstream->Reset();
  if (options_.downstream != nullptr) SEGPS_RETURN_IF_ERROR(options_.downstream->Reopen());
  // The epoch in hand is counted again from where the replay enters it.
  recorded_epoch_.reset();
  epoch_loss_ = epoch_correct_ = 0;
  epoch_samples_ = 0;
  return absl::OkStatus();
}

absl::Status StageCompute::CloseEpoch(TrainReport* report) {
  if (!recorded_epoch_.has_value() || epoch_samples_ == 0) return absl::OkStatus();
  // An epoch replayed after a rollback replaces its record.
  auto* epochs = report->history.mutable_epochs();
  while (!epochs->empty() && epochs->rbegin()->epoch() >= *recorded_epoch_ + 1) epochs->RemoveLast();
  v1::EpochRecord* record = report->history.add_epochs();
  record->set_epoch(*recorded_epoch_ + 1);
  record->set_train_seconds(absl::ToDoubleSeconds(absl::Now() - t0_));
  record->set_loss(report->last_loss);
  record->set_accuracy(report->last_accuracy);
  record->set_samples_per_second(static_cast<double>(epoch_samples_) /
                                 std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - epoch_start_)));
  if (options_.reader == nullptr || (options_.test == nullptr && options_.validation == nullptr)) {
    return absl::OkStatus();
  }
  // Every stage's parameters as the servers hold them now (a stage's
  // neighbours are within the pipeline's depth of this epoch's end).
  absl::StatusOr<std::vector<std::vector<float>>> params =
      PullParameters(*options_.reader, config_.model(), config_.cluster().num_servers());
  if (!params.ok()) {  // a server restarting: the epoch goes unscored, the chain trains on
    SEGPS_LOG_WARNING << tag_ << ": epoch " << record->epoch() << " is not scored: " << params.status().message();
    return absl::OkStatus();
  }
  if (options_.validation != nullptr) {
    absl::StatusOr<std::vector<float>> probs = Predict(config_.model(), *options_.validation, *params, -1, backend_);
    if (!probs.ok()) return probs.status();
    const segps::Score score = ScoreRows(config_.model(), *probs, options_.validation->y);
    record->set_validation_loss(score.loss);
    record->set_validation_accuracy(SecondStat(score));
    SEGPS_LOG_INFO << absl::StrFormat("%s: epoch %u validation loss %.4f %s %.4f of the whole chain", tag_,
                                      record->epoch(), record->validation_loss(), SecondStatName(config_.model()),
                                      record->validation_accuracy());
  }
  if (options_.test != nullptr) {
    absl::StatusOr<std::vector<float>> probs = Predict(config_.model(), *options_.test, *params, -1, backend_);
    if (!probs.ok()) return probs.status();
    record->set_test_accuracy(SecondStat(ScoreRows(config_.model(), *probs, options_.test->y)));
    SEGPS_LOG_INFO << absl::StrFormat("%s: epoch %u test accuracy %.4f of the whole chain, after %.2f s of training",
                                      tag_, record->epoch(), record->test_accuracy(), record->train_seconds());
  }
  return absl::OkStatus();
}

absl::Status StageCompute::Complete(TrainReport* report) {
  if (last_stage_) SEGPS_RETURN_IF_ERROR(CloseEpoch(report));
  if (options_.downstream != nullptr) SEGPS_RETURN_IF_ERROR(options_.downstream->Finish());
  // A stage's time waiting for its neighbours is its blocked time.
  report->blocked_seconds = absl::ToDoubleSeconds(waiting_);
  const absl::Time end = absl::Now();
  const double steady = absl::ToDoubleSeconds(end - steady_start_);
  const double idle = absl::ToDoubleSeconds(waiting_ - steady_waiting_);
  SEGPS_LOG_INFO << tag_ << ": idle share " << (steady > 0 ? idle / steady : 0) << " (" << idle << " s of " << steady
                 << " s after the first clock waiting for its neighbours); "
                 << (report->steps > 0 ? link_bytes_ / report->steps : 0)
                 << " bytes of activations and their gradients a clock over its links; peak resident memory "
                 << PeakResidentMiB() << " MiB";
  return absl::OkStatus();
}

}  // namespace segps
