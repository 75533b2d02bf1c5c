// ParameterClient over gRPC. Each request goes to every server at once.
// Pushes and pulls go as messages on streams, one per server for each, that
// stay open (worker/client/request_streams.h), on the client's completion
// queue (completion_loop.h): a Start call returns a completion at once and
// the queue's thread drives it; a blocking call drives the queue on the
// waiting thread. The control calls (heartbeat, leave, stats) are unary,
// from a queue the calling thread drives. Pull replies and push requests travel as raw byte buffers
// (common/tensor_wire_grpc.h): a gradient is copied once, into the buffer gRPC
// sends from, and pulled values once, from the received slices into the
// caller's tensor. Ranges larger than cluster.chunk_bytes go in consecutive
// chunks, at most two unanswered per server, all servers at once. To a
// server on this host that took the client's shared region
// (client/region_arena.h), a gradient is encoded into the region and values
// land there: the messages carry offsets, not bytes.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/balance.h"
#include "common/config.h"
#include "common/embedding.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/security.h"
#include "common/shared_region.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/tensor_wire_grpc.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "worker/client/completion_loop.h"
#include "worker/client/grpc_membership.h"
#include "worker/client/membership.h"
#include "worker/client/ps_client.h"
#include "worker/client/region_rows.h"
#include "worker/client/request_streams.h"
#include "worker/client/server_routes.h"
#include "worker/client/unary_fan_out.h"

namespace segps {
namespace {

// Chunks unanswered per server. Two: a chunk's transfer overlaps the
// previous one's update and reply, for one more chunk of memory in flight per
// server (1 server, 1 worker, medians of 5 alternating runs: 4 MB rounds
// 1.56 -> 1.77 GB/s, 64 MB 1.43 -> 1.74; three or four gain nothing more).
// The server applies a worker's chunks in order whatever order they arrive in.
constexpr size_t kChunksInFlight = 2;

// [offset, offset + count) cut into consecutive chunks of at most `elements`
// (one empty chunk for an empty range).
std::vector<Range> Chunks(Range range, uint64_t elements) {
  std::vector<Range> chunks;
  uint64_t at = range.offset;
  do {
    const uint64_t count = std::min(elements, range.end() - at);
    chunks.push_back({at, count});
    at += count;
  } while (at < range.end());
  return chunks;
}

// `bytes`, a part of the push's values, as a slice gRPC sends from without
// copying: it holds the push's storage until gRPC lets go of it.
grpc::Slice SliceOf(const EncodedPush& push, absl::string_view bytes) {
  return grpc::Slice(const_cast<char*>(bytes.data()), bytes.size(),
                     [](void* owner) { delete static_cast<std::shared_ptr<const char>*>(owner); },
                     new std::shared_ptr<const char>(push.storage));
}

class GrpcClient final : public ParameterClient {
 public:
  GrpcClient(const v1::JobConfig& config, ShardMap map, std::vector<std::string> addresses,
             const std::shared_ptr<grpc::ChannelCredentials>& credentials)
      : map_(std::move(map)), model_(config.model()), addresses_(std::move(addresses)),
        rpc_deadline_(absl::Milliseconds(config.cluster().rpc_deadline_ms())),
        pull_wait_(absl::Milliseconds(config.cluster().pull_wait_ms())),
        dtype_(config.cluster().wire_dtype()),
        chunk_elements_(config.cluster().chunk_bytes() / DTypeBytes(dtype_)),
        host_(SharedMemoryOn(config.cluster()) ? SameHostIdentity() : ""),
        regions_(host_.empty() ? nullptr : std::make_shared<RegionHolder>(RegionBytesFor(map_, config))) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
    args.SetMaxSendMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
    // A server that restarts is back within a second or two: reconnect
    // promptly (gRPC's defaults back off from 1 s by 1.6x up to 2 minutes).
    // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left alone: gRPC takes it as the
    // time one connection attempt may take (20 s), and a TLS handshake on a
    // loaded machine can take more than a short backoff, failing every
    // attempt for as long as the load lasts.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    routes_ = std::make_unique<ServerRoutes>(map_, addresses_, credentials, args,
                                             absl::Milliseconds(config.cluster().lease_ms()));
    push_streams_ = std::make_unique<RequestStreams>(&loop_, routes_.get(), kPushStreamMethod);
    pull_streams_ = std::make_unique<RequestStreams>(&loop_, routes_.get(), kPullStreamMethod);
    // Rows on streams of their own: a step's row pull never queues behind
    // the next step's prefetched parameter pull (which may wait on the bound).
    row_streams_ = std::make_unique<RequestStreams>(&loop_, routes_.get(), kPullStreamMethod);
    std::vector<MembershipStub*> servers;
    for (size_t i = 0; i < addresses_.size(); ++i) {
      membership_stubs_.push_back(
          std::make_unique<GrpcMembershipStub>(routes_.get(), i, rpc_deadline_, regions_, host_));
      servers.push_back(membership_stubs_.back().get());
    }
    membership_ = std::make_unique<Membership>(std::move(servers), ModelFingerprint(config), map_.fingerprint(),
                                               ModelFingerprintParts(config));
  }

