#include "server/parameter_server.h"

#include <sys/random.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/balance.h"
#include "common/log.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "common/tensor_wire.h"
#include "server/optimizer.h"
#include "server/row_requests.h"

namespace segps {
namespace {

// Values in their wire dtype as a string, for the whole-message calls.
void ReadInto(std::string* bytes, absl::Span<const float> values, v1::DType dtype) {
  bytes->resize(values.size() * DTypeBytes(dtype));
  EncodeValuesTo(values, dtype, bytes->data());
}

// Runs `call` (which completes through the Done it is given) and waits for it.
absl::Status Wait(absl::FunctionRef<void(ParameterServer::Done)> call) {
  Latch done(1);
  absl::Status status;
  call([&](absl::Status s) {
    status = std::move(s);
    done.CountDown();
  });
  done.Wait();
  return status;
}

}  // namespace

ParameterServer::ParameterServer(v1::JobConfig config, uint32_t index, ShardMap map, const ServerOptions& options)
    : config_(std::move(config)), index_(index), map_(std::move(map)),
      model_fingerprint_(ModelFingerprint(config_)),
      max_wait_(absl::Milliseconds(config_.cluster().pull_wait_ms())), metrics_(options.metrics),
      clock_(options.clock), authenticated_(options.authenticated), state_key_(options.state_key),
      rolled_back_at_(config_.model().segments_size(), absl::InfinitePast()) {}

ParameterServer::~ParameterServer() {
  if (ticker_.joinable()) {
    {
      MutexLock lock(&ticker_mu_);
      ticker_stop_ = true;
    }
    ticker_wake_.SignalAll();
    ticker_.join();
  }
  if (writer_.joinable()) {
    {
      MutexLock lock(&writer_mu_);
      writer_stop_ = true;  // what is cut is still written
      writer_wake_.SignalAll();
    }
    writer_.join();
  }
}

void ParameterServer::WriteCheckpoints() {
  MutexLock lock(&writer_mu_);
  while (true) {
    while (to_write_.empty() && !writer_stop_) writer_wake_.Wait(&writer_mu_);
    if (to_write_.empty()) return;
    auto [segment, state] = std::move(to_write_.front());
    to_write_.pop_front();
    writing_ = true;
    writer_mu_.Unlock();
    shards_[segment]->CutRoomMade();
    const absl::Time start = absl::Now();
    absl::Status written = store_->Write(segment, *state);
    if (written.ok()) {
      if (std::optional<std::string> line =
              checkpoint_report_.Written(config_.model().segments(segment).name(), state->clock,
                                         store_->Path(segment, state->clock), absl::Now() - start, clock_->Now())) {
        SEGPS_LOG_INFO << *line;
      }
    } else {
      SEGPS_LOG_ERROR << "server " << index_ << ": checkpoint of " << config_.model().segments(segment).name()
                      << " at clock " << state->clock << " failed: " << written.message()
                      << " (the previous checkpoints stay valid)";
    }
    writer_mu_.Lock();
    writing_ = false;
    writer_wake_.SignalAll();
  }
}

void ParameterServer::FlushCheckpoints() {
  if (!writer_.joinable()) return;
  MutexLock lock(&writer_mu_);
  while (!to_write_.empty() || writing_) writer_wake_.Wait(&writer_mu_);
}

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(const v1::JobConfig& config,
                                                                         uint32_t index,
                                                                         const ServerOptions& server_options) {
  if (index >= config.cluster().num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("server index ", index, " is out of range: the config has ",
                                                   config.cluster().num_servers(), " servers"));
  }
  absl::StatusOr<ShardMap> map = ShardMap::Create(config.model(), config.cluster().num_servers(),
                                                  config.cluster().replicas());
  if (!map.ok()) return map.status();
  std::unique_ptr<ParameterServer> server(new ParameterServer(config, index, *std::move(map), server_options));
  if (getrandom(&server->incarnation_, sizeof(server->incarnation_), 0) != sizeof(server->incarnation_)) {
    return absl::UnavailableError("the system's random source failed");
  }
  const std::string dir = server_options.checkpoint_dir.empty() ? config.checkpoint().dir() : server_options.checkpoint_dir;
  if (!dir.empty()) {
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(config, index, dir);
    if (!store.ok()) return store.status();
    server->store_ = *std::move(store);
  }
  const int segments = server->map_.num_segments();
  if (server_options.apply_threads > 1) server->apply_pool_ = std::make_unique<ApplyPool>(server_options.apply_threads);
  server->rejected_ = std::make_unique<std::atomic<uint64_t>[]>(segments + 1);
  server->push_bytes_ = std::make_unique<std::atomic<uint64_t>[]>(segments);
  server->pull_bytes_ = std::make_unique<std::atomic<uint64_t>[]>(segments);
  server->region_bytes_ = std::make_unique<std::atomic<uint64_t>[]>(segments);
  SEGPS_RETURN_IF_ERROR(server->AddReplicas());
  for (int k = 0; k < segments; ++k) SEGPS_RETURN_IF_ERROR(server->AddShard(k));
  server->StartThreads(server_options.tick);
  return server;
}

