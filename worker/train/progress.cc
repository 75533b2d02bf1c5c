#include "worker/train/progress.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/model/evaluator.h"

namespace segps {

void Throughput::Observe(size_t rows, absl::Duration compute) {
  const double seconds = absl::ToDoubleSeconds(compute);
  if (rows == 0 || seconds <= 0) return;
  const double alpha = samples_ == 0 ? 1.0 : 0.05;
  samples_ += alpha * (static_cast<double>(rows) - samples_);
  seconds_ += alpha * (seconds - seconds_);
}

Progress::Progress(const v1::JobConfig& config, const TrainerOptions& options, Backend* backend,
                   SegmentModel* model)
    : config_(config),
      options_(options),
      backend_(backend),
      model_(model),
      log_every_(absl::Seconds(config.training().log_interval_s())) {}

void Progress::Start(const std::string& tag, uint32_t rank, const Schedule& schedule, bool balanced) {
  tag_ = tag;
  rank_ = rank;
  if (rank == 0 && config_.training().has_early_stopping()) early_stop_.emplace(config_.training().early_stopping());
  schedule_ = schedule;
  balanced_ = balanced;
  t0_ = absl::Now();
  next_log_ = t0_ + log_every_;
  window_ = Window();
  last_step_end_ = t0_;
}

absl::Status Progress::Record(const StepRecord& record, const Throughput& throughput, TrainReport* report) {
  const uint64_t clock = record.clock;
  const uint32_t epoch = static_cast<uint32_t>(clock / schedule_.steps_per_epoch);
  if (window_epoch_ != epoch) {
    epoch_window_ = Window();
    epoch_window_.start = last_step_end_;  // the step began when the one before it ended
    window_epoch_ = epoch;
  }
  last_step_end_ = absl::Now();
  const StepResult& result = *record.result;
  const BatchStats stats = result.stats.value_or(BatchStats{});
  for (Window* w : {&window_, &epoch_window_}) {
    w->loss += stats.loss_sum;
    w->correct += stats.correct;
    w->samples += result.rows;
    w->steps += 1;
    w->staleness += static_cast<double>(record.lag);
    w->max_staleness = std::max(w->max_staleness, record.lag);
    w->blocked += record.blocked;
    w->compute += result.compute;
  }
  const bool epoch_end = (clock + 1) % schedule_.steps_per_epoch == 0;
  if (absl::Now() >= next_log_ || epoch_end) Log(clock, throughput);
  return epoch_end ? EndEpoch(epoch, report) : absl::OkStatus();
}

void Progress::Log(uint64_t clock, const Throughput& throughput) {
  const absl::Time now = absl::Now();
  const uint32_t epoch = static_cast<uint32_t>(clock / schedule_.steps_per_epoch);
  const double secs = std::max(1e-9, absl::ToDoubleSeconds(now - window_.start));
  const double samples = std::max<double>(1, static_cast<double>(window_.samples));
  std::string line = absl::StrFormat(
      "%s: epoch %u/%u step %d/%d loss %.4f %s %.4f samples/s %.0f staleness avg %.2f max %d blocked %.0f%%", tag_,
      epoch + 1, schedule_.epochs, clock + 1, schedule_.total_steps, window_.loss / samples,
      SecondStatName(config_.model()), window_.correct / samples, window_.samples / secs, window_.staleness / window_.steps,
      window_.max_staleness, 100.0 * absl::ToDoubleSeconds(window_.blocked) / secs);
  if (balanced_) {
    absl::StrAppendFormat(&line, " share %.0f compute %.0f samples/s",
                          static_cast<double>(window_.samples) / window_.steps, throughput.rate());
  }
  if (options_.progress_bar) {
    const int width_bar = 30;
    const int filled = static_cast<int>(width_bar * (clock + 1) / schedule_.total_steps);
    std::printf("\r[%s%s] %s", std::string(filled, '#').c_str(), std::string(width_bar - filled, '.').c_str(),
                line.c_str());
    std::fflush(stdout);
  } else {
    SEGPS_LOG_INFO << line;
  }
  if (options_.metrics != nullptr) {
    options_.metrics->SetSamplesPerSecond(window_.samples / secs);
    options_.metrics->SetShare(static_cast<uint32_t>(window_.samples / window_.steps));
    options_.metrics->SetComputeSamplesPerSecond(throughput.rate());
  }
  window_ = Window();
  next_log_ = now + log_every_;
}

absl::Status Progress::EndEpoch(uint32_t epoch, TrainReport* report) {
  const Window& w = epoch_window_;
  const double epoch_samples = std::max<double>(1, static_cast<double>(w.samples));
  report->last_loss = w.loss / epoch_samples;
  report->last_accuracy = static_cast<double>(w.correct) / epoch_samples;
  // An epoch computed again after a rollback replaces its record.
  auto* records = report->history.mutable_epochs();
  while (!records->empty() && records->rbegin()->epoch() > epoch) records->RemoveLast();
  v1::EpochRecord* record = report->history.add_epochs();
  record->set_epoch(epoch + 1);
  record->set_train_seconds(TrainSeconds());
  record->set_loss(report->last_loss);
  record->set_accuracy(report->last_accuracy);
  record->set_samples_per_second(w.samples / std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - w.start)));
  record->set_mean_staleness(w.staleness / w.steps);
  record->set_blocked_seconds(absl::ToDoubleSeconds(w.blocked));
  record->set_mean_share(static_cast<double>(w.samples) / w.steps);
  record->set_compute_samples_per_second(w.samples / std::max(1e-9, absl::ToDoubleSeconds(w.compute)));
  if (options_.test == nullptr && options_.validation == nullptr) return absl::OkStatus();
  const absl::Time scoring = absl::Now();
  const size_t n = model_->num_params();
  std::vector<std::vector<float>> segments(config_.model().segments_size());
  segments[options_.segment].resize(n);
  SEGPS_RETURN_IF_ERROR(backend_->Download(model_->params(), segments[options_.segment].data(), n * sizeof(float)));
  SEGPS_RETURN_IF_ERROR(backend_->Synchronize());
  if (options_.validation != nullptr) SEGPS_RETURN_IF_ERROR(Validate(epoch, segments, record));
  if (options_.test != nullptr) SEGPS_RETURN_IF_ERROR(Score(epoch, segments, record, &report->history));
  scoring_time_ += absl::Now() - scoring;
  if (options_.validation != nullptr) MaybeStop(epoch, *record, report);
  return absl::OkStatus();
}