  // The streams first: their last replies may still land (plans_).
  ~GrpcClient() override {
    push_streams_.reset();
    pull_streams_.reset();
    row_streams_.reset();
  }

  // Registers with every server, agreed on where the rank continues
  // (client/membership.h, docs/recovery.md).
  absl::StatusOr<Registration> Register(int segment, std::optional<uint32_t> rank) override {
    if (segment < 0 || segment >= map_.num_segments()) {
      return absl::InvalidArgumentError(absl::StrCat("segment ", segment, " is out of range"));
    }
    v1::SharePlan plan;
    if (regions_ != nullptr) regions_->Renew();
    absl::StatusOr<Registration> registered = membership_->Register(segment, rank, &plan);
    if (registered.ok()) {
      MutexLock lock(&plan_mu_);
      plans_[segment] = std::move(plan);
    }
    return registered;
  }

  void SetEpochClocks(uint64_t epoch_clocks) override { membership_->set_epoch_clocks(epoch_clocks); }
  void HoldSteps(std::optional<HeldSteps> held) override { membership_->set_held_steps(held); }
  absl::Status RollBackChain(int segment, uint64_t clock) override {
    return membership_->RollBackChain(segment, clock);
  }

  Completion<PulledAt> StartPull(int segment, uint64_t clock, absl::Span<float> dest) override {
    return PullOn(segment, clock, dest, false);
  }
  PulledAt Pull(int segment, uint64_t clock, absl::Span<float> dest) override {
    return Driven(PullOn(segment, clock, dest, true));
  }

  // A pull of `segment` at `clock` from server i, by this client's
  // registration there (none: as a reader).
  v1::PullRequest PullHeader(int segment, size_t i, uint64_t clock) const {
    v1::PullRequest request;
    request.set_segment(segment);
    request.set_worker_id(membership_->worker_id(i));
    request.set_registration_secret(membership_->secret(i));
    request.set_reader(membership_->worker_id(i) == 0);
    request.set_clock(clock);
    return request;
  }

  Completion<PulledAt> PullOn(int segment, uint64_t clock, absl::Span<float> dest, bool caller_drives) {
    if (segment < 0 || segment >= map_.num_segments() || dest.size() != map_.segment_size(segment)) {
      return Completion<PulledAt>::Done(
          absl::InvalidArgumentError("Pull: no such segment, or the destination size does not match it"));
    }
    auto exchange = std::make_unique<RequestStreams::Exchange>();
    auto landing = std::make_shared<Landing>(dest, segment);
    LandInRegion(landing.get(), true);
    for (size_t i = 0; i < addresses_.size(); ++i) {
      const std::vector<Range> cut = Chunks(map_.range(segment, static_cast<uint32_t>(i)), chunk_elements_);
      for (const Range& chunk : cut) {
        v1::PullRequest request = PullHeader(segment, i, clock);
        // Observers (the evaluator, parameter dumps) read the float32 values
        // as they are; the wire format is for training traffic.
        request.set_dtype(membership_->worker_id(i) == 0 ? v1::FLOAT32 : dtype_);
        if (cut.size() > 1) {  // a whole range is asked for without offset and count
          request.set_offset(chunk.offset);
          request.set_count(chunk.count);
        }
        if (std::optional<uint64_t> at = ReplyOffset(*landing, i, chunk)) request.set_reply_region_offset(*at);
        grpc::Slice bytes(request.SerializeAsString());
        exchange->requests.emplace_back(&bytes, 1);
        exchange->servers.push_back(i);
        landing->chunks.push_back(chunk);
      }
    }
    exchange->call = "Pull";
    exchange->caller_drives = caller_drives;
    exchange->window = kChunksInFlight;
    exchange->patience = pull_wait_ + rpc_deadline_;
    exchange->budget = pull_wait_ * 6 + rpc_deadline_;
    return Run<v1::PullResponse>(pull_streams_.get(), std::move(exchange), landing,
                                 v1::PullResponse::kValuesFieldNumber);
  }

