#include "worker/train/batch_compute.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/balance.h"
#include "common/config.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace segps {

absl::StatusOr<std::unique_ptr<BatchCompute>> BatchCompute::Create(const v1::JobConfig& config,
                                                                   const TrainerOptions& options,
                                                                   const Dataset& train, Backend* backend,
                                                                   ParameterClient* client) {
  if (train.width != static_cast<int>(config.model().input_width())) {
    return absl::InvalidArgumentError(
        absl::StrCat("data width ", train.width, " != model.input_width ", config.model().input_width()));
  }
  // Balanced (training.balance): each clock takes the next batch x workers
  // samples of one order of the segment's rows, cut by server 0's shares;
  // a share reaches at most the clock's samples less the others' least.
  const uint32_t batch = config.training().batch_size();
  const uint32_t workers = WorkersOf(config, options.segment);
  const uint32_t capacity =
      config.training().has_balance() ? batch * workers - (workers - 1) * MinShare(config.training()) : batch;
  const v1::SegmentConfig& segment = config.model().segments(options.segment);
  if (segment.embeddings_size() > 0 && config.training().has_balance()) {
    return absl::InvalidArgumentError(absl::StrCat("segment \"", segment.name(),
                                                   "\" has embedding tables: training.balance is not supported with them"));
  }
  if (segment.embeddings_size() > 0 && train.fields != static_cast<int>(config.model().categorical_fields())) {
    return absl::InvalidArgumentError(absl::StrCat("data has ", train.fields, " id columns, model.categorical_fields ",
                                                   config.model().categorical_fields()));
  }
  absl::StatusOr<SegmentModel> model =
      SegmentModel::Create(backend, config.model(), options.segment, static_cast<int>(capacity));
  if (!model.ok()) return model.status();
  std::unique_ptr<BatchCompute> compute(
      new BatchCompute(config, options, train, backend, client, *std::move(model), capacity));
  SEGPS_RETURN_IF_ERROR(compute->Allocate());
  return compute;
}

BatchCompute::BatchCompute(const v1::JobConfig& config, const TrainerOptions& options, const Dataset& train,
                           Backend* backend, ParameterClient* client, SegmentModel model, uint32_t capacity)
    : config_(config),
      options_(options),
      train_(train),
      backend_(backend),
      client_(client),
      model_(std::move(model)),
      device_(!backend->host_addressable()),
      balanced_(config.training().has_balance()),
      workers_(WorkersOf(config, options.segment)),
      clock_samples_(balanced_ ? config.training().batch_size() * workers_ : config.training().batch_size()),
      capacity_(capacity),
      progress_(config, options, backend, &model_) {
  const v1::SegmentConfig& segment = config.model().segments(options.segment);
  if (segment.embeddings_size() > 0) {
    rows_ = std::make_unique<BatchRows>(segment, config.model().input_width(), train.fields);
    next_rows_ = std::make_unique<BatchRows>(segment, config.model().input_width(), train.fields);
    progress_.set_rows([client](int k, const std::vector<std::vector<uint64_t>>& ids,
                                std::vector<std::vector<float>>* values) { return client->PullRows(k, 0, ids, values); });
  }
}

absl::Status BatchCompute::Allocate() {
  // A CPU model is read and filled in place: only a device stages.
  const size_t rows = device_ ? capacity_ : 0;
  const size_t width = static_cast<size_t>(train_.width);
  auto host = [&](size_t bytes, Buffer* into) -> absl::Status {
    absl::StatusOr<Buffer> buffer = backend_->AllocateHost(bytes);
    if (!buffer.ok()) return buffer.status();
    *into = *std::move(buffer);
    return absl::OkStatus();
  };
  SEGPS_RETURN_IF_ERROR(host(device_ ? model_.num_params() * sizeof(float) : 0, &grad_host_));
  for (int slot : {0, 1}) {
    SEGPS_RETURN_IF_ERROR(host(rows * width * sizeof(float), &batch_x_[slot]));
    SEGPS_RETURN_IF_ERROR(host(rows * sizeof(int32_t), &batch_y_[slot]));
  }
  return absl::OkStatus();
}