ShardOptions ParameterServer::ShardOptionsFor(int k) {
  const v1::JobConfig& config = config_;
  ShardOptions options;
  options.segment = k;
  options.range = map_.range(k, index_);
  options.staleness = StalenessOf(config, k);
  options.max_clock_ahead = PushesInFlight(config, k) + 1;
  options.lease = absl::Milliseconds(config.cluster().lease_ms());
  options.momentum_lookahead = config.optimizer().momentum_lookahead();
  options.apply_pool = apply_pool_.get();
  options.row_budget = &row_budget_;
  options.clock = clock_;
  options.max_waiting_per_worker = config.cluster().max_waiting_calls();
  options.ranks = WorkersOf(config, k);
  options.hold_for_joiners = options.staleness == 0;
  if (!logs_.empty()) options.replicas = logs_[k].get();
  if (config.training().has_balance()) {
    const v1::BalanceConfig& balance = config.training().balance();
    options.batch_size = config.training().batch_size();
    // Server 0 decides every segment's shares: one place that every worker
    // already calls each step, so all see the same decisions.
    if (index_ == 0) {
      ShardOptions::Balance decide;
      decide.initial = InitialShares(config.training(), options.ranks);
      decide.every_clocks = balance.every_clocks();
      decide.least = MinShare(config.training());
      decide.hysteresis = std::max<uint32_t>(1, config.training().batch_size() / 50);
      decide.lead = static_cast<uint32_t>(options.staleness) + 2;
      options.balance = std::move(decide);
    }
  }
  if (store_ != nullptr) {
    options.checkpoint_every = config.checkpoint().every_clocks();
    options.checkpoint_interval = absl::Seconds(config.checkpoint().every_seconds());
    options.on_checkpoint = [this, k](std::shared_ptr<const ShardState> state) {
      MutexLock lock(&writer_mu_);
      to_write_.emplace_back(k, std::move(state));
      writer_wake_.SignalAll();
    };
    options.cut_room = [this, k](uint64_t clock) {
      MutexLock lock(&writer_mu_);
      for (const auto& [segment, state] : to_write_) {
        if (segment != k) continue;
        if (std::optional<std::string> line =
                checkpoint_report_.Waited(config_.model().segments(k).name(), clock, clock_->Now())) {
          SEGPS_LOG_WARNING << *line;
        }
        return false;
      }
      return true;
    };
  }
  return options;
}