  absl::Status PullRows(int segment, uint64_t clock, const std::vector<std::vector<uint64_t>>& ids,
                        std::vector<std::vector<float>>* values) override {
    return Driven(RowsOn(segment, clock, ids, values, true)).status();
  }
  Completion<absl::Status> StartPullRows(int segment, uint64_t clock, const std::vector<std::vector<uint64_t>>& ids,
                                         std::vector<std::vector<float>>* values) override {
    Completion<absl::Status> pulled;
    RowsOn(segment, clock, ids, values, false).OnDone([pulled](const PulledAt& r) { pulled.Set(r.status()); });
    return pulled;
  }

  Completion<PulledAt> RowsOn(int segment, uint64_t clock, const std::vector<std::vector<uint64_t>>& ids,
                              std::vector<std::vector<float>>* values, bool caller_drives) {
    if (segment < 0 || segment >= map_.num_segments() ||
        ids.size() != static_cast<size_t>(model_.segments(segment).embeddings_size())) {
      return Completion<PulledAt>::Done(
          absl::InvalidArgumentError("PullRows: no such segment, or not one list of ids per table"));
    }
    const v1::SegmentConfig& config = model_.segments(segment);
    const uint32_t servers = map_.num_servers();
    // Where each server's rows land: per server and table, positions in ids[t].
    auto landing = std::make_shared<RowSplit>(SplitRows(segment, servers, ids));
    values->resize(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      // Every row is landed (each server's reply holds exactly its rows): no need to zero them first.
      (*values)[t].resize(ids[t].size() * config.embeddings(static_cast<int>(t)).dim());
    }
    std::vector<std::vector<v1::Rows>> asked = RowsByServer(*landing, ids);
    // Where servers that hold this client's region write the rows, per server and table.
    auto placed = std::make_shared<PlacedRows>(servers);
    auto exchange = std::make_unique<RequestStreams::Exchange>();
    for (size_t i = 0; i < servers; ++i) {
      if (asked[i].empty()) continue;
      if (InRegion(i)) placed->Reply(regions_->get(), config, i, &asked[i]);
      v1::PullRequest request = PullHeader(segment, i, clock);
      request.set_rows_only(true);
      for (v1::Rows& rows : asked[i]) *request.add_rows() = std::move(rows);
      grpc::Slice bytes(request.SerializeAsString());
      exchange->requests.emplace_back(&bytes, 1);
      exchange->servers.push_back(i);
    }
    if (exchange->requests.empty()) return Completion<PulledAt>::Done(uint64_t{0});
    const std::vector<size_t> to = exchange->servers;
    exchange->take = [landing, placed, to, values, &config, &ids](size_t j, grpc::ByteBuffer* reply) {
      v1::PullResponse response;
      grpc::ProtoBufferReader reader(reply);
      if (!response.ParseFromZeroCopyStream(&reader)) return absl::DataLossError("PullRows reply: not a PullResponse");
      return LandRows(response, config, ids, (*landing)[to[j]], placed->places[to[j]], values);
    };
    exchange->on_resend = [placed] { placed->Retire(); };
    Completion<PulledAt> done;
    exchange->done = [done, placed](absl::Status status) {
      if (status.ok()) return done.Set(uint64_t{0});
      placed->Retire();
      done.Set(std::move(status));
    };
    exchange->call = "PullRows";
    exchange->caller_drives = caller_drives;
    exchange->patience = pull_wait_ + rpc_deadline_;
    exchange->budget = pull_wait_ * 6 + rpc_deadline_;
    row_streams_->Start(std::move(exchange));
    return done;
  }