uint64_t BatchCompute::EpochClocks() const {
  const int segment = options_.segment;
  const Range slice =
      balanced_ ? SegmentRows(config_, train_.size(), segment) : WorkerSlice(config_, train_.size(), segment, 0);
  return StepsPerEpoch(slice.count, clock_samples_);
}

absl::Status BatchCompute::Start(const Registration& registration, const std::string& tag) {
  rank_ = registration.rank;
  tag_ = tag;
  const int segment = options_.segment;
  slice_ = balanced_ ? SegmentRows(config_, train_.size(), segment)
                     : WorkerSlice(config_, train_.size(), segment, rank_);
  if (slice_.count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(tag, ": its data slice is empty (", train_.size(),
                                                      " training samples for too many workers)"));
  }
  // A file-backed data set maps only these rows.
  SEGPS_RETURN_IF_ERROR(train_.MapRows(slice_));
  schedule_.epochs = config_.training().epochs();
  schedule_.steps_per_epoch = StepsPerEpoch(slice_.count, clock_samples_);
  schedule_.total_steps = schedule_.steps_per_epoch * schedule_.epochs;
  progress_.Start(tag, rank_, schedule_, balanced_);
  const int32_t staleness = StalenessOf(config_, segment);
  const double topk = config_.training().gradient_topk();
  SEGPS_LOG_INFO << tag << ": registered at clock " << registration.start_clock << " on " << backend_->name()
                 << "; " << slice_.count << " samples [" << slice_.offset << ", " << slice_.end() << ")"
                 << (balanced_ ? absl::StrCat(" shared by ", workers_, " workers, ", clock_samples_,
                                              " a clock by speed (training.balance)")
                               : std::string())
                 << ", " << schedule_.epochs << " epochs of " << schedule_.steps_per_epoch << " steps, batch "
                 << config_.training().batch_size() << ", staleness "
                 << (staleness < 0 ? std::string("unbounded") : std::to_string(staleness))
                 << (topk > 0 ? absl::StrCat(", top-k pushes of ", topk * 100, "% of ", model_.num_params())
                              : std::string());
  return absl::OkStatus();
}

const std::vector<uint32_t>& BatchCompute::OrderOf(uint32_t epoch) {
  if (order_epoch_ != epoch) {
    order_ = EpochOrder(slice_, config_.seed(), options_.segment, balanced_ ? kWholeSegment : rank_, epoch);
    order_epoch_ = epoch;
  }
  return order_;
}

std::optional<Range> BatchCompute::RowsOf(uint64_t clock) {
  const uint64_t begin = (clock % schedule_.steps_per_epoch) * clock_samples_;
  const uint64_t samples = std::min<uint64_t>(clock_samples_, slice_.count - begin);
  if (!balanced_) return Range{begin, samples};
  std::optional<std::vector<uint32_t>> now = client_->Shares(options_.segment, clock);
  if (!now.has_value()) return std::nullopt;
  // Bytes from a server are checked like any other: shares that do not fit
  // the segment are not used.
  if (now->size() != workers_ || std::accumulate(now->begin(), now->end(), uint64_t{0}) != clock_samples_) {
    return std::nullopt;
  }
  if (*now != shares_) {
    if (!shares_.empty()) {
      SEGPS_LOG_INFO << tag_ << ": shares from clock " << clock << ": " << absl::StrJoin(*now, " ")
                     << " samples (this worker " << (*now)[rank_] << ")";
    }
    shares_ = *std::move(now);
  }
  const Range part = ShareOf(shares_, rank_, samples);
  return Range{begin + part.offset, part.count};
}

absl::Status BatchCompute::Stage(uint64_t clock, Range mine, int slot) {
  if (mine.count == 0) return absl::OkStatus();
  const std::vector<uint32_t>& order = OrderOf(static_cast<uint32_t>(clock / schedule_.steps_per_epoch));
  if (!device_) {
    GatherBatch(train_, order, mine.offset, mine.count, model_.input(slot), model_.labels(slot));
    return absl::OkStatus();
  }
  const size_t width = static_cast<size_t>(train_.width);
  GatherBatch(train_, order, mine.offset, mine.count, batch_x_[slot].data(), batch_y_[slot].data<int32_t>());
  SEGPS_RETURN_IF_ERROR(backend_->Upload(batch_x_[slot].data(), model_.input(slot), mine.count * width * sizeof(float)));
  return backend_->Upload(batch_y_[slot].data(), model_.labels(slot), mine.count * sizeof(int32_t));
}