absl::Status ParameterServer::AddShard(int k) {
  ShardOptions options = ShardOptionsFor(k);
  std::vector<float> values(options.range.count);
  InitializeRange(map_, k, options.range.offset, config_.seed(), values.data(), values.size());
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = CreateOptimizer(config_.optimizer(), options.range.count);
  if (!optimizer.ok()) return optimizer.status();
  EmbeddingTables tables;
  const v1::SegmentConfig& segment = config_.model().segments(k);
  for (int t = 0; t < segment.embeddings_size(); ++t) {
    tables.push_back(std::make_unique<EmbeddingTable>(segment.embeddings(t), config_.optimizer(), config_.seed(), k,
                                                      static_cast<uint32_t>(t), &row_budget_));
  }
  shards_.push_back(
      std::make_unique<SegmentShard>(options, std::move(values), *std::move(optimizer), std::move(tables)));
  if (store_ == nullptr) return absl::OkStatus();
  const absl::Time read_start = absl::Now();
  absl::StatusOr<std::optional<ShardState>> latest = store_->Latest(k);
  if (!latest.ok()) return latest.status();
  if (!latest->has_value()) return absl::OkStatus();
  shards_.back()->Restore(**latest, std::nullopt, nullptr);
  SEGPS_LOG_INFO << "server " << index_ << ": restored " << config_.model().segments(k).name() << " at clock "
                 << (*latest)->clock << " from " << store_->Path(k, (*latest)->clock)
                 << ((*latest)->ranks.empty() ? " (no rank was training then)"
                                              : absl::StrCat(" (ranks ", absl::StrJoin((*latest)->ranks, ","),
                                                             " resume there)"))
                 << ", read in "
                 << absl::ToDoubleMilliseconds(absl::Now() - read_start) << " ms"
                 << ((*latest)->changed.empty() ? "" : "; it goes on with ")
                 << absl::StrJoin((*latest)->changed, "; ");
  return absl::OkStatus();
}

void ParameterServer::StartThreads(absl::Duration tick) {
  if (store_ != nullptr) writer_ = std::thread([this] { WriteCheckpoints(); });
  if (tick <= absl::ZeroDuration()) return;
  ticker_ = std::thread([this, tick] {
    MutexLock lock(&ticker_mu_);
    while (!ticker_stop_) {
      ticker_wake_.WaitWithDeadline(&ticker_mu_, absl::Now() + tick);
      Tick();
    }
  });
}

absl::StatusOr<SegmentShard*> ParameterServer::ShardFor(uint32_t segment, const char* call) {
  if (segment >= shards_.size()) {
    return absl::NotFoundError(absl::StrCat(call, ": unknown segment ", segment, "; the model has ",
                                            shards_.size(), " segments"));
  }
  return shards_[segment].get();
}

absl::Status ParameterServer::Reject(uint32_t segment, absl::Status status) {
  rejected_[std::min<size_t>(segment, shards_.size())].fetch_add(1, std::memory_order_relaxed);
  if (metrics_ != nullptr) metrics_->ObserveRejected(static_cast<int>(segment));
  return status;
}

