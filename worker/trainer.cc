#include "worker/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/tensor_wire.h"
#include "worker/evaluator.h"
#include "worker/segment_model.h"
#include "worker/topk.h"

namespace segps {
namespace {

// Runs one pull at a time on its own thread, so the next parameters arrive
// while the current batch computes. Thread-safe.
class Prefetcher {
 public:
  Prefetcher(ParameterClient* client, int segment, WorkerMetrics* metrics, uint64_t bytes)
      : client_(client), segment_(segment), metrics_(metrics), bytes_(bytes) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Prefetcher() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      changed_.SignalAll();
    }
    thread_.join();
  }

  // Starts pulling for `clock` into `dest`; no pull may be outstanding.
  void Start(uint64_t clock, absl::Span<float> dest) {
    MutexLock lock(&mu_);
    request_ = Request{clock, dest};
    result_.reset();
    changed_.SignalAll();
  }
  bool outstanding() {
    MutexLock lock(&mu_);
    return request_.has_value() || busy_ || result_.has_value();
  }
  bool done() {
    MutexLock lock(&mu_);
    return result_.has_value();
  }
  // Waits for the outstanding pull; returns the clock its values reflect.
  absl::StatusOr<uint64_t> Take() {
    MutexLock lock(&mu_);
    while (!result_.has_value()) changed_.Wait(&mu_);
    absl::StatusOr<uint64_t> result = *std::move(result_);
    result_.reset();
    return result;
  }

 private:
  struct Request {
    uint64_t clock;
    absl::Span<float> dest;
  };
  void Loop() {
    while (true) {
      Request request;
      {
        MutexLock lock(&mu_);
        while (!HasWork()) changed_.Wait(&mu_);
        if (stop_) return;
        request = *request_;
        request_.reset();
        busy_ = true;
      }
      const absl::Time start = absl::Now();
      absl::StatusOr<uint64_t> result = client_->Pull(segment_, request.clock, request.dest);
      if (metrics_ != nullptr && result.ok()) {
        metrics_->ObservePull(absl::ToDoubleSeconds(absl::Now() - start), bytes_);
      }
      MutexLock lock(&mu_);
      busy_ = false;
      result_ = std::move(result);
      changed_.SignalAll();
    }
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || request_.has_value(); }

  ParameterClient* const client_;
  const int segment_;
  WorkerMetrics* const metrics_;
  const uint64_t bytes_;  // on the wire per pull
  Mutex mu_;
  CondVar changed_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Request> request_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<uint64_t>> result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Sends encoded pushes in clock order on its own thread, at most
// `max_in_flight` queued or being sent. Thread-safe.
class Pusher {
 public:
  Pusher(ParameterClient* client, uint32_t max_in_flight, WorkerMetrics* metrics, uint64_t bytes)
      : client_(client), max_in_flight_(max_in_flight), metrics_(metrics), bytes_(bytes) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Pusher() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      changed_.SignalAll();
    }
    thread_.join();
  }
  // Queues a push, first waiting while max_in_flight are outstanding.
  absl::Status Enqueue(std::unique_ptr<EncodedPush> push) {
    MutexLock lock(&mu_);
    while (!HasRoom()) changed_.Wait(&mu_);
    if (!error_.ok()) return error_;
    queue_.push_back(std::move(push));
    ++in_flight_;
    changed_.SignalAll();
    return absl::OkStatus();
  }
  // Waits until every queued push is acknowledged.
  absl::Status Drain() {
    MutexLock lock(&mu_);
    while (!Drained()) changed_.Wait(&mu_);
    return error_;
  }

 private:
  void Loop() {
    while (true) {
      std::unique_ptr<EncodedPush> push;
      {
        MutexLock lock(&mu_);
        while (!HasWork()) changed_.Wait(&mu_);
        if (queue_.empty()) return;  // stopping
        push = std::move(queue_.front());
        queue_.pop_front();
      }
      const absl::Time start = absl::Now();
      absl::Status status = client_->Send(*push);
      if (metrics_ != nullptr && status.ok()) metrics_->ObservePush(absl::ToDoubleSeconds(absl::Now() - start), bytes_);
      MutexLock lock(&mu_);
      --in_flight_;
      if (!status.ok() && error_.ok()) error_ = status;
      changed_.SignalAll();
    }
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !error_.ok() || in_flight_ < max_in_flight_;
  }
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !error_.ok() || in_flight_ == 0; }

  ParameterClient* const client_;
  const uint32_t max_in_flight_;
  WorkerMetrics* const metrics_;
  const uint64_t bytes_;
  Mutex mu_;
  CondVar changed_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::unique_ptr<EncodedPush>> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Renews the worker's leases while it trains.
