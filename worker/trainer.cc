#include "worker/trainer.h"

#include <unistd.h>

#include <cmath>
#include <numeric>
#include <cstdio>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/balance.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/tensor_wire.h"
#include "worker/async_client.h"
#include "worker/evaluator.h"
#include "worker/heartbeat_loop.h"
#include "worker/segment_model.h"
#include "worker/step_strategy.h"
#include "worker/topk.h"

namespace segps {
namespace {

// Failures a worker recovers from by registering again: a server that
// restarted, was paused past the lease, is unreachable or dropped this
// registration (a rollback). Anything else (a config mismatch, a bad
// request, a broken device) ends the worker.
bool Recoverable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

// Progress between two log lines.
struct Window {
  double loss = 0;
  uint64_t correct = 0, samples = 0, steps = 0;
  double staleness = 0;
  uint64_t max_staleness = 0;
  absl::Duration blocked;
  absl::Duration compute;  // the worker's own computing
  absl::Time start = absl::Now();
};

// A worker's compute throughput, smoothed over its last 20 or so steps (a
// share follows it; the waits of the staleness bound are not in it).
class Throughput {
 public:
  void Observe(size_t rows, absl::Duration compute) {
    const double seconds = absl::ToDoubleSeconds(compute);
    if (rows == 0 || seconds <= 0) return;
    const double alpha = samples_ == 0 ? 1.0 : 0.05;
    samples_ += alpha * (static_cast<double>(rows) - samples_);
    seconds_ += alpha * (seconds - seconds_);
  }
  double rate() const { return seconds_ > 0 ? samples_ / seconds_ : 0; }

 private:
  double samples_ = 0, seconds_ = 0;
};

}  // namespace

absl::StatusOr<TrainReport> Train(const v1::JobConfig& config, const TrainerOptions& options,
                                  const Dataset& train, Backend* backend, ParameterClient* client) {
  const int segment = options.segment;
  const auto& seg = config.model().segments(segment);
  const uint32_t batch = config.training().batch_size();
  const uint32_t epochs = config.training().epochs();
  const int32_t staleness = StalenessOf(config, segment);
  if (train.width != static_cast<int>(config.model().input_width())) {
    return absl::InvalidArgumentError(absl::StrCat("data width ", train.width, " != model.input_width ",
                                                   config.model().input_width()));
  }
  // Balanced (training.balance): each clock takes the next batch x workers
  // samples of one order of the segment's rows, cut by server 0's shares;
  // a share reaches at most the clock's samples less the others' least.
  const bool balanced = config.training().has_balance();
  const uint32_t workers = WorkersOf(config, segment);
  const uint32_t clock_samples = balanced ? batch * workers : batch;
  const uint32_t capacity = balanced ? clock_samples - (workers - 1) * MinShare(config.training()) : batch;
  absl::StatusOr<SegmentModel> model_or =
      SegmentModel::Create(backend, config.model(), segment, static_cast<int>(capacity));
  if (!model_or.ok()) return model_or.status();
  SegmentModel& model = *model_or;
  const size_t n = model.num_params();
  const size_t width = static_cast<size_t>(train.width);

  // Pinned staging: two pull buffers (one being filled while the other
  // uploads), and, on a device (a CPU model is read and filled in place), one
  // gradient buffer (encoded for the wire before reuse) and a batch for each
  // of the model's two input slots (the next uploads while one computes).
  auto host = [&](size_t bytes) { return backend->AllocateHost(bytes); };
  absl::StatusOr<Buffer> pulled0 = host(n * sizeof(float)), pulled1 = host(n * sizeof(float));
  const bool device = !backend->host_addressable();
  absl::StatusOr<Buffer> grad_host = host(device ? n * sizeof(float) : 0);
  const size_t staged_rows = device ? capacity : 0;
  absl::StatusOr<Buffer> batch_x0 = host(staged_rows * width * sizeof(float));
  absl::StatusOr<Buffer> batch_x1 = host(staged_rows * width * sizeof(float));
  absl::StatusOr<Buffer> batch_y0 = host(staged_rows * sizeof(int32_t)), batch_y1 = host(staged_rows * sizeof(int32_t));
  for (auto* b : {&pulled0, &pulled1, &grad_host, &batch_x0, &batch_x1, &batch_y0, &batch_y1}) {
    if (!b->ok()) return b->status();
  }
  Buffer* pulled[2] = {&*pulled0, &*pulled1};
  Buffer* batch_x[2] = {&*batch_x0, &*batch_x1};
  Buffer* batch_y[2] = {&*batch_y0, &*batch_y1};

  absl::StatusOr<Registration> registration = client->Register(segment, options.rank);
  if (!registration.ok()) return registration.status();
  const uint64_t start = registration->start_clock;
  const uint32_t rank = registration->rank;
  const std::string tag = absl::StrCat(seg.name(), "/", rank);
  // The rows this worker draws from: its slice, or a balanced segment's rows.
  const Range slice = balanced ? SegmentRows(config, train.size(), segment)
                               : WorkerSlice(config, train.size(), segment, rank);
  if (slice.count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(tag, ": its data slice is empty (", train.size(),
                                                      " training samples for too many workers)"));
  }
  // A file-backed data set maps only these rows.
  SEGPS_RETURN_IF_ERROR(train.MapRows(slice));
  const uint64_t steps_per_epoch = StepsPerEpoch(slice.count, clock_samples);
  const uint64_t total_steps = steps_per_epoch * epochs;
  SEGPS_LOG_INFO << tag << ": registered at clock " << start << " on " << backend->name() << "; "
                 << slice.count << " samples [" << slice.offset << ", " << slice.end() << ")"
                 << (balanced ? absl::StrCat(" shared by ", workers, " workers, ", clock_samples,
                                             " a clock by speed (training.balance)")
                              : std::string())
                 << ", " << epochs << " epochs of " << steps_per_epoch << " steps, batch " << batch << ", staleness "
                 << (staleness < 0 ? std::string("unbounded") : std::to_string(staleness))
                 << (config.training().gradient_topk() > 0
                         ? absl::StrCat(", top-k pushes of ", config.training().gradient_topk() * 100, "% of ", n)
                         : std::string());