void ParameterServer::Pull(const v1::PullRequest& request, absl::Time deadline, ReadValues read,
                           v1::PullResponse* response, Done done, const std::string& caller) {
  absl::StatusOr<SegmentShard*> shard = ShardFor(request.segment(), "Pull");
  if (!shard.ok()) return std::move(done)(Reject(request.segment(), shard.status()));
  if (request.has_copy_of()) {
    absl::Status read_copy = ReadCopy(request, read, response);
    return std::move(done)(read_copy.ok() ? read_copy : Reject(request.segment(), std::move(read_copy)));
  }
  if (request.reader() != (request.worker_id() == 0)) {
    return std::move(done)(Reject(request.segment(), absl::InvalidArgumentError(
        "Pull: a reader pull has worker_id 0 and a worker pull has its registered worker_id")));
  }
  std::shared_ptr<SharedRegion> region;
  if (!request.reader()) {
    absl::Status known =
        CheckRegistration(request.worker_id(), request.registration_secret(), caller, "Pull", std::nullopt, &region);
    if (!known.ok()) return std::move(done)(Reject(request.segment(), std::move(known)));
  }
  const Range range = map_.range(request.segment(), index_);
  Range chunk = range;
  if (request.rows_only()) {
    chunk.count = 0;
  } else {
    absl::StatusOr<Range> asked = PulledChunk(request, range, "Pull", "this server's shard");
    if (!asked.ok()) return std::move(done)(Reject(request.segment(), asked.status()));
    chunk = *asked;
  }
  absl::StatusOr<v1::DType> reply_dtype = PulledDType(request, "Pull");
  if (!reply_dtype.ok()) return std::move(done)(Reject(request.segment(), reply_dtype.status()));
  const v1::DType dtype = *reply_dtype;
  std::optional<uint64_t> region_offset;
  if (request.has_reply_region_offset()) region_offset = request.reply_region_offset();
  if (absl::Status in_region = ReplyInRegion(region_offset, chunk.count * DTypeBytes(dtype), region, "Pull", &read);
      !in_region.ok()) {
    return std::move(done)(Reject(request.segment(), std::move(in_region)));
  }
  ReadRows read_rows;
  size_t row_bytes = 0;  // ids and values of the rows read
  if (request.rows_size() > 0) {
    absl::Status rows = chunk.offset == range.offset ? RowReader(request, region, response, &read_rows, &row_bytes)
                                                     : absl::InvalidArgumentError(
                                                           "Pull rows: rows go with the pull of the range's first "
                                                           "chunk (or rows_only)");
    if (!rows.ok()) return std::move(done)(Reject(request.segment(), std::move(rows)));
  }
  const absl::Time start = absl::Now();
  const uint32_t segment = request.segment();
  const uint64_t clock = request.clock();
  const bool reader = request.reader();
  (*shard)->Pull(
      request.worker_id(), clock, chunk.offset - range.offset, chunk.count, deadline,
      [read = std::move(read), dtype](absl::Span<const float> values) mutable { read(values, dtype); },
      [this, response, done = std::move(done), start, segment, clock, reader, chunk, dtype, row_bytes, region_offset,
       region_rows = RegionRowBytes(config_.model().segments(segment), request.rows())](
          absl::StatusOr<PullResult> result) mutable {
        if (!result.ok()) {
          // Moved, not copied: the status's text is read by the caller's thread.
          absl::Status failed = std::move(result).status();
          const bool unavailable = absl::IsUnavailable(failed);
          return std::move(done)(unavailable ? std::move(failed) : Reject(segment, std::move(failed)));
        }
        response->set_clock(result->clock);
        response->set_updates(result->updates);
        response->set_incarnation(incarnation_);
        if (result->plan.has_value()) *response->mutable_plan() = *std::move(result->plan);
        FillValues(segment, chunk, dtype, region_offset, response->mutable_values());
        region_bytes_[segment].fetch_add(region_rows, std::memory_order_relaxed);
        ObservePull(segment, start, chunk.count * DTypeBytes(dtype) + row_bytes,
                    reader || clock <= result->clock ? 0 : clock - result->clock, result->blocked);
        std::move(done)(absl::OkStatus());
      },
      std::move(read_rows));
}

absl::StatusOr<Range> ParameterServer::PulledChunk(const v1::PullRequest& request, Range range, const char* call,
                                                   const char* whose) {
  if (request.count() == 0) return range;
  const Range chunk{request.offset(), request.count()};
  if (chunk.offset < range.offset || chunk.count > range.count || chunk.offset - range.offset > range.count - chunk.count) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": range [", chunk.offset, ", ", chunk.offset + chunk.count,
                                                   ") is not within ", whose, " [", range.offset, ", ", range.end(),
                                                   ")"));
  }
  return chunk;
}

absl::StatusOr<v1::DType> ParameterServer::PulledDType(const v1::PullRequest& request, const char* call) {
  const v1::DType dtype = request.dtype() == v1::DTYPE_UNSPECIFIED ? v1::FLOAT32 : request.dtype();
  if (DTypeBytes(dtype) != 0) return dtype;
  return absl::InvalidArgumentError(absl::StrCat(call, ": dtype ", static_cast<int>(dtype), " (", v1::DType_Name(dtype),
                                                 ") is not supported; ask for FLOAT32, BFLOAT16 or FLOAT16"));
}

absl::Status ParameterServer::PushedRows(const v1::PushRequest& request, Range range, const SharedRegion* region,
                                         std::vector<RowGradients>* rows) const {
  if (request.rows_size() == 0) return absl::OkStatus();
  if (request.gradient().offset() != range.offset) {
    return absl::InvalidArgumentError("Push rows: rows go with the step's first chunk (offset at the range's start)");
  }
  const int segment = static_cast<int>(request.segment());
  absl::StatusOr<std::vector<RowGradients>> parsed = ParseRows(config_.model().segments(segment), segment, index_,
                                                               map_.num_servers(), request.rows(), true, region, "Push");
  if (!parsed.ok()) return parsed.status();
  *rows = *std::move(parsed);
  return absl::OkStatus();
}