  std::unique_ptr<EncodedPush> Encode(int segment, uint64_t clock, absl::Span<const float> grad) override {
    return EncodeDense(map_, dtype_, segment, clock, grad, Storage());
  }

  std::unique_ptr<EncodedPush> EncodeSparse(int segment, uint64_t clock, absl::Span<const uint64_t> indices,
                                            absl::Span<const float> values) override {
    return segps::EncodeSparse(map_, dtype_, segment, clock, indices, values, Storage());
  }
  void EncodeRows(EncodedPush* push, const std::vector<std::vector<uint64_t>>& ids,
                  const std::vector<std::vector<float>>& grads) override {
    segps::EncodeRows(model_.segments(push->segment), map_.num_servers(), ids, grads, Storage(), push);
  }

  Completion<absl::Status> StartSend(std::shared_ptr<const EncodedPush> push) override {
    Completion<absl::Status> sent;
    SendChunks(std::move(push), {}, false).OnDone([sent](const PulledAt& r) { sent.Set(r.status()); });
    return sent;
  }
  absl::Status Send(std::shared_ptr<const EncodedPush> push) override {
    return Driven(SendChunks(std::move(push), {}, true)).status();
  }

  Completion<PulledAt> StartSendAndPull(std::shared_ptr<const EncodedPush> push, absl::Span<float> dest) override {
    return SendChunks(std::move(push), dest, false);
  }
  PulledAt SendAndPull(std::shared_ptr<const EncodedPush> push, absl::Span<float> dest) override {
    return Driven(SendChunks(std::move(push), dest, true));
  }

  std::optional<std::vector<uint32_t>> Shares(int segment, uint64_t clock) override {
    MutexLock lock(&plan_mu_);
    auto it = plans_.find(segment);
    if (it == plans_.end() || clock > it->second.final_through()) return std::nullopt;
    const v1::Shares* shares = SharesAt(it->second, clock);
    if (shares == nullptr) return std::nullopt;
    return std::vector<uint32_t>(shares->samples().begin(), shares->samples().end());
  }

  absl::Status Heartbeat() override {
    std::vector<v1::HeartbeatRequest> requests(addresses_.size());
    std::vector<v1::HeartbeatResponse> responses(addresses_.size());
    for (size_t i = 0; i < addresses_.size(); ++i) {
      requests[i].set_worker_id(membership_->worker_id(i));
      requests[i].set_registration_secret(membership_->secret(i));
    }
    absl::Status status = FanOut(
        "Heartbeat", rpc_deadline_, rpc_deadline_,
        [&](size_t i, grpc::ClientContext* context, grpc::CompletionQueue* cq, UnaryCall* call) {
          const ServerRoutes::Way& way = routes_->way(i);
          way.Prepare(context);
          call->Start(way.stub->PrepareAsyncHeartbeat(context, requests[i], cq), &responses[i]);
        });
    if (!status.ok()) return status;
    for (size_t i = 0; i < addresses_.size(); ++i) {
      if (!responses[i].live()) {
        return Annotate(absl::FailedPreconditionError("lease expired; this worker was dropped"), i, "Heartbeat");
      }
    }
    return absl::OkStatus();
  }

  void Interrupt(const absl::Status& cause) override {
    for (RequestStreams* streams : {push_streams_.get(), pull_streams_.get(), row_streams_.get()}) {
      if (streams != nullptr) streams->Interrupt(cause);
    }
  }

  absl::StatusOr<std::vector<uint64_t>> Leave(std::optional<uint64_t> end_at_clock) override {
    std::vector<v1::LeaveRequest> requests(addresses_.size());
    std::vector<v1::LeaveResponse> responses(addresses_.size());
    for (size_t i = 0; i < addresses_.size(); ++i) {
      requests[i].set_worker_id(membership_->worker_id(i));
      requests[i].set_registration_secret(membership_->secret(i));
      if (end_at_clock.has_value()) requests[i].set_end_at_clock(*end_at_clock);
    }
    SEGPS_RETURN_IF_ERROR(FanOut("Leave", rpc_deadline_, rpc_deadline_,
                                 [&](size_t i, grpc::ClientContext* context, grpc::CompletionQueue* cq, UnaryCall* call) {
                                   const ServerRoutes::Way& way = routes_->way(i);
                                   way.Prepare(context);
                                   call->Start(way.stub->PrepareAsyncLeave(context, requests[i], cq), &responses[i]);
                                 }));
    std::vector<uint64_t> applied;
    for (const v1::LeaveResponse& response : responses) applied.push_back(response.next_clock());
    return applied;
  }