  const absl::Duration heartbeat_period = absl::Milliseconds(config.cluster().lease_ms()) / 3;
  std::optional<HeartbeatLoop> heartbeat;
  heartbeat.emplace(client, heartbeat_period);
  if (options.metrics != nullptr) options.metrics->SetRank(rank);
  // Top-k pushes carry k (index, value) pairs; pulls are always dense.
  std::optional<TopK> topk;
  if (config.training().gradient_topk() > 0) topk.emplace(n, config.training().gradient_topk());
  const size_t element_bytes = DTypeBytes(config.cluster().wire_dtype());
  const uint64_t pull_bytes = n * element_bytes;
  const uint64_t push_bytes = topk ? topk->k() * (sizeof(uint32_t) + element_bytes) : pull_bytes;
  // The step's gradient, encoded for the wire.
  auto encode = [&](uint64_t clock, const float* grad) {
    if (!topk) return client->Encode(segment, clock, absl::MakeConstSpan(grad, n));
    topk->Select(absl::MakeConstSpan(grad, n));
    return client->EncodeSparse(segment, clock, topk->indices(), topk->values());
  };
  // The rows of `clock` this worker computes, as positions in the epoch's
  // order; balanced, by the shares server 0 decided (nullopt: not final yet).
  std::vector<uint32_t> shares;  // as of the last clock staged
  auto rows_of = [&](uint64_t clock) -> std::optional<Range> {
    const uint64_t begin = (clock % steps_per_epoch) * clock_samples;
    const uint64_t samples = std::min<uint64_t>(clock_samples, slice.count - begin);
    if (!balanced) return Range{begin, samples};
    std::optional<std::vector<uint32_t>> now = client->Shares(segment, clock);
    if (!now.has_value()) return std::nullopt;
    // Bytes from a server are checked like any other: shares that do not
    // fit the segment are not used.
    if (now->size() != workers || std::accumulate(now->begin(), now->end(), uint64_t{0}) != clock_samples) {
      return std::nullopt;
    }
    if (*now != shares) {
      if (!shares.empty()) {
        SEGPS_LOG_INFO << tag << ": shares from clock " << clock << ": " << absl::StrJoin(*now, " ")
                       << " samples (this worker " << (*now)[rank] << ")";
      }
      shares = *std::move(now);
    }
    const Range part = ShareOf(shares, rank, samples);
    return Range{begin + part.offset, part.count};
  };
  StepContext step_context;
  step_context.backend = backend;
  step_context.model = &model;
  step_context.pulled[0] = pulled[0];
  step_context.pulled[1] = pulled[1];
  step_context.staleness = staleness;
  // The calls in flight and how steps make them; made again after a recovery.
  std::unique_ptr<AsyncClient> async;
  std::unique_ptr<StepStrategy> strategy;
  auto connect = [&](uint64_t at) {
    async = std::make_unique<AsyncClient>(client, segment, PushesInFlight(config, segment), options.metrics,
                                          pull_bytes, push_bytes);
    step_context.client = async.get();
    step_context.start_clock = at;
    strategy = StepStrategy::For(step_context);
  };
  connect(start);