absl::Status ParameterServer::RowReader(const v1::PullRequest& request, std::shared_ptr<SharedRegion> region,
                                        v1::PullResponse* response, ReadRows* read, size_t* bytes) const {
  const int segment = static_cast<int>(request.segment());
  const v1::SegmentConfig& config = config_.model().segments(segment);
  absl::StatusOr<std::vector<RowGradients>> asked =
      ParseRows(config, segment, index_, map_.num_servers(), request.rows(), false, region.get(), "Pull");
  if (!asked.ok()) return asked.status();
  for (const RowGradients& r : *asked) {
    *bytes += r.ids.size() * (sizeof(uint64_t) + sizeof(float) * config.embeddings(static_cast<int>(r.table)).dim());
  }
  // The reply must fit a message: a request cannot make the server build a larger one.
  if (*bytes + 4096 > config_.cluster().max_message_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("Pull rows: the rows asked for take ", *bytes,
                                                   " bytes, more than cluster.max_message_bytes (",
                                                   config_.cluster().max_message_bytes(), ") allows in a reply"));
  }
  for (const RowGradients& r : *asked) {
    if (metrics_ != nullptr) metrics_->ObserveRowsPulled(segment, r.ids.size());
  }
  // The region stays mapped until the rows are read into it.
  *read = [asked = *std::move(asked), out = response->mutable_rows(), region = std::move(region)](
              const EmbeddingTables& tables) { ReadTableRows(tables, asked, out); };
  return absl::OkStatus();
}

void ParameterServer::FillValues(uint32_t segment, Range chunk, v1::DType dtype,
                                 std::optional<uint64_t> region_offset, v1::TensorSlice* values) {
  values->set_offset(chunk.offset);
  values->set_count(chunk.count);
  values->set_dtype(dtype);
  if (!region_offset.has_value()) return;
  values->set_region_offset(*region_offset);
  region_bytes_[segment].fetch_add(chunk.count * DTypeBytes(dtype), std::memory_order_relaxed);
}

void ParameterServer::ObservePull(uint32_t segment, absl::Time start, size_t bytes, uint64_t staleness,
                                  absl::Duration blocked) {
  pull_bytes_[segment].fetch_add(bytes, std::memory_order_relaxed);
  if (metrics_ == nullptr) return;
  metrics_->ObservePull(static_cast<int>(segment), absl::ToDoubleSeconds(absl::Now() - start), bytes, staleness,
                        absl::ToDoubleSeconds(blocked));
}

absl::Status ParameterServer::Pull(const v1::PullRequest& request, absl::Time deadline, v1::PullResponse* response,
                                   const std::string& caller) {
  std::string data;
  absl::Status status = Wait([&](Done done) {
    Pull(
        request, deadline, [&](absl::Span<const float> values, v1::DType dtype) { ReadInto(&data, values, dtype); },
        response, std::move(done), caller);
  });
  if (status.ok()) *response->mutable_values()->mutable_data() = std::move(data);
  return status;
}

absl::StatusOr<PushInfo> ParameterServer::CheckPush(const v1::PushRequest& request,
                                                    const DenseView::Values& scanned) const {
  const v1::TensorSlice& gradient = request.gradient();
  if (const std::optional<DenseView::Element>& bad = scanned.non_finite) {
    // float16 turns magnitudes beyond its range into infinity on the way.
    const bool overflow = gradient.dtype() == v1::FLOAT16 && std::isinf(bad->value);
    return absl::InvalidArgumentError(absl::StrCat(
        "Push gradient: element ", gradient.offset() + bad->at, " of segment ", request.segment(), " is ",
        bad->value, overflow ? " (beyond float16's 65504: use wire_dtype FLOAT32 or BFLOAT16)" : "",
        "; gradients must be finite (nothing was applied)"));
  }
  const uint64_t most = uint64_t{config_.training().batch_size()} * WorkersOf(config_, request.segment());
  if (request.has_samples() && request.samples() > most) {
    return absl::InvalidArgumentError(absl::StrCat("Push samples: ", request.samples(),
                                                   " is more than a clock's batch_size x workers (", most,
                                                   "); nothing was applied"));
  }
  PushInfo info;
  info.max_abs_gradient = scanned.max_abs;
  if (request.has_samples()) info.samples = request.samples();
  if (std::isfinite(request.samples_per_second())) info.samples_per_second = request.samples_per_second();
  return info;
}