  absl::StatusOr<std::vector<v1::StatsResponse>> Stats() override {
    std::vector<v1::StatsRequest> requests(addresses_.size());
    std::vector<v1::StatsResponse> responses(addresses_.size());
    // Twice a call's deadline: servers that are still starting, or slow to
    // finish a TLS handshake on a loaded machine.
    absl::Status status = FanOut("Stats", rpc_deadline_ * 2, rpc_deadline_,
                                 [&](size_t i, grpc::ClientContext* context, grpc::CompletionQueue* cq, UnaryCall* call) {
                                   const ServerRoutes::Way& way = routes_->way(i);
                                   way.Prepare(context);
                                   call->Start(way.stub->PrepareAsyncStats(context, requests[i], cq), &responses[i]);
                                 });
    if (!status.ok()) return status;
    return responses;
  }

 private:
  // The result of a call the calling thread waits for, driving the queue
  // meanwhile: its replies are handled here, without a hand-off.
  PulledAt Driven(const Completion<PulledAt>& call) {
    loop_.Drive([&call] { return call.done(); });
    return call.Wait();
  }

  // Where an exchange's replies land: the values of each chunk (request
  // j) in `dest`, the least clock they reflect, server 0's share plan.
  struct Landing {
    Landing(absl::Span<float> dest, int segment) : dest(dest), segment(segment) {}
    absl::Span<float> dest;  // empty: a push that pulls nothing
    int segment;
    std::vector<Range> chunks;
    uint64_t min_clock = UINT64_MAX;
    // In the client's region when the exchange started (`arena`): the
    // block the values land in (dest's layout, elements of the wire
    // dtype), and the push's gradient, if there.
    std::shared_ptr<RegionArena> arena;
    std::shared_ptr<char> block;
    std::shared_ptr<const char> gradient;
    std::shared_ptr<const char> row_gradients;
  };

  // Whether server i holds this client's region for its registration there.
  bool InRegion(size_t i) const {
    return regions_ != nullptr && membership_->worker_id(i) != 0 &&
           membership_stubs_[i]->region_worker() == membership_->worker_id(i);
  }
  // Where pushes' bytes go: the region, where some server takes it.
  PushStorage Storage() const {
    if (!AnyInRegion()) return nullptr;
    return [arena = regions_->get()](size_t bytes) { return arena->Allocate(bytes); };
  }
  bool AnyInRegion() const {
    for (size_t i = 0; i < addresses_.size(); ++i) {
      if (InRegion(i)) return true;
    }
    return false;
  }
  // The exchange's arena, and with `pull` a block for `landing`'s values,
  // where some server takes the region.
  void LandInRegion(Landing* landing, bool pull) const {
    if (!AnyInRegion()) return;
    landing->arena = regions_->get();
    if (pull) landing->block = landing->arena->Allocate(landing->dest.size() * DTypeBytes(dtype_));
  }
  // Where server i writes `chunk`'s values in the region, if it does.
  std::optional<uint64_t> ReplyOffset(const Landing& landing, size_t i, Range chunk) const {
    if (landing.block == nullptr || !InRegion(i)) return std::nullopt;
    return *landing.arena->OffsetOf(landing.block.get()) + chunk.offset * DTypeBytes(dtype_);
  }