  TrainReport report;
  const absl::Time t0 = absl::Now();
  absl::Duration blocked, scoring_time;
  double staleness_sum = 0;
  Window window, epoch_window;
  const absl::Duration log_every = absl::Seconds(config.training().log_interval_s());
  absl::Time next_log = t0 + log_every;
  auto count_blocked = [&](absl::Duration waited) {
    blocked += waited;
    window.blocked += waited;
    epoch_window.blocked += waited;
    if (options.metrics != nullptr) options.metrics->ObserveBlocked(absl::ToDoubleSeconds(waited));
  };

  // Clocks are the steps of the worker's whole schedule: clock c is step
  // c % steps_per_epoch of epoch c / steps_per_epoch, whose order depends
  // on the epoch only, so a step computed again after a recovery sees the
  // same batch.
  std::vector<uint32_t> order;
  std::optional<uint32_t> order_epoch;
  auto order_of = [&](uint32_t epoch) -> const std::vector<uint32_t>& {
    if (order_epoch != epoch) {
      order = EpochOrder(slice, config.seed(), segment, balanced ? kWholeSegment : rank, epoch);
      order_epoch = epoch;
    }
    return order;
  };
  // Gathers rows `mine` of `clock`'s epoch order on the host and enqueues
  // their upload into input slot `slot` (on the CPU, gathers straight into the slot).
  auto stage = [&](uint64_t clock, Range mine, int slot) -> absl::Status {
    if (mine.count == 0) return absl::OkStatus();
    const std::vector<uint32_t>& epoch_order = order_of(static_cast<uint32_t>(clock / steps_per_epoch));
    if (!device) {
      GatherBatch(train, epoch_order, mine.offset, mine.count, model.input(slot), model.labels(slot));
      return absl::OkStatus();
    }
    GatherBatch(train, epoch_order, mine.offset, mine.count, batch_x[slot]->data(), batch_y[slot]->data<int32_t>());
    SEGPS_RETURN_IF_ERROR(
        backend->Upload(batch_x[slot]->data(), model.input(slot), mine.count * width * sizeof(float)));
    return backend->Upload(batch_y[slot]->data(), model.labels(slot), mine.count * sizeof(int32_t));
  };
  Throughput throughput;
  std::vector<float> no_gradient;  // a share of no rows pushes zeros
  int slot = 0;
  std::optional<uint64_t> staged_clock;  // the clock whose batch is in `slot`
  size_t batch_rows = 0;  // its rows
  std::optional<uint32_t> window_epoch;  // the epoch epoch_window counts