void Progress::MaybeStop(uint32_t epoch, const v1::EpochRecord& record, TrainReport* report) {
  if (!early_stop_.has_value() || !early_stop_->Observe(epoch + 1, record.validation_loss())) return;
  const v1::EarlyStopping& config = config_.training().early_stopping();
  const uint32_t best = early_stop_->best_epoch();
  report->end_at_clock = best * schedule_.steps_per_epoch;
  report->history.set_best_epoch(best);
  report->stopped_early = absl::StrFormat(
      "stopped early after epoch %u: the validation loss has not fallen by more than %g for %u epochs; the segment "
      "ends at epoch %u's parameters (validation loss %.4f)",
      epoch + 1, config.min_delta(), config.patience(), best, early_stop_->best_loss());
  SEGPS_LOG_WARNING << tag_ << ": " << report->stopped_early;
}

absl::Status Progress::Validate(uint32_t epoch, const std::vector<std::vector<float>>& segments,
                                v1::EpochRecord* record) {
  absl::StatusOr<std::vector<float>> probs =
      Predict(config_.model(), *options_.validation, segments, options_.segment, backend_, rows_);
  if (!probs.ok()) return probs.status();
  const segps::Score score = ScoreRows(config_.model(), *probs, options_.validation->y);
  record->set_validation_loss(score.loss);
  record->set_validation_accuracy(SecondStat(score));
  SEGPS_LOG_INFO << absl::StrFormat("%s: epoch %u validation loss %.4f %s %.4f", tag_, epoch + 1,
                                    record->validation_loss(), SecondStatName(config_.model()),
                                    record->validation_accuracy());
  return absl::OkStatus();
}

absl::Status Progress::Score(uint32_t epoch, const std::vector<std::vector<float>>& segments,
                             v1::EpochRecord* record, v1::WorkerHistory* history) {
  absl::StatusOr<std::vector<float>> probs =
      Predict(config_.model(), *options_.test, segments, options_.segment, backend_, rows_);
  if (!probs.ok()) return probs.status();
  const double accuracy = SecondStat(ScoreRows(config_.model(), *probs, options_.test->y));
  record->set_test_accuracy(accuracy);
  // One an epoch from the first this process scored (a worker that joined
  // after the first epochs, or resumed, has none of theirs); an epoch
  // computed again replaces its own and drops the later ones.
  if (std::vector<std::vector<float>>* kept = options_.test_probabilities; kept != nullptr) {
    const uint32_t first = history->first_scored_epoch();
    if (first == 0 || epoch + 1 < first || epoch + 1 - first > kept->size()) {  // none yet, or a gap
      kept->clear();
      history->set_first_scored_epoch(epoch + 1);
    }
    kept->resize(epoch + 1 - history->first_scored_epoch());
    kept->push_back(*std::move(probs));
  }
  SEGPS_LOG_INFO << absl::StrFormat("%s: epoch %u test accuracy %.4f after %.2f s of training", tag_, epoch + 1,
                                    accuracy, record->train_seconds());
  return absl::OkStatus();
}

void Progress::Finish() {
  if (options_.progress_bar) std::printf("\n");
}

}  // namespace segps