  // Starts `exchange` on `streams`: its replies (Responses) land per
  // `landing` (values in field `field`); the completion comes from its end.
  template <typename Response>
  Completion<PulledAt> Run(RequestStreams* streams, std::unique_ptr<RequestStreams::Exchange> exchange,
                             std::shared_ptr<Landing> landing, int field) {
    Completion<PulledAt> done;
    const std::vector<size_t> servers = exchange->servers;
    exchange->take = [this, landing, field, servers](size_t j, grpc::ByteBuffer* reply) {
      if (landing->dest.empty()) return absl::OkStatus();
      return TakeValues<Response>(reply, field, j, landing.get(), servers[j] == 0 ? landing->segment : -1);
    };
    // A request sent again, or cut off, may still be read or answered by
    // its server: its region blocks are never reused.
    auto retire = [landing] {
      if (landing->arena == nullptr) return;
      landing->arena->Retire(landing->block.get());
      landing->arena->Retire(landing->gradient.get());
      landing->arena->Retire(landing->row_gradients.get());
    };
    exchange->on_resend = retire;
    exchange->done = [done, landing, retire](absl::Status status) {
      if (!status.ok()) retire();
      if (status.ok()) {
        done.Set(landing->min_clock);
      } else {
        done.Set(std::move(status));
      }
    };
    streams->Start(std::move(exchange));
    return done;
  }

  // Pushes every chunk of every server's range; with a destination, each
  // chunk's message also pulls that chunk for the push's clock + 1 into it,
  // and the clock the values reflect comes back.
  Completion<PulledAt> SendChunks(std::shared_ptr<const EncodedPush> push, absl::Span<float> pull_into,
                                  bool caller_drives) {
    const bool pull = !pull_into.empty();
    if (absl::Status fits = FitsTheseServers(*push); !fits.ok()) return Completion<PulledAt>::Done(fits);
    if (pull && pull_into.size() != map_.segment_size(push->segment)) {
      return Completion<PulledAt>::Done(
          absl::InvalidArgumentError("SendAndPull: the destination size does not match the segment"));
    }
    auto exchange = std::make_unique<RequestStreams::Exchange>();
    auto landing = std::make_shared<Landing>(pull_into, push->segment);
    landing->gradient = push->storage;
    LandInRegion(landing.get(), pull);
    landing->row_gradients = push->row_storage;
    for (size_t i = 0; i < addresses_.size(); ++i) {
      for (const Range& chunk : Chunks(map_.range(push->segment, static_cast<uint32_t>(i)), chunk_elements_)) {
        exchange->requests.push_back(PushMessage(*push, i, chunk, pull, *landing));
        exchange->servers.push_back(i);
        landing->chunks.push_back(chunk);
      }
    }
    const absl::Duration wait = pull ? pull_wait_ : absl::ZeroDuration();
    exchange->call = "Push";
    exchange->caller_drives = caller_drives;
    exchange->window = kChunksInFlight;
    exchange->patience = wait + rpc_deadline_;
    exchange->budget = wait * 6 + rpc_deadline_ * 2;
    return Run<v1::PushResponse>(push_streams_.get(), std::move(exchange), landing,
                                 v1::PushResponse::kValuesFieldNumber);
  }