void ParameterServer::Push(const v1::PushRequest& request, Payload data, absl::Time deadline, ReadValues read,
                           v1::PushResponse* response, Done done, const std::string& caller) {
  absl::StatusOr<SegmentShard*> shard = ShardFor(request.segment(), "Push");
  if (!shard.ok()) return std::move(done)(Reject(request.segment(), shard.status()));
  std::shared_ptr<SharedRegion> region;
  absl::Status known =
      CheckRegistration(request.worker_id(), request.registration_secret(), caller, "Push", std::nullopt, &region);
  if (!known.ok()) return std::move(done)(Reject(request.segment(), std::move(known)));
  const Range range = map_.range(request.segment(), index_);
  const v1::TensorSlice& gradient = request.gradient();
  std::optional<uint64_t> region_offset;
  absl::Status valid = PushTensors(request, range, region, &data, &read, &region_offset);
  if (!valid.ok()) return std::move(done)(Reject(request.segment(), valid));
  // The gradient's bytes and the view of them stay where they are until the push completes.
  struct Gradient {
    Gradient(const v1::TensorSlice& slice, Payload bytes) : data(std::move(bytes)), view(slice, data) {}
    Payload data;
    DenseView view;
    std::vector<RowGradients> rows;
  };
  auto grad = std::make_unique<Gradient>(gradient, std::move(data));
  if (absl::Status rows = PushedRows(request, range, region.get(), &grad->rows); !rows.ok()) {
    return std::move(done)(Reject(request.segment(), std::move(rows)));
  }
  // Checked before anything is applied, so that a bad push changes nothing.
  absl::StatusOr<PushInfo> info = CheckPush(request, grad->view.Scan());
  if (!info.ok()) return std::move(done)(Reject(request.segment(), info.status()));
  const absl::Time start = absl::Now();
  const uint32_t segment = request.segment();
  const uint64_t clock = request.clock();
  const Range chunk{gradient.offset(), gradient.count()};
  const v1::DType dtype = gradient.dtype();
  // A sparse push's positions count too.
  size_t bytes = grad->data.size() + gradient.indices().size();
  for (const RowGradients& r : grad->rows) bytes += r.ids.size() * sizeof(uint64_t) + r.values.size() * sizeof(float);
  ReadRange pull_read;
  if (request.pull()) {
    pull_read = [read = std::move(read), dtype](absl::Span<const float> values) mutable { read(values, dtype); };
  }
  // Bytes that lay in the caller's region.
  const size_t in_region = (gradient.has_region_offset() ? grad->data.size() : 0) +
                           RegionRowBytes(config_.model().segments(segment), request.rows());
  const DenseView* view = &grad->view;
  const std::vector<RowGradients>* rows = grad->rows.empty() ? nullptr : &grad->rows;
  (*shard)->Push(
      request.worker_id(), clock, chunk.offset - range.offset, view, deadline, std::move(pull_read),
      [this, response, done = std::move(done), grad = std::move(grad), start, segment, clock, chunk, dtype, bytes,
       region_offset, in_region](absl::StatusOr<PushResult> result) mutable {
        region_bytes_[segment].fetch_add(in_region, std::memory_order_relaxed);
        grad.reset();  // the shard is done with it
        if (!result.ok()) {
          // Moved, not copied: the status's text is read by the caller's thread.
          absl::Status failed = std::move(result).status();
          const bool unavailable = absl::IsUnavailable(failed);
          return std::move(done)(unavailable ? std::move(failed) : Reject(segment, std::move(failed)));
        }
        response->set_applied(result->applied);
        response->set_next_clock(result->next_clock);
        response->set_incarnation(incarnation_);
        push_bytes_[segment].fetch_add(bytes, std::memory_order_relaxed);
        ObservePush(segment, start, bytes, *result);
        if (result->pulled.has_value()) {
          const PullResult& pulled = *result->pulled;
          response->set_clock(pulled.clock);
          response->set_updates(pulled.updates);
          if (pulled.plan.has_value()) *response->mutable_plan() = *pulled.plan;
          FillValues(segment, chunk, dtype, region_offset, response->mutable_values());
          ObservePull(segment, start, chunk.count * DTypeBytes(dtype),
                      clock + 1 <= pulled.clock ? 0 : clock + 1 - pulled.clock, pulled.blocked);
        }
        // Acknowledged once the range's backups hold it (cluster.replicas).
        if (!logs_.empty()) return logs_[segment]->WhenHeld(result->replica_seq, std::move(done));
        std::move(done)(absl::OkStatus());
      }, *info, rows);
}