absl::StatusOr<const float*> BatchCompute::HostGradient() {
  if (!device_) return model_.grad();
  SEGPS_RETURN_IF_ERROR(backend_->Download(model_.grad(), grad_host_.data(), model_.num_params() * sizeof(float)));
  return grad_host_.data();
}

absl::Status BatchCompute::CheckLoss(uint64_t clock, const BatchStats& stats) const {
  if (std::isfinite(stats.loss_sum)) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(tag_, ": loss became ", stats.loss_sum, " at clock ", clock, "; lower optimizer.learning_rate"));
}

BatchCompute::~BatchCompute() { DropNextRows(); }

void BatchCompute::CollectRows(uint64_t clock, Range mine, BatchRows* rows) {
  const std::vector<uint32_t>& order = OrderOf(static_cast<uint32_t>(clock / schedule_.steps_per_epoch));
  batch_ids_.resize(mine.count * static_cast<size_t>(train_.fields));
  GatherIds(train_, order, mine.offset, mine.count, batch_ids_.data());
  rows->Collect(batch_ids_.data(), mine.count);
}

void BatchCompute::DropNextRows() {
  // Its buffers are about to change. None is out after the last step; one
  // left by a failure ends with it (the servers answer it, or its deadline).
  if (next_pull_.has_value()) (void)next_pull_->Wait();
  next_pull_.reset();
}

absl::Status BatchCompute::Fetch(uint64_t clock) {
  if (rows_ == nullptr) return absl::OkStatus();
  absl::Status fetched;
  if (next_pull_.has_value() && next_clock_ == clock) {
    fetched = next_pull_->Wait();
    next_pull_.reset();
    std::swap(rows_, next_rows_);
  } else {
    DropNextRows();  // a clock the engine went back from
    CollectRows(clock, *RowsOf(clock), rows_.get());
    fetched = client_->PullRows(options_.segment, clock, rows_->ids(), rows_->mutable_values());
  }
  if (!fetched.ok()) return fetched;
  // The next batch's rows travel while this one computes, where the bound
  // allows it (at staleness 0 they need this step's push) and the batch is
  // known (a balanced segment's shares of the next clock may still change).
  if (StalenessOf(config_, options_.segment) != 0 && !balanced_ && clock + 1 < schedule_.total_steps) {
    CollectRows(clock + 1, *RowsOf(clock + 1), next_rows_.get());
    next_clock_ = clock + 1;
    next_pull_ = client_->StartPullRows(options_.segment, clock + 1, next_rows_->ids(), next_rows_->mutable_values());
  }
  return absl::OkStatus();
}

absl::Status BatchCompute::ComputeWithRows(uint64_t clock, StepResult* result) {
  const Range mine = *RowsOf(clock);
  const size_t n = mine.count, total = static_cast<size_t>(model_.input_width());
  const std::vector<uint32_t>& order = OrderOf(static_cast<uint32_t>(clock / schedule_.steps_per_epoch));
  dense_.resize(n * static_cast<size_t>(train_.width));
  labels_host_.resize(n);
  input_host_.resize(n * total);
  input_grad_host_.resize(n * total);
  GatherBatch(train_, order, mine.offset, n, dense_.data(), labels_host_.data());
  rows_->FillInput(dense_.data(), input_host_.data());
  SEGPS_RETURN_IF_ERROR(backend_->Upload(input_host_.data(), model_.input(0), input_host_.size() * sizeof(float)));
  SEGPS_RETURN_IF_ERROR(backend_->Upload(labels_host_.data(), model_.labels(0), n * sizeof(int32_t)));
  const int rows = static_cast<int>(n);
  const uint64_t dropout = DropoutSeed(config_.seed(), options_.segment, rank_, clock);
  SEGPS_RETURN_IF_ERROR(model_.StageForward(0, rows, 1.0f / static_cast<float>(rows), dropout));
  SEGPS_RETURN_IF_ERROR(model_.StageBackward(0, rows, false, true, dropout));
  absl::StatusOr<const float*> grad = HostGradient();
  if (!grad.ok()) return grad.status();
  SEGPS_RETURN_IF_ERROR(model_.DownloadStats());
  SEGPS_RETURN_IF_ERROR(
      backend_->Download(model_.input_grad(0), input_grad_host_.data(), input_grad_host_.size() * sizeof(float)));
  SEGPS_RETURN_IF_ERROR(backend_->Synchronize());
  rows_->SumGradients(input_grad_host_.data());
  result->rows = static_cast<uint32_t>(n);
  result->grad = *grad;
  result->rows_pulled = rows_.get();
  return absl::OkStatus();
}

