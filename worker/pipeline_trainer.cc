#include "worker/pipeline_trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/log.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "worker/heartbeat_loop.h"
#include "worker/segment_model.h"

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
std::vector<std::pair<uint32_t, bool>> Schedule(v1::PipelineSchedule schedule, uint32_t count, uint32_t warmup) {
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

double PeakResidentMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
}

}  // namespace

absl::StatusOr<TrainReport> TrainStage(const v1::JobConfig& config, const StageOptions& options,
                                       const Dataset* train, Backend* backend, ParameterClient* client) {
  const int stage = options.stage;
  const int stages = config.model().segments_size();
  const bool first_stage = stage == 0, last_stage = stage + 1 == stages;
  if ((options.upstream == nullptr) != first_stage || (options.downstream == nullptr) != last_stage ||
      (first_stage && train == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", stage, " of ", stages,
                                                   ": links or data do not fit its place in the chain"));
  }
  const uint32_t batch = config.training().batch_size();
  const uint32_t micro = config.training().micro_batches();
  const uint32_t micro_rows = (batch + micro - 1) / micro;
  // GPIPE holds every micro-batch of a clock; 1F1B at most K - k at once.
  const bool gpipe = config.training().schedule() == v1::GPIPE;
  const uint32_t slots = gpipe ? micro : std::min<uint32_t>(micro, static_cast<uint32_t>(stages - stage));
  absl::StatusOr<SegmentModel> model_or =
      SegmentModel::Create(backend, config.model(), stage, static_cast<int>(slots * micro_rows));
  if (!model_or.ok()) return model_or.status();
  SegmentModel& model = *model_or;
  const size_t n = model.num_params();
  const size_t in_width = static_cast<size_t>(model.input_width());
  const size_t out_width = static_cast<size_t>(model.output_width());

  absl::StatusOr<Registration> registration = client->Register(stage, options.replica);
  if (!registration.ok()) return registration.status();
  const std::string tag = absl::StrCat(config.model().segments(stage).name(), "/", options.replica);
  uint64_t clock = registration->start_clock;
  if (options.metrics != nullptr) options.metrics->SetRank(options.replica);
  StageMetrics* const stage_metrics = options.stage_metrics;

  // Stage 0's schedule of clocks; the others follow the activations.
  Range slice;
  uint64_t steps_per_epoch = 0, total_steps = 0;
  if (first_stage) {
    slice = WorkerSlice(config, train->size(), 0, options.replica);
    if (slice.count == 0) return absl::FailedPreconditionError(absl::StrCat(tag, ": its data slice is empty"));
    SEGPS_RETURN_IF_ERROR(train->MapRows(slice));
    steps_per_epoch = StepsPerEpoch(slice.count, batch);
    total_steps = steps_per_epoch * config.training().epochs();
  }
  SEGPS_LOG_INFO << tag << ": stage " << stage << " of " << stages << ", registered at clock " << clock << " on "
                 << backend->name() << "; " << n << " parameters, " << micro << " micro-batches of up to "
                 << micro_rows << " rows, " << (gpipe ? "GPIPE" : "ONE_F_ONE_B") << " (" << slots
                 << " held at once)"
                 << (first_stage ? absl::StrCat("; ", slice.count, " samples, ", total_steps, " steps") : std::string());

  HeartbeatLoop heartbeat(client, absl::Milliseconds(config.cluster().lease_ms()) / 3);
  std::vector<float> params(n), host_values, host_grad(backend->host_addressable() ? 0 : n);
  auto load_params = [&]() -> absl::Status {
    SEGPS_RETURN_IF_ERROR(backend->Upload(params.data(), model.params(), n * sizeof(float)));
    return backend->Synchronize();
  };
  absl::StatusOr<uint64_t> pulled = client->Pull(stage, clock, absl::MakeSpan(params));
  if (!pulled.ok()) return pulled.status();
  uint64_t have = *pulled;  // the clock the parameters reflect
  SEGPS_RETURN_IF_ERROR(load_params());

  TrainReport report;
  const absl::Time t0 = absl::Now();
  absl::Duration waiting;  // for a neighbour's message
  uint64_t link_bytes = 0;  // activations and their gradients, both ways, both links
  absl::Time next_log = t0 + absl::Seconds(config.training().log_interval_s());
  double epoch_loss = 0;
  uint64_t epoch_correct = 0, epoch_samples = 0;
  std::vector<uint32_t> order;
  std::optional<uint64_t> order_epoch;
  std::vector<int32_t> labels(static_cast<size_t>(slots) * micro_rows);  // per slot, for the next stage
  const std::vector<uint32_t>* epoch_order = nullptr;

  // Copies host bytes to the device and waits for the copy: the stage's
  // host buffers (a received message, the staging buffer) are freed or
  // reused right after.
  auto upload = [&](const void* host, void* device, size_t bytes) -> absl::Status {
    SEGPS_RETURN_IF_ERROR(backend->Upload(host, device, bytes));
    return backend->host_addressable() ? absl::OkStatus() : backend->Synchronize();
  };
  // Receives from upstream, accounting the wait.
  // Accounts a wait for a neighbour that began at `start`, and values that
  // crossed a link, for the log and the stage's metrics.
  auto waited = [&](StageMetrics::Neighbour neighbour, absl::Time start) {
    const absl::Duration wait = absl::Now() - start;
    waiting += wait;
    if (stage_metrics != nullptr) stage_metrics->ObserveWaiting(neighbour, absl::ToDoubleSeconds(wait));
  };
  auto crossed = [&](void (StageMetrics::*observe)(uint64_t), size_t floats) {
    link_bytes += floats * sizeof(float);
    if (stage_metrics != nullptr) (stage_metrics->*observe)(floats * sizeof(float));
  };
  auto receive = [&]() -> absl::StatusOr<MicroBatch> {
    const absl::Time start = absl::Now();
    absl::StatusOr<MicroBatch> got = options.upstream->Receive(options.patience);
    waited(StageMetrics::Neighbour::kPrevious, start);
    if (got.ok()) crossed(&StageMetrics::ObserveActivationsReceived, got->values.size());
    return got;
  };
  // Downloads `count` floats from device `from` into host_values (in place on the CPU).
  auto to_host = [&](const float* from, size_t count) -> absl::StatusOr<absl::Span<const float>> {
    if (backend->host_addressable()) return absl::MakeConstSpan(from, count);
    host_values.resize(count);
    SEGPS_RETURN_IF_ERROR(backend->Download(from, host_values.data(), count * sizeof(float)));
    SEGPS_RETURN_IF_ERROR(backend->Synchronize());
    return absl::MakeConstSpan(host_values);
  };

  // Ends the pass that started at `start`: on a slower device it takes
  // slowdown_factor times as long, and at least `weight` x pass_time.
  auto end_pass = [&](absl::Time start, int weight) -> absl::Status {
    if (options.slowdown_factor > 1 || options.pass_time > absl::ZeroDuration()) {
      SEGPS_RETURN_IF_ERROR(backend->Synchronize());
      absl::SleepFor((absl::Now() - start) * (options.slowdown_factor - 1));
      absl::SleepFor(start + options.pass_time * weight - absl::Now());
    }
    if (stage_metrics != nullptr) stage_metrics->ObserveBusy(absl::ToDoubleSeconds(absl::Now() - start));
    return absl::OkStatus();
  };
  // The idle share counts from the end of the first clock.
  absl::Time steady_start = t0;
  absl::Duration steady_waiting;
  std::optional<MicroBatch> pending;  // stage > 0: the first message of the next clock, already received
  for (;; ++clock) {
    // This clock's mini-batch: its rows and how many micro-batches cut it.
    uint32_t batch_rows = 0;
    if (first_stage) {
      if (clock >= total_steps) break;
      const uint32_t epoch = static_cast<uint32_t>(clock / steps_per_epoch);
      if (order_epoch != epoch) {
        order = EpochOrder(slice, config.seed(), 0, options.replica, epoch);
        order_epoch = epoch;
        epoch_loss = 0;
        epoch_correct = epoch_samples = 0;
      }
      epoch_order = &order;
      const uint64_t begin = (clock % steps_per_epoch) * batch;
      batch_rows = static_cast<uint32_t>(std::min<uint64_t>(batch, slice.count - begin));
    } else {
      if (!pending.has_value()) {
        absl::StatusOr<MicroBatch> got = receive();
        if (!got.ok()) return got.status();
        pending = *std::move(got);
      }
      if (pending->done) break;
      if (pending->clock != clock || pending->micro_batch != 0) {
        return absl::FailedPreconditionError(absl::StrCat(tag, ": expected clock ", clock, " micro-batch 0 from stage ",
                                                          stage - 1, ", got clock ", pending->clock, " micro-batch ",
                                                          pending->micro_batch));
      }
      batch_rows = pending->batch_rows;
      if (batch_rows > batch) {
        return absl::InvalidArgumentError(absl::StrCat(tag, ": a mini-batch of ", batch_rows, " rows (batch_size ", batch, ")"));
      }
    }
    const uint32_t count = std::min(micro, batch_rows);
    double clock_loss = 0;
    uint64_t clock_correct = 0;
    const float grad_scale = 1.0f / static_cast<float>(batch_rows);
    bool accumulate = false;
    for (const auto& [m, forward] : Schedule(config.training().schedule(), count,
                                             static_cast<uint32_t>(stages - stage - 1))) {
      const Part part = MicroPart(batch_rows, count, m);
      const int first = static_cast<int>((m % slots) * micro_rows);
      if (forward) {
        int32_t* slot_labels = labels.data() + first;
        if (first_stage) {
          const uint64_t begin = (clock % steps_per_epoch) * batch + part.first;
          if (backend->host_addressable()) {
            GatherBatch(*train, *epoch_order, begin, part.rows, model.input() + first * in_width, slot_labels);
          } else {
            host_values.resize(part.rows * in_width);
            GatherBatch(*train, *epoch_order, begin, part.rows, host_values.data(), slot_labels);
            SEGPS_RETURN_IF_ERROR(upload(host_values.data(), model.input() + first * in_width,
                                                  host_values.size() * sizeof(float)));
          }
        } else {
          MicroBatch got;
          if (m == 0) {
            got = *std::move(pending);
            pending.reset();
          } else {
            absl::StatusOr<MicroBatch> next = receive();
            if (!next.ok()) return next.status();
            got = *std::move(next);
          }
          if (got.done || got.clock != clock || got.micro_batch != m || got.rows != part.rows ||
              got.batch_rows != batch_rows) {
            return absl::FailedPreconditionError(absl::StrCat(
                tag, ": expected clock ", clock, " micro-batch ", m, " of ", part.rows, " rows from stage ", stage - 1,
                got.done ? ", got the end of training" : absl::StrCat(", got clock ", got.clock, " micro-batch ",
                                                                      got.micro_batch, " of ", got.rows, " rows")));
          }
          std::copy(got.labels.begin(), got.labels.end(), slot_labels);
          SEGPS_RETURN_IF_ERROR(upload(got.values.data(), model.input() + first * in_width,
                                                got.values.size() * sizeof(float)));
        }
        if (last_stage) {
          SEGPS_RETURN_IF_ERROR(
              upload(slot_labels, model.labels() + first, part.rows * sizeof(int32_t)));
        }
        const absl::Time compute = absl::Now();
        SEGPS_RETURN_IF_ERROR(model.StageForward(first, static_cast<int>(part.rows), grad_scale));
        SEGPS_RETURN_IF_ERROR(end_pass(compute, 1));
        if (last_stage) {
          SEGPS_RETURN_IF_ERROR(model.DownloadStats());
          SEGPS_RETURN_IF_ERROR(backend->Synchronize());
          clock_loss += model.stats().loss_sum;
          clock_correct += static_cast<uint64_t>(model.stats().correct);
        } else {
          absl::StatusOr<absl::Span<const float>> out = to_host(model.output(first), part.rows * out_width);
          if (!out.ok()) return out.status();
          SEGPS_RETURN_IF_ERROR(options.downstream->Send(clock, m, batch_rows, *out,
                                                         absl::MakeConstSpan(slot_labels, part.rows)));
          crossed(&StageMetrics::ObserveActivationsSent, out->size());
        }
      } else {
        if (!last_stage) {
          const absl::Time start = absl::Now();
          absl::StatusOr<std::vector<float>> grad = options.downstream->ReceiveGradient(options.patience);
          waited(StageMetrics::Neighbour::kNext, start);
          if (!grad.ok()) return grad.status();
          crossed(&StageMetrics::ObserveGradientsReceived, grad->size());
          SEGPS_RETURN_IF_ERROR(
              upload(grad->data(), model.output_grad(first), grad->size() * sizeof(float)));
        }
        const absl::Time compute = absl::Now();
        SEGPS_RETURN_IF_ERROR(model.StageBackward(first, static_cast<int>(part.rows), accumulate, !first_stage));
        SEGPS_RETURN_IF_ERROR(end_pass(compute, 2));
        accumulate = true;
        if (!first_stage) {
          absl::StatusOr<absl::Span<const float>> d_in = to_host(model.input_grad(first), part.rows * in_width);
          if (!d_in.ok()) return d_in.status();
          SEGPS_RETURN_IF_ERROR(options.upstream->SendGradient(clock, m, *d_in));
          crossed(&StageMetrics::ObserveGradientsSent, d_in->size());
        }
      }
    }
    // One update per mini-batch: the sum of its micro-batches' gradients.
    SEGPS_RETURN_IF_ERROR(backend->Synchronize());
    const float* grad = model.grad();
    if (!backend->host_addressable()) {
      SEGPS_RETURN_IF_ERROR(backend->Download(grad, host_grad.data(), n * sizeof(float)));
      SEGPS_RETURN_IF_ERROR(backend->Synchronize());
      grad = host_grad.data();
    }
    std::unique_ptr<EncodedPush> push = client->Encode(stage, clock, absl::MakeConstSpan(grad, n));
    absl::StatusOr<uint64_t> next = client->SendAndPull(*push, absl::MakeSpan(params));
    if (!next.ok()) return next.status();
    SEGPS_RETURN_IF_ERROR(load_params());
    const uint64_t lag = clock - std::min(clock, have);  // clocks this step's parameters lagged
    have = *next;
    epoch_loss += clock_loss;
    epoch_correct += clock_correct;
    if (options.metrics != nullptr && last_stage) {
      options.metrics->ObserveStep(clock_loss / batch_rows, static_cast<double>(clock_correct) / batch_rows,
                                   batch_rows, lag, clock + 1);
    } else if (options.metrics != nullptr) {
      options.metrics->ObserveStep(batch_rows, lag, clock + 1);
    }
    if (report.steps == 0) {
      steady_start = absl::Now();
      steady_waiting = waiting;
    } else if (stage_metrics != nullptr) {
      stage_metrics->SetIdleShare(absl::ToDoubleSeconds(waiting - steady_waiting) /
                                  std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - steady_start)));
    }
    ++report.steps;
    report.samples += batch_rows;
    epoch_samples += batch_rows;
    if (last_stage && epoch_samples > 0) {
      report.last_loss = epoch_loss / static_cast<double>(epoch_samples);
      report.last_accuracy = static_cast<double>(epoch_correct) / static_cast<double>(epoch_samples);
    }
    if (absl::Now() >= next_log) {
      next_log = absl::Now() + absl::Seconds(config.training().log_interval_s());
      SEGPS_LOG_INFO << tag << ": step " << clock + 1
                     << (first_stage ? absl::StrCat("/", total_steps) : std::string())
                     << (last_stage ? absl::StrCat(" loss ", report.last_loss, " acc ", report.last_accuracy)
                                    : std::string());
    }
  }
  if (options.downstream != nullptr) SEGPS_RETURN_IF_ERROR(options.downstream->Finish());
  const absl::Time end = absl::Now();
  report.seconds = absl::ToDoubleSeconds(end - t0);
  report.blocked_seconds = absl::ToDoubleSeconds(waiting);
  const double steady = absl::ToDoubleSeconds(end - steady_start);
  const double idle = absl::ToDoubleSeconds(waiting - steady_waiting);
  SEGPS_LOG_INFO << tag << ": idle share " << (steady > 0 ? idle / steady : 0) << " (" << idle << " s of " << steady
                 << " s after the first clock waiting for its neighbours); "
                 << (report.steps > 0 ? link_bytes / report.steps : 0)
                 << " bytes of activations and their gradients a clock over its links; peak resident memory "
                 << PeakResidentMiB() << " MiB";
  SEGPS_RETURN_IF_ERROR(client->Leave());
  return report;
}

}  // namespace segps