void ParameterServer::ObservePush(uint32_t segment, absl::Time start, size_t bytes, const PushResult& result) {
  if (metrics_ == nullptr) return;
  metrics_->ObservePush(static_cast<int>(segment), absl::ToDoubleSeconds(absl::Now() - start), bytes, result.applied,
                        absl::ToDoubleSeconds(result.apply));
  metrics_->ObserveWorkerClock(static_cast<int>(segment), result.rank, result.next_clock);
  if (result.rows_pushed > 0) {
    metrics_->ObserveRowsPushed(static_cast<int>(segment), result.rows_pushed, result.rows_held, result.rows_bytes);
  }
}

absl::Status ParameterServer::Push(const v1::PushRequest& request, absl::Time deadline, v1::PushResponse* response,
                                   const std::string& caller) {
  std::string data;
  absl::Status status = Wait([&](Done done) {
    Push(
        request, Payload::Borrow(request.gradient().data()), deadline,
        [&](absl::Span<const float> values, v1::DType dtype) { ReadInto(&data, values, dtype); }, response,
        std::move(done), caller);
  });
  if (status.ok() && request.pull()) *response->mutable_values()->mutable_data() = std::move(data);
  return status;
}

void ParameterServer::Tick() {
  for (auto& shard : shards_) shard->Tick();
}

void ParameterServer::Drain() {
  const std::string why = absl::StrCat("server ", index_, " is shutting down; retry with the server that replaces it");
  for (auto& shard : shards_) shard->Drain(why);
  for (auto& log : logs_) log->Drain(why);
}

void ParameterServer::Reopen() {
  for (auto& shard : shards_) shard->Reopen();
  for (auto& log : logs_) log->Reopen();
}

size_t ParameterServer::Waiting() {
  size_t waiting = 0;
  for (auto& shard : shards_) waiting += shard->Waiting();
  for (auto& log : logs_) waiting += log->Waiting();
  return waiting;
}

void ParameterServer::Stats(const v1::StatsRequest& request, v1::StatsResponse* response) {
  response->set_server_index(index_);
  response->set_model_fingerprint(model_fingerprint_);
  response->set_shard_fingerprint(map_.fingerprint());
  response->set_waiting_calls(static_cast<uint32_t>(Waiting()));
  response->set_incarnation(incarnation_);
  for (size_t k = 0; k < shards_.size(); ++k) {
    v1::SegmentStats* stats = response->add_segments();
    shards_[k]->FillStats(stats, response->mutable_workers());
    stats->set_name(config_.model().segments(k).name());
    stats->set_rejected(rejected_[k].load(std::memory_order_relaxed));
    stats->set_push_bytes(push_bytes_[k].load(std::memory_order_relaxed));
    stats->set_pull_bytes(pull_bytes_[k].load(std::memory_order_relaxed));
    stats->set_region_bytes(region_bytes_[k].load(std::memory_order_relaxed));
    if (store_ != nullptr) {
      for (uint64_t clock : store_->Clocks(static_cast<int>(k))) stats->add_checkpoint_clocks(clock);
    }
  }
  FillReplicaStats(request.digests(), response);
}

}  // namespace segps