  // One step; `servers` tells whether a failure came from the servers.
  auto run_step = [&](uint64_t clock, bool* servers) -> absl::Status {
    const uint32_t epoch = static_cast<uint32_t>(clock / steps_per_epoch);
    const uint64_t s = clock % steps_per_epoch;
    if (window_epoch != epoch) {
      epoch_window = Window();
      window_epoch = epoch;
    }
    absl::Duration waited;
    absl::StatusOr<uint64_t> have = strategy->Prepare(clock, &waited);
    count_blocked(waited);
    if (!have.ok()) {
      *servers = true;
      return have.status();
    }
    // Staged after the pull: a balanced clock's shares are final by then.
    if (staged_clock != clock) {
      const std::optional<Range> mine = rows_of(clock);
      if (!mine.has_value()) {
        return absl::InternalError(absl::StrCat(tag, ": server 0's shares for clock ", clock,
                                                " are not final after its pull, or are not ", workers,
                                                " shares summing to ", clock_samples, " (training.balance)"));
      }
      SEGPS_RETURN_IF_ERROR(stage(clock, *mine, slot));
      batch_rows = mine->count;
      staged_clock = clock;
    }
    const size_t rows = batch_rows;
    const absl::Time compute_start = absl::Now();
    BatchStats stats;
    const float* grad = nullptr;
    if (rows == 0) {
      // A share of no rows (an epoch's last clock cut over more workers
      // than it has samples) still pushes, as 0 samples: the step counts.
      no_gradient.assign(n, 0.0f);
      grad = no_gradient.data();
    } else {
      SEGPS_RETURN_IF_ERROR(model.TrainStep(static_cast<int>(rows), slot));
      // On the CPU the gradient is read where it is; a GPU's comes back through pinned memory.
      grad = model.grad();
      if (device) {
        SEGPS_RETURN_IF_ERROR(backend->Download(model.grad(), grad_host->data(), n * sizeof(float)));
        grad = grad_host->data();
      }
      SEGPS_RETURN_IF_ERROR(model.DownloadStats());
    }
    // Stage the next batch while this step runs on the device (balanced:
    // once its shares are final; else after the next pull).
    staged_clock.reset();
    if (clock + 1 < total_steps) {
      if (const std::optional<Range> next = rows_of(clock + 1)) {
        SEGPS_RETURN_IF_ERROR(stage(clock + 1, *next, slot ^ 1));
        batch_rows = next->count;
        staged_clock = clock + 1;
      }
    }
    SEGPS_RETURN_IF_ERROR(backend->Synchronize());
    slot ^= 1;
    if (rows > 0) stats = model.stats();
    if (!std::isfinite(stats.loss_sum)) {
      return absl::InternalError(absl::StrCat(tag, ": loss became ", stats.loss_sum, " at clock ", clock,
                                              "; lower optimizer.learning_rate"));
    }
    // A slower device: its compute takes slowdown_factor times as long.
    absl::Duration compute = absl::Now() - compute_start;
    if (options.slowdown_factor > 1) {
      absl::SleepFor(compute * (options.slowdown_factor - 1));
      compute = absl::Now() - compute_start;
    }
    throughput.Observe(rows, compute);
    const uint64_t lag = clock - std::min(clock, *have);  // clocks this step's parameters lagged
    waited = absl::ZeroDuration();
    std::unique_ptr<EncodedPush> push = encode(clock, grad);
    if (balanced) {
      push->samples = static_cast<uint32_t>(rows);
      push->samples_per_second = static_cast<float>(throughput.rate());
    }
    absl::Status sent = strategy->Finish(std::move(push), clock + 1 == total_steps, &waited);
    count_blocked(waited);
    if (!sent.ok()) {
      *servers = true;
      return sent;
    }
    if (options.slowdown > absl::ZeroDuration()) absl::SleepFor(options.slowdown);

    for (Window* w : {&window, &epoch_window}) {
      w->loss += stats.loss_sum;
      w->correct += stats.correct;
      w->samples += rows;
      w->steps += 1;
      w->staleness += static_cast<double>(lag);
      w->max_staleness = std::max(w->max_staleness, lag);
      w->compute += compute;
    }
    staleness_sum += static_cast<double>(lag);
    if (options.metrics != nullptr && rows > 0) {
      options.metrics->ObserveStep(stats.loss_sum / rows, static_cast<double>(stats.correct) / rows, rows, lag,
                                   clock + 1);
    }
    report.max_staleness = std::max(report.max_staleness, lag);
    report.steps += 1;
    report.samples += rows;

    const absl::Time now = absl::Now();
    const bool epoch_end = s + 1 == steps_per_epoch;
    if (now >= next_log || epoch_end) {
      const double secs = std::max(1e-9, absl::ToDoubleSeconds(now - window.start));
      const double samples = std::max<double>(1, static_cast<double>(window.samples));
      std::string line = absl::StrFormat(
          "%s: epoch %u/%u step %d/%d loss %.4f acc %.4f samples/s %.0f staleness avg %.2f max %d blocked %.0f%%",
          tag, epoch + 1, epochs, clock + 1, total_steps, window.loss / samples,
          static_cast<double>(window.correct) / samples, window.samples / secs,
          window.staleness / window.steps, window.max_staleness,
          100.0 * absl::ToDoubleSeconds(window.blocked) / secs);
      if (balanced) {
        absl::StrAppendFormat(&line, " share %.0f compute %.0f samples/s",
                              static_cast<double>(window.samples) / window.steps, throughput.rate());
      }
      if (options.progress_bar) {
        const int width_bar = 30;
        const int filled = static_cast<int>(width_bar * (clock + 1) / total_steps);
        std::printf("\r[%s%s] %s", std::string(filled, '#').c_str(),
                    std::string(width_bar - filled, '.').c_str(), line.c_str());
        std::fflush(stdout);
      } else {
        SEGPS_LOG_INFO << line;
      }
      if (options.metrics != nullptr) {
        options.metrics->SetSamplesPerSecond(window.samples / secs);
        options.metrics->SetShare(static_cast<uint32_t>(window.samples / window.steps));
        options.metrics->SetComputeSamplesPerSecond(throughput.rate());
      }
      window = Window();
      next_log = now + log_every;
    }
    if (!epoch_end) return absl::OkStatus();
    const double epoch_samples = std::max<double>(1, static_cast<double>(epoch_window.samples));
    report.last_loss = epoch_window.loss / epoch_samples;
    report.last_accuracy = static_cast<double>(epoch_window.correct) / epoch_samples;
    // An epoch computed again after a rollback replaces its record.
    auto* records = report.history.mutable_epochs();
    while (!records->empty() && records->rbegin()->epoch() > epoch) records->RemoveLast();
    v1::EpochRecord* record = report.history.add_epochs();
    record->set_epoch(epoch + 1);
    record->set_train_seconds(absl::ToDoubleSeconds(absl::Now() - t0 - scoring_time));
    record->set_loss(report.last_loss);
    record->set_accuracy(report.last_accuracy);
    record->set_samples_per_second(
        epoch_window.samples / std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - epoch_window.start)));
    record->set_mean_staleness(epoch_window.staleness / epoch_window.steps);
    record->set_blocked_seconds(absl::ToDoubleSeconds(epoch_window.blocked));
    record->set_mean_share(static_cast<double>(epoch_window.samples) / epoch_window.steps);
    record->set_compute_samples_per_second(
        epoch_window.samples / std::max(1e-9, absl::ToDoubleSeconds(epoch_window.compute)));
    if (options.test != nullptr) {
      const absl::Time scoring = absl::Now();
      std::vector<float> params(n);
      SEGPS_RETURN_IF_ERROR(backend->Download(model.params(), params.data(), n * sizeof(float)));
      SEGPS_RETURN_IF_ERROR(backend->Synchronize());
      std::vector<std::vector<float>> segments(config.model().segments_size());
      segments[segment] = std::move(params);
      absl::StatusOr<std::vector<float>> probs = Predict(config.model(), *options.test, segments, segment, backend);
      if (!probs.ok()) return probs.status();
      const double accuracy = Accuracy(*probs, options.test->y);
      record->set_test_accuracy(accuracy);
      // Indexed by epoch: an epoch computed again replaces its entry; a
      // worker that joined after the first epochs (its peers trained them)
      // gives those its first scores, so the history has no gaps.
      if (options.test_probabilities != nullptr) {
        options.test_probabilities->resize(std::min<size_t>(options.test_probabilities->size(), epoch));
        while (options.test_probabilities->size() <= epoch) options.test_probabilities->push_back(*probs);
      }
      SEGPS_LOG_INFO << absl::StrFormat("%s: epoch %u test accuracy %.4f after %.2f s of training", tag, epoch + 1,
                                        accuracy, record->train_seconds());
      scoring_time += absl::Now() - scoring;
    }
    return absl::OkStatus();
  };

  // After a failure the servers caused (one restarted, paused or cut off;
  // this worker's registration dropped): registers again, retrying until
  // cluster.recovery_timeout_ms, and returns the clock to continue at.
  const absl::Duration recovery_timeout = absl::Milliseconds(config.cluster().recovery_timeout_ms());
  auto recover = [&](const absl::Status& why, uint64_t at) -> absl::StatusOr<uint64_t> {
    SEGPS_LOG_WARNING << tag << ": clock " << at << ": " << why.message() << "; rejoining the servers";
    const absl::Time since = absl::Now();
    // What is in flight fails or is abandoned; the lanes and the heartbeat stop first.
    strategy.reset();
    async.reset();
    heartbeat.reset();
    absl::Duration delay = absl::Milliseconds(50);
    absl::StatusOr<Registration> again = client->Register(segment, rank);
    while (!again.ok()) {
      // Servers still unreachable or recovering are waited for; a refusal
      // (another model, a server that restarted without checkpoints) is final.
      if (!IsTransient(again.status()) || absl::Now() + delay - since > recovery_timeout) {
        return absl::Status(again.status().code(),
                            absl::StrCat(tag, ": could not rejoin the servers within ",
                                         absl::FormatDuration(recovery_timeout), " (cluster.recovery_timeout_ms): ",
                                         again.status().message()));
      }
      absl::SleepFor(delay);
      delay = std::min(delay * 2, absl::Seconds(1));
      again = client->Register(segment, rank);
    }
    const uint64_t resume = std::min(again->start_clock, total_steps);
    SEGPS_LOG_WARNING << tag << ": rejoined at clock " << resume << " after "
                      << absl::FormatDuration(absl::Now() - since)
                      << (resume < at ? absl::StrCat("; ", at - resume, " steps are computed again") : std::string());
    report.recoveries += 1;
    heartbeat.emplace(client, heartbeat_period);
    connect(resume);
    return resume;
  };

  uint64_t clock = std::min(start, total_steps);
  while (true) {
    while (clock < total_steps) {
      bool servers = false;
      absl::Status status = run_step(clock, &servers);
      if (status.ok()) {
        ++clock;
        continue;
      }
      if (!servers || !Recoverable(status)) return status;
      absl::StatusOr<uint64_t> resume = recover(status, clock);
      if (!resume.ok()) return resume.status();
      clock = *resume;
    }
    absl::Status drained = strategy->Drain();
    if (drained.ok()) break;
    if (!Recoverable(drained)) return drained;
    absl::StatusOr<uint64_t> resume = recover(drained, clock);
    if (!resume.ok()) return resume.status();
    clock = *resume;
  }
  if (options.progress_bar) std::printf("\n");
  report.seconds = absl::ToDoubleSeconds(absl::Now() - t0 - scoring_time);
  report.blocked_seconds = absl::ToDoubleSeconds(blocked);
  report.history.set_segment(seg.name());
  report.history.set_rank(rank);
  report.mean_staleness = report.steps ? staleness_sum / report.steps : 0;
  // Leaving also ends an outstanding prefetch that waits on peers.
  absl::Status left = client->Leave();
  if (!left.ok()) SEGPS_LOG_WARNING << tag << ": leave: " << left.message();
  return report;
}

}  // namespace segps