  // Whether `push` was encoded for these servers (EncodeDense or
  // EncodeSparse over this client's shard map), so that every chunk's bytes
  // are where PushMessage takes them from.
  absl::Status FitsTheseServers(const EncodedPush& push) const {
    auto refuse = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("Push of clock ", push.clock, ": ", why));
    };
    if (push.segment < 0 || push.segment >= map_.num_segments()) return refuse("no such segment");
    if (push.values.size() != addresses_.size() || DTypeBytes(push.dtype) == 0) {
      return refuse("not encoded for these servers");
    }
    if (push.sparse && (push.server_entries.size() != addresses_.size() + 1 ||
                        push.server_entries.back() != push.indices.size())) {
      return refuse("its sparse entries are not split by these servers");
    }
    for (size_t i = 0; i < addresses_.size(); ++i) {
      const uint64_t elements = push.sparse ? push.server_entries[i + 1] - push.server_entries[i]
                                            : map_.range(push.segment, static_cast<uint32_t>(i)).count;
      if (push.values[i].size() != elements * DTypeBytes(push.dtype)) {
        return refuse(absl::StrCat("server ", i, "'s part has ", push.values[i].size(), " bytes, not ", elements,
                                   " elements of ", v1::DType_Name(push.dtype)));
      }
    }
    return absl::OkStatus();
  }

  // The message pushing `chunk` of server i's range (and pulling it, into
  // the landing's block where there is one).
  grpc::ByteBuffer PushMessage(const EncodedPush& push, size_t i, Range chunk, bool pull,
                               const Landing& landing) const {
    const std::optional<uint64_t> reply_offset = ReplyOffset(landing, i, chunk);
    v1::PushRequest header;
    header.set_segment(push.segment);
    header.set_worker_id(membership_->worker_id(i));
    header.set_registration_secret(membership_->secret(i));
    header.set_clock(push.clock);
    header.set_pull(pull);
    if (reply_offset.has_value()) header.set_reply_region_offset(*reply_offset);
    if (push.samples.has_value()) header.set_samples(*push.samples);
    header.set_samples_per_second(push.samples_per_second);
    if (chunk.offset == map_.range(push.segment, static_cast<uint32_t>(i)).offset) AddRows(push, i, landing, &header);
    v1::TensorSlice tensor;
    tensor.set_offset(chunk.offset);
    tensor.set_count(chunk.count);
    tensor.set_dtype(push.dtype);
    const size_t width = DTypeBytes(push.dtype);
    if (!push.sparse) {
      const size_t begin = (chunk.offset - map_.range(push.segment, static_cast<uint32_t>(i)).offset) * width;
      return GradientMessage(header, &tensor, push, i, landing, push.values[i].substr(begin, chunk.count * width));
    }
    // The server's entries within the chunk, positions relative to it.
    const auto all = push.indices.begin();
    const size_t begin = std::lower_bound(all + push.server_entries[i], all + push.server_entries[i + 1],
                                          chunk.offset) - all;
    const size_t end = std::lower_bound(all + begin, all + push.server_entries[i + 1], chunk.end()) - all;
    std::string* indices = tensor.mutable_indices();
    indices->resize((end - begin) * sizeof(uint32_t));
    for (size_t e = begin; e < end; ++e) {
      const uint32_t at = static_cast<uint32_t>(push.indices[e] - chunk.offset);
      std::memcpy(indices->data() + (e - begin) * sizeof(uint32_t), &at, sizeof(at));
    }
    const size_t first = push.server_entries[i];
    return GradientMessage(header, &tensor, push, i, landing,
                           push.values[i].substr((begin - first) * width, (end - begin) * width));
  }

  // Server i's row gradients of `push`: their places in the region, where
  // server i takes it and they lie there, else their values.
  void AddRows(const EncodedPush& push, size_t i, const Landing& landing, v1::PushRequest* header) const {
    if (i >= push.rows.size()) return;
    for (size_t k = 0; k < push.rows[i].size(); ++k) {
      v1::Rows* rows = header->add_rows();
      *rows = push.rows[i][k];
      const absl::string_view values = push.row_values[i][k];
      const std::optional<uint64_t> at =
          InRegion(i) && landing.arena != nullptr ? landing.arena->OffsetOf(values.data()) : std::nullopt;
      if (at.has_value()) {
        rows->set_values_region_offset(*at);
      } else {
        rows->set_values(values.data(), values.size());
      }
    }
  }

  // A push's message with `bytes` of its gradient: their place in the
  // region, where server i takes it and they lie there, else the bytes.
  grpc::ByteBuffer GradientMessage(const v1::PushRequest& header, v1::TensorSlice* tensor, const EncodedPush& push,
                                   size_t i, const Landing& landing, absl::string_view bytes) const {
    const std::optional<uint64_t> at =
        InRegion(i) && landing.arena != nullptr ? landing.arena->OffsetOf(bytes.data()) : std::nullopt;
    if (at.has_value()) tensor->set_region_offset(*at);
    return EncodeTensorMessage(header, v1::PushRequest::kGradientFieldNumber, *tensor,
                               at.has_value() ? grpc::Slice() : SliceOf(push, bytes));
  }

  // Copies the values `reply` (a Response) carries for `chunk` into `dest`
  // (the whole segment), frees the reply, and lowers `min_clock` to the
  // clock they reflect; a reply from server 0 (plan_segment >= 0) adds its
  // share plan. A float16 reply with non-finite values fails after landing
  // them (the caller stops on it).
  template <typename Response>
  absl::Status TakeValues(grpc::ByteBuffer* reply, int field, size_t j, Landing* landing, int plan_segment) {
    const Range chunk = landing->chunks[j];
    const absl::Span<float> dest = landing->dest;
    uint64_t* const min_clock = &landing->min_clock;
    Response header;
    v1::TensorSlice tensor;
    Payload values;
    SEGPS_RETURN_IF_ERROR(DecodeTensorMessage(*reply, field, &header, &tensor, &values));
    if (tensor.has_region_offset()) {
      // Only where this request asked for them, so within the landing block.
      const size_t at = chunk.offset * DTypeBytes(dtype_);
      if (landing->block == nullptr || values.size() != 0 || tensor.dtype() != dtype_ ||
          tensor.count() != chunk.count || tensor.region_offset() != *landing->arena->OffsetOf(landing->block.get()) + at) {
        return absl::InternalError("reply values: not where this request asked for them in the shared region");
      }
      values = Payload::Borrow(absl::string_view(landing->block.get() + at, chunk.count * DTypeBytes(dtype_)));
    }
    SEGPS_RETURN_IF_ERROR(ValidateTensorSlice(tensor, values.size(), chunk.offset, chunk.count, "reply values"));
    if (tensor.offset() != chunk.offset || tensor.count() != chunk.count || tensor.has_indices()) {
      return absl::InternalError(absl::StrCat("reply values: [", tensor.offset(), ", +", tensor.count(),
                                              ")", tensor.has_indices() ? " sparse" : "", " instead of [",
                                              chunk.offset, ", +", chunk.count, ")"));
    }
    const absl::Span<float> landed = dest.subspan(chunk.offset, chunk.count);
    values.CopyTo(tensor.dtype(), landed);
    if (tensor.dtype() == v1::FLOAT16) {
      // Parameters beyond float16's range arrive as infinity: say so rather
      // than train on them (checked on the widened values, still in cache).
      if (const std::optional<size_t> bad = FirstNonFinite(landed)) {
        return absl::OutOfRangeError(absl::StrCat(
            "pulled parameter ", tensor.offset() + *bad, " is ", landed[*bad],
            " on the float16 wire (it holds magnitudes up to 65504): use wire_dtype FLOAT32 or BFLOAT16"));
      }
    }
    values = Payload();
    reply->Clear();
    *min_clock = std::min(*min_clock, header.clock());
    if (plan_segment >= 0 && header.has_plan()) {
      MutexLock lock(&plan_mu_);
      MergePlan(header.plan(), &plans_[plan_segment]);
    }
    return absl::OkStatus();
  }

  absl::Status Annotate(const absl::Status& status, size_t server, const char* call) const {
    return absl::Status(status.code(), absl::StrCat(call, " to ", routes_->way(server).name, ": ", status.message()));
  }

  // A control call to every server at once (client/unary_fan_out.h).
  absl::Status FanOut(const char* call, absl::Duration budget, absl::Duration per_call, const StartUnary& start) {
    return UnaryFanOut(routes_.get(), budget, per_call, start,
                       [&](const absl::Status& status, size_t server) { return Annotate(status, server, call); });
  }

  const ShardMap map_;
  const v1::ModelConfig model_;  // the embedding tables rows are pulled for
  const std::vector<std::string> addresses_;
  const absl::Duration rpc_deadline_, pull_wait_;
  const v1::DType dtype_;        // of tensors on the wire
  const uint64_t chunk_elements_;
  std::unique_ptr<ServerRoutes> routes_;  // each server's way, for every call
  const std::string host_;  // SameHostIdentity; empty: no shared memory
  const std::shared_ptr<RegionHolder> regions_;  // null: no shared memory
  CompletionLoop loop_;  // drives the streams; destroyed after them
  std::unique_ptr<RequestStreams> push_streams_, pull_streams_, row_streams_;
  std::vector<std::unique_ptr<GrpcMembershipStub>> membership_stubs_;
  std::unique_ptr<Membership> membership_;  // the registrations, per server
  Mutex plan_mu_;  // replies land on the loop's thread
  std::map<int, v1::SharePlan> plans_ ABSL_GUARDED_BY(plan_mu_);  // per segment, from server 0
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterClient>> ConnectGrpc(const v1::JobConfig& config,
                                                             const std::vector<std::string>& addresses) {
  absl::StatusOr<ShardMap> map = MapOfServers(config, addresses);
  if (!map.ok()) return map.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = LoadChannelCredentials(config.security());
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<ParameterClient>(new GrpcClient(config, *std::move(map), addresses, *credentials));
}

}  // namespace segps