class HeartbeatLoop {
 public:
  HeartbeatLoop(ParameterClient* client, absl::Duration period) {
    thread_ = std::thread([this, client, period] {
      while (!StopWithin(period)) {
        absl::Status status = client->Heartbeat();
        if (!status.ok()) SEGPS_LOG_WARNING << "heartbeat: " << status.message();
      }
    });
  }
  ~HeartbeatLoop() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      changed_.SignalAll();
    }
    thread_.join();
  }

 private:
  // True once asked to stop; waits at most `period` for it.
  bool StopWithin(absl::Duration period) {
    MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + period;
    while (!stop_ && absl::Now() < deadline) changed_.WaitWithDeadline(&mu_, deadline);
    return stop_;
  }
  Mutex mu_;
  CondVar changed_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Progress between two log lines.
struct Window {
  double loss = 0;
  uint64_t correct = 0, samples = 0, steps = 0;
  double staleness = 0;
  uint64_t max_staleness = 0;
  absl::Duration blocked;
  absl::Time start = absl::Now();
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
  absl::StatusOr<SegmentModel> model_or =
      SegmentModel::Create(backend, config.model(), segment, static_cast<int>(batch));
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
  const size_t staged_rows = device ? batch : 0;
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
  const Range slice = WorkerSlice(config, train.size(), segment, rank);
  if (slice.count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(tag, ": its data slice is empty (", train.size(),
                                                      " training samples for too many workers)"));
  }
  // A file-backed data set maps only this worker's rows.
  SEGPS_RETURN_IF_ERROR(train.MapRows(slice));
  const uint64_t steps_per_epoch = StepsPerEpoch(slice.count, batch);
  const uint64_t total_steps = steps_per_epoch * epochs;
  SEGPS_LOG_INFO << tag << ": registered at clock " << start << " on " << backend->name() << "; "
                 << slice.count << " samples [" << slice.offset << ", " << slice.end() << "), " << epochs
                 << " epochs of " << steps_per_epoch << " steps, batch " << batch << ", staleness "
                 << (staleness < 0 ? std::string("unbounded") : std::to_string(staleness))
                 << (config.training().gradient_topk() > 0
                         ? absl::StrCat(", top-k pushes of ", config.training().gradient_topk() * 100, "% of ", n)
                         : std::string());

  HeartbeatLoop heartbeat(client, absl::Milliseconds(config.cluster().lease_ms()) / 3);
  if (options.metrics != nullptr) options.metrics->SetRank(rank);
  // Top-k pushes carry k (index, value) pairs; pulls are always dense.
  std::optional<TopK> topk;
  if (config.training().gradient_topk() > 0) topk.emplace(n, config.training().gradient_topk());
  const size_t element_bytes = DTypeBytes(config.cluster().wire_dtype());
  const uint64_t pull_bytes = n * element_bytes;
  const uint64_t push_bytes = topk ? topk->k() * (sizeof(uint32_t) + element_bytes) : pull_bytes;
  Pusher pusher(client, PushesInFlight(config, segment), options.metrics, push_bytes);
  Prefetcher prefetcher(client, segment, options.metrics, pull_bytes);
  // The step's gradient, encoded for the wire.
  auto encode = [&](uint64_t clock, const float* grad) {
    if (!topk) return client->Encode(segment, clock, absl::MakeConstSpan(grad, n));
    topk->Select(absl::MakeConstSpan(grad, n));
    return client->EncodeSparse(segment, clock, topk->indices(), topk->values());
  };
  // Staleness 0: every step waits for the previous push anyway, so each step
  // pushes and pulls in the same calls instead of overlapping them.
  const bool synchronous = staleness == 0;
  int fill = 0;  // the pull buffer the outstanding pull fills
  prefetcher.Start(start, absl::MakeSpan(pulled[fill]->data(), n));

  TrainReport report;
  std::optional<uint64_t> have;  // clock the model's parameters reflect
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

  // Gathers step `s` of an epoch's order on the host and enqueues its upload
  // into input slot `slot` (on the CPU, gathers straight into the slot);
  // returns its rows.
  auto stage = [&](const std::vector<uint32_t>& order, uint64_t s, int slot) -> absl::StatusOr<size_t> {
    const size_t begin = s * batch;
    const size_t rows = std::min<size_t>(batch, slice.count - begin);
    if (!device) {
      GatherBatch(train, order, begin, rows, model.input(slot), model.labels(slot));
      return rows;
    }
    GatherBatch(train, order, begin, rows, batch_x[slot]->data(), batch_y[slot]->data<int32_t>());
    SEGPS_RETURN_IF_ERROR(backend->Upload(batch_x[slot]->data(), model.input(slot), rows * width * sizeof(float)));
    SEGPS_RETURN_IF_ERROR(backend->Upload(batch_y[slot]->data(), model.labels(slot), rows * sizeof(int32_t)));
    return rows;
  };
  std::vector<uint32_t> order = EpochOrder(slice, config.seed(), segment, rank, 0), next_order;
  int slot = 0;
  absl::StatusOr<size_t> staged = stage(order, 0, slot);
  if (!staged.ok()) return staged.status();

  for (uint32_t epoch = 0; epoch < epochs; ++epoch) {
    epoch_window = Window();
    epoch_window.start = absl::Now();
    for (uint64_t s = 0; s < steps_per_epoch; ++s) {
      const uint64_t clock = start + epoch * steps_per_epoch + s;
      // Parameters reflecting clock r may serve step `clock` when r >= clock - staleness.
      auto fresh_enough = [&] {
        return have.has_value() &&
               (staleness < 0 || *have + static_cast<uint64_t>(staleness) >= clock);
      };
      while (!fresh_enough() || prefetcher.done()) {
        const absl::Time wait_start = absl::Now();
        if (!prefetcher.outstanding()) {
          prefetcher.Start(clock, absl::MakeSpan(pulled[fill]->data(), n));
        }
        absl::StatusOr<uint64_t> r = prefetcher.Take();
        count_blocked(absl::Now() - wait_start);
        if (!r.ok()) return r.status();
        SEGPS_RETURN_IF_ERROR(backend->Upload(pulled[fill]->data(), model.params(), n * sizeof(float)));
        // The next pull may land in the buffer just uploaded from: the copy must be done first.
        SEGPS_RETURN_IF_ERROR(backend->Synchronize());
        have = *r;
        fill ^= 1;
        // Prefetch for the next step; the server answers once the bound allows.
        if (!synchronous) prefetcher.Start(clock + 1, absl::MakeSpan(pulled[fill]->data(), n));
      }

      const size_t rows = *staged;
      SEGPS_RETURN_IF_ERROR(model.TrainStep(static_cast<int>(rows), slot));
      // On the CPU the gradient is read where it is; a GPU's comes back through pinned memory.
      const float* grad = model.grad();
      if (device) {
        SEGPS_RETURN_IF_ERROR(backend->Download(model.grad(), grad_host->data(), n * sizeof(float)));
        grad = grad_host->data();
      }
      SEGPS_RETURN_IF_ERROR(model.DownloadStats());
      // Stage the next batch while this step runs on the device.
      if (s + 1 < steps_per_epoch) {
        staged = stage(order, s + 1, slot ^ 1);
      } else if (epoch + 1 < epochs) {
        next_order = EpochOrder(slice, config.seed(), segment, rank, epoch + 1);
        staged = stage(next_order, 0, slot ^ 1);
      }
      if (!staged.ok()) return staged.status();
      SEGPS_RETURN_IF_ERROR(backend->Synchronize());
      slot ^= 1;
      const BatchStats stats = model.stats();
      if (!std::isfinite(stats.loss_sum)) {
        return absl::InternalError(absl::StrCat(tag, ": loss became ", stats.loss_sum, " at clock ", clock,
                                                "; lower optimizer.learning_rate"));
      }
      const uint64_t lag = clock - std::min(clock, *have);  // clocks this step's parameters lagged
      const bool last = epoch + 1 == epochs && s + 1 == steps_per_epoch;
      if (synchronous && !last) {
        // The next step needs this push applied: push and pull in one round
        // trip. Nothing computes meanwhile, so on the CPU the values land in
        // the model itself.
        std::unique_ptr<EncodedPush> push = encode(clock, grad);
        float* dest = device ? pulled[fill]->data() : model.params();
        const absl::Time wait_start = absl::Now();
        absl::StatusOr<uint64_t> r = client->SendAndPull(*push, absl::MakeSpan(dest, n));
        const absl::Duration waited = absl::Now() - wait_start;
        count_blocked(waited);
        if (options.metrics != nullptr) {
          options.metrics->ObservePush(absl::ToDoubleSeconds(waited), push_bytes);
          options.metrics->ObservePull(absl::ToDoubleSeconds(waited), pull_bytes);
        }
        if (!r.ok()) return r.status();
        if (dest != model.params()) {
          SEGPS_RETURN_IF_ERROR(backend->Upload(dest, model.params(), n * sizeof(float)));
          SEGPS_RETURN_IF_ERROR(backend->Synchronize());
        }
        have = *r;
      } else {
        SEGPS_RETURN_IF_ERROR(pusher.Enqueue(encode(clock, grad)));
      }
      if (options.slowdown > absl::ZeroDuration()) absl::SleepFor(options.slowdown);

      for (Window* w : {&window, &epoch_window}) {
        w->loss += stats.loss_sum;
        w->correct += stats.correct;
        w->samples += rows;
        w->steps += 1;
        w->staleness += static_cast<double>(lag);
        w->max_staleness = std::max(w->max_staleness, lag);
      }
      staleness_sum += static_cast<double>(lag);
      if (options.metrics != nullptr) {
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
        const std::string line = absl::StrFormat(
            "%s: epoch %u/%u step %d/%d loss %.4f acc %.4f samples/s %.0f staleness avg %.2f max %d blocked %.0f%%",
            tag, epoch + 1, epochs, report.steps, total_steps, window.loss / window.samples,
            static_cast<double>(window.correct) / window.samples, window.samples / secs,
            window.staleness / window.steps, window.max_staleness,
            100.0 * absl::ToDoubleSeconds(window.blocked) / secs);
        if (options.progress_bar) {
          const int width_bar = 30;
          const int filled = static_cast<int>(width_bar * report.steps / total_steps);
          std::printf("\r[%s%s] %s", std::string(filled, '#').c_str(),
                      std::string(width_bar - filled, '.').c_str(), line.c_str());
          std::fflush(stdout);
        } else {
          SEGPS_LOG_INFO << line;
        }
        if (options.metrics != nullptr) options.metrics->SetSamplesPerSecond(window.samples / secs);
        window = Window();
        next_log = now + log_every;
      }
    }
    report.last_loss = epoch_window.loss / epoch_window.samples;
    report.last_accuracy = static_cast<double>(epoch_window.correct) / epoch_window.samples;
    v1::EpochRecord* record = report.history.add_epochs();
    record->set_epoch(epoch + 1);
    record->set_train_seconds(absl::ToDoubleSeconds(absl::Now() - t0 - scoring_time));
    record->set_loss(report.last_loss);
    record->set_accuracy(report.last_accuracy);
    record->set_samples_per_second(
        epoch_window.samples / std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - epoch_window.start)));
    record->set_mean_staleness(epoch_window.staleness / epoch_window.steps);
    record->set_blocked_seconds(absl::ToDoubleSeconds(epoch_window.blocked));
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
      if (options.test_probabilities != nullptr) options.test_probabilities->push_back(*std::move(probs));
      SEGPS_LOG_INFO << absl::StrFormat("%s: epoch %u test accuracy %.4f after %.2f s of training", tag, epoch + 1,
                                        accuracy, record->train_seconds());
      scoring_time += absl::Now() - scoring;
    }
    if (epoch + 1 < epochs) order = std::move(next_order);
  }
  if (options.progress_bar) std::printf("\n");
  SEGPS_RETURN_IF_ERROR(pusher.Drain());
  report.seconds = absl::ToDoubleSeconds(absl::Now() - t0 - scoring_time);
  report.blocked_seconds = absl::ToDoubleSeconds(blocked);
  report.history.set_segment(seg.name());
  report.history.set_rank(rank);
  report.mean_staleness = report.steps ? staleness_sum / report.steps : 0;
  // The outstanding prefetch may wait on peers; it is abandoned with the
  // prefetcher once we leave (the server answers it or its deadline ends it).
  absl::Status left = client->Leave();
  if (!left.ok()) SEGPS_LOG_WARNING << tag << ": leave: " << left.message();
  return report;
}

}  // namespace segps