absl::StatusOr<StepResult> BatchCompute::Compute(uint64_t clock) {
  if (rows_ != nullptr) {
    StepResult result;
    const absl::Time compute_start = absl::Now();
    SEGPS_RETURN_IF_ERROR(ComputeWithRows(clock, &result));
    result.stats = model_.stats();
    SEGPS_RETURN_IF_ERROR(CheckLoss(clock, *result.stats));
    result.compute = absl::Now() - compute_start;
    throughput_.Observe(result.rows, result.compute);
    return result;
  }
  // Staged after the pull: a balanced clock's shares are final by then.
  if (staged_clock_ != clock) {
    const std::optional<Range> mine = RowsOf(clock);
    if (!mine.has_value()) {
      return absl::InternalError(absl::StrCat(tag_, ": server 0's shares for clock ", clock,
                                              " are not final after its pull, or are not ", workers_,
                                              " shares summing to ", clock_samples_, " (training.balance)"));
    }
    SEGPS_RETURN_IF_ERROR(Stage(clock, *mine, slot_));
    staged_rows_ = mine->count;
    staged_clock_ = clock;
  }
  StepResult result;
  result.rows = static_cast<uint32_t>(staged_rows_);
  const absl::Time compute_start = absl::Now();
  if (result.rows == 0) {
    // A share of no rows (an epoch's last clock cut over more workers than
    // it has samples) still pushes, as 0 samples: the step counts.
    no_gradient_.assign(model_.num_params(), 0.0f);
    result.grad = no_gradient_.data();
  } else {
    SEGPS_RETURN_IF_ERROR(model_.TrainStep(static_cast<int>(result.rows), slot_,
                                           DropoutSeed(config_.seed(), options_.segment, rank_, clock)));
    absl::StatusOr<const float*> grad = HostGradient();
    if (!grad.ok()) return grad.status();
    result.grad = *grad;
    SEGPS_RETURN_IF_ERROR(model_.DownloadStats());
  }
  // Stage the next batch while this step runs on the device (balanced: once
  // its shares are final; else after the next pull).
  staged_clock_.reset();
  if (clock + 1 < schedule_.total_steps) {
    if (const std::optional<Range> next = RowsOf(clock + 1)) {
      SEGPS_RETURN_IF_ERROR(Stage(clock + 1, *next, slot_ ^ 1));
      staged_rows_ = next->count;
      staged_clock_ = clock + 1;
    }
  }
  SEGPS_RETURN_IF_ERROR(backend_->Synchronize());
  slot_ ^= 1;
  result.stats = result.rows > 0 ? model_.stats() : BatchStats{};
  SEGPS_RETURN_IF_ERROR(CheckLoss(clock, *result.stats));
  // A slower device: its compute takes slowdown_factor times as long.
  result.compute = absl::Now() - compute_start;
  if (options_.slowdown_factor > 1) {
    absl::SleepFor(result.compute * (options_.slowdown_factor - 1));
    result.compute = absl::Now() - compute_start;
  }
  throughput_.Observe(result.rows, result.compute);
  if (balanced_) result.samples_per_second = static_cast<float>(throughput_.rate());
  return result;
}

absl::Status BatchCompute::Record(const StepRecord& record, TrainReport* report) {
  return progress_.Record(record, throughput_, report);
}

absl::Status BatchCompute::Complete(TrainReport* report) {
  progress_.Finish();
  report->seconds = progress_.TrainSeconds();
  return absl::OkStatus();
}

}  // namespace segps
