// ParameterClient over gRPC. Each request goes to every server at once from
// a completion queue the calling thread drives; the thread waits for all
// replies. Pushes and pulls go as messages on streams, one per server for
// each, that stay open (worker/client/request_streams.h); the control calls are
// unary. Pull replies and push requests travel as raw byte buffers
// (common/tensor_wire_grpc.h): a gradient is copied once, into the buffer gRPC
// sends from, and pulled values once, from the received slices into the
// caller's tensor. Ranges larger than cluster.chunk_bytes go in consecutive
// chunks, at most two unanswered per server, all servers at once.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/balance.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/sync.h"
#include "common/tensor_wire_grpc.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "worker/client/ps_client.h"
#include "worker/client/request_streams.h"

namespace segps {
namespace {

struct GrpcEncodedPush final : public EncodedPush {
  int segment = 0;
  uint64_t clock = 0;
  std::vector<grpc::Slice> data;  // per server: the gradient for its range (sparse: its entries' values)
  // Sparse only: the entries' positions in the segment, ascending, and the
  // first entry of each server's range (one more: the end).
  bool sparse = false;
  std::vector<uint64_t> indices;
  std::vector<size_t> server_entries;
};

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

// Exponential backoff between attempts (20 ms doubling to 1 s) within a budget.
class Backoff {
 public:
  explicit Backoff(absl::Duration budget) : give_up_(absl::Now() + budget) {}
  // Sleeps before the next attempt; false, without sleeping, when that
  // attempt would start after the budget ran out.
  bool Wait() {
    if (absl::Now() + delay_ >= give_up_) return false;
    absl::SleepFor(delay_);
    delay_ = std::min(delay_ * 2, absl::Seconds(1));
    return true;
  }
  absl::Duration left() const { return give_up_ - absl::Now(); }

 private:
  const absl::Time give_up_;
  absl::Duration delay_ = absl::Milliseconds(20);
};

class GrpcClient final : public ParameterClient {
 public:
  GrpcClient(const v1::JobConfig& config, ShardMap map, std::vector<std::string> addresses,
             const std::shared_ptr<grpc::ChannelCredentials>& credentials)
      : map_(std::move(map)), addresses_(std::move(addresses)),
        fingerprint_(ModelFingerprint(config)),
        rpc_deadline_(absl::Milliseconds(config.cluster().rpc_deadline_ms())),
        pull_wait_(absl::Milliseconds(config.cluster().pull_wait_ms())),
        dtype_(config.cluster().wire_dtype()),
        chunk_elements_(config.cluster().chunk_bytes() / DTypeBytes(dtype_)) {
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
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    for (const std::string& address : addresses_) {
      channels.push_back(grpc::CreateCustomChannel(address, credentials, args));
      stubs_.push_back(v1::ParameterServer::NewStub(channels.back()));
    }
    push_streams_ = std::make_unique<RequestStreams>(channels, kPushStreamMethod);
    pull_streams_ = std::make_unique<RequestStreams>(channels, kPullStreamMethod);
    worker_ids_.assign(addresses_.size(), 0);
    incarnations_.assign(addresses_.size(), 0);
    secrets_.assign(addresses_.size(), std::string());
  }

  // Registers with every server, then makes them agree on where the rank
  // continues (docs/recovery.md): where the rank's own clocks differ
  // between servers (a push that reached some of them, a server restored
  // from a checkpoint), the segment is rolled back to the newest checkpoint
  // every server holds and registration starts over; otherwise the worker
  // starts at the furthest clock any server proposes.
  absl::StatusOr<Registration> Register(int segment, std::optional<uint32_t> rank) override {
    if (segment < 0 || segment >= map_.num_segments()) {
      return absl::InvalidArgumentError(absl::StrCat("segment ", segment, " is out of range"));
    }
    v1::RegisterRequest request;
    request.set_segment(segment);
    request.set_rank(rank.value_or(0));
    request.set_any_rank(!rank.has_value());
    request.set_model_fingerprint(fingerprint_);
    request.set_shard_fingerprint(map_.fingerprint());
    // Each rollback moves a generation on; a few in a row mean servers
    // that keep failing, which the caller's recovery retries.
    for (int attempt = 0; attempt < 4; ++attempt) {
      std::vector<v1::RegisterResponse> responses(stubs_.size());
      for (size_t i = 0; i < stubs_.size(); ++i) {
        SEGPS_RETURN_IF_ERROR(RegisterWith(i, request, &responses[i]));
        // Server 0 picks the rank if asked; the others are told the same.
        request.set_rank(responses[0].rank());
        request.set_any_rank(false);
      }
      absl::StatusOr<std::optional<uint64_t>> aligned = Agree(segment, responses);
      if (!aligned.ok()) return aligned.status();
      if (!aligned->has_value()) continue;  // rolled back: register again
      const uint64_t start = **aligned;
      request.set_join_clock(start);
      for (size_t i = 0; i < stubs_.size(); ++i) {
        if (responses[i].start_clock() != start) SEGPS_RETURN_IF_ERROR(RegisterWith(i, request, &responses[i]));
        incarnations_[i] = responses[i].incarnation();
      }
      {
        MutexLock lock(&plan_mu_);
        plans_[segment] = responses[0].plan();
      }
      return Registration{start, responses[0].rank()};
    }
    return absl::UnavailableError(absl::StrCat("Register: segment ", segment,
                                               " was rolled back 4 times in a row; the servers keep failing"));
  }

  // The clock every server should start the rank at, or nullopt after
  // rolling the segment back (register again).
  absl::StatusOr<std::optional<uint64_t>> Agree(int segment, const std::vector<v1::RegisterResponse>& responses) {
    std::set<uint64_t> rank_clocks;
    bool partial = false, some_new = false;
    uint64_t furthest = 0;
    for (const v1::RegisterResponse& r : responses) {
      if (r.has_rank_clock()) rank_clocks.insert(r.rank_clock());
      some_new |= !r.has_rank_clock();
      partial |= r.partial();
      furthest = std::max(furthest, r.start_clock());
    }
    const bool disagree = partial || rank_clocks.size() > 1 || (!rank_clocks.empty() && some_new);
    if (!disagree) return std::optional<uint64_t>(furthest);
    // The newest checkpoint clock every server holds.
    std::set<uint64_t> common(responses[0].checkpoint_clocks().begin(), responses[0].checkpoint_clocks().end());
    for (const v1::RegisterResponse& r : responses) {
      std::set<uint64_t> both;
      for (uint64_t c : r.checkpoint_clocks()) {
        if (common.count(c) > 0) both.insert(c);
      }
      common = std::move(both);
    }
    std::vector<std::string> states;
    for (size_t i = 0; i < responses.size(); ++i) {
      states.push_back(absl::StrCat("server ", i, " at ",
                                    responses[i].has_rank_clock() ? absl::StrCat(responses[i].rank_clock())
                                                                  : std::string("none"),
                                    responses[i].partial() ? " (partly applied)" : ""));
    }
    if (common.empty()) {
      for (size_t i = 0; i < responses.size(); ++i) {
        if (!responses[i].has_rank_clock() && incarnations_[i] != 0 && incarnations_[i] != responses[i].incarnation()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "Register: server ", i, " (", addresses_[i], ") restarted with no checkpoint of segment ", segment,
              ", so its parameters started over; the job cannot recover. Give the servers a checkpoint "
              "directory (--checkpoint_dir or checkpoint.dir)"));
        }
      }
      // No checkpoint to agree on: continue from the lowest clock; servers
      // further on acknowledge the repeated pushes without applying them.
      const uint64_t lowest = rank_clocks.empty() ? furthest : *rank_clocks.begin();
      SEGPS_LOG_WARNING << "segment " << segment << " rank " << responses[0].rank()
                        << ": the servers disagree on its clock (" << absl::StrJoin(states, ", ")
                        << ") and share no checkpoint; continuing from clock " << lowest;
      return std::optional<uint64_t>(lowest);
    }
    const uint64_t target = *common.rbegin();
    SEGPS_LOG_WARNING << "segment " << segment << " rank " << responses[0].rank() << ": the servers disagree ("
                      << absl::StrJoin(states, ", ") << "); rolling the segment back to its checkpoint at clock "
                      << target;
    for (size_t i = 0; i < stubs_.size(); ++i) {
      v1::RollbackRequest rollback;
      rollback.set_segment(segment);
      rollback.set_worker_id(responses[i].worker_id());
      rollback.set_registration_secret(responses[i].registration_secret());
      rollback.set_clock(target);
      rollback.set_generation(responses[i].generation());
      v1::RollbackResponse reply;
      absl::Status status = WithRetries(rpc_deadline_ * 4, [&](absl::Duration left) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + std::min(left, rpc_deadline_)));
        return FromGrpcStatus(stubs_[i]->Rollback(&context, rollback, &reply));
      });
      // A registration already dropped by someone else's rollback is fine: register again.
      if (!status.ok() && !absl::IsNotFound(status)) return Annotate(status, i, "Rollback");
    }
    return std::optional<uint64_t>();
  }

  absl::Status RegisterWith(size_t i, const v1::RegisterRequest& request, v1::RegisterResponse* response) {
    absl::Status status = WithRetries(rpc_deadline_ * 4, [&](absl::Duration left) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + std::min(left, rpc_deadline_)));
      context.set_wait_for_ready(true);  // servers may still be starting
      return FromGrpcStatus(stubs_[i]->Register(&context, request, response));
    });
    if (!status.ok()) return Annotate(status, i, "Register");
    if (response->server_index() != i) {
      return Annotate(absl::FailedPreconditionError(absl::StrCat("this is server ", response->server_index(),
                                                                 ", listed at position ", i,
                                                                 "; give the servers in index order")),
                      i, "Register");
    }
    worker_ids_[i] = response->worker_id();
    secrets_[i] = response->registration_secret();
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Pull(int segment, uint64_t clock, absl::Span<float> dest) override {
    if (dest.size() != map_.segment_size(segment)) {
      return absl::InvalidArgumentError("Pull: destination size does not match the segment");
    }
    std::vector<size_t> servers;
    std::vector<Range> chunks;
    std::vector<grpc::ByteBuffer> requests;
    for (size_t i = 0; i < stubs_.size(); ++i) {
      const std::vector<Range> cut = Chunks(map_.range(segment, static_cast<uint32_t>(i)), chunk_elements_);
      for (const Range& chunk : cut) {
        v1::PullRequest request;
        request.set_segment(segment);
        request.set_worker_id(worker_ids_[i]);
        request.set_registration_secret(secrets_[i]);
        request.set_reader(worker_ids_[i] == 0);
        request.set_clock(clock);
        // Observers (the evaluator, parameter dumps) read the float32 values
        // as they are; the wire format is for training traffic.
        request.set_dtype(worker_ids_[i] == 0 ? v1::FLOAT32 : dtype_);
        if (cut.size() > 1) {  // a whole range is asked for without offset and count
          request.set_offset(chunk.offset);
          request.set_count(chunk.count);
        }
        grpc::Slice bytes(request.SerializeAsString());
        requests.emplace_back(&bytes, 1);
        servers.push_back(i);
        chunks.push_back(chunk);
      }
    }
    uint64_t min_clock = UINT64_MAX;
    MutexLock lock(&pull_mu_);
    RequestStreams* const streams = pull_streams_.get();
    SEGPS_RETURN_IF_ERROR(FanOut("Pull", pull_wait_ * 6 + rpc_deadline_, servers, [&](const std::vector<size_t>& pending) {
      return streams->Exchange(
          servers, requests, kChunksInFlight, pull_wait_ + rpc_deadline_,
          [&](size_t j, grpc::ByteBuffer* reply) {
            return TakeValues<v1::PullResponse>(reply, v1::PullResponse::kValuesFieldNumber, chunks[j], dest,
                                                &min_clock, servers[j] == 0 ? segment : -1);
          },
          pending);
    }));
    return min_clock;
  }

  std::unique_ptr<EncodedPush> Encode(int segment, uint64_t clock,
                                      absl::Span<const float> grad) override {
    auto push = std::make_unique<GrpcEncodedPush>();
    push->segment = segment;
    push->clock = clock;
    for (size_t i = 0; i < stubs_.size(); ++i) {
      const Range range = map_.range(segment, static_cast<uint32_t>(i));
      push->data.push_back(EncodeValues(grad.subspan(range.offset, range.count), dtype_));
    }
    return push;
  }

  std::unique_ptr<EncodedPush> EncodeSparse(int segment, uint64_t clock, absl::Span<const uint64_t> indices,
                                            absl::Span<const float> values) override {
    auto push = std::make_unique<GrpcEncodedPush>();
    push->segment = segment;
    push->clock = clock;
    push->sparse = true;
    push->indices.assign(indices.begin(), indices.end());
    push->server_entries.push_back(0);
    for (size_t i = 0; i < stubs_.size(); ++i) {
      const Range range = map_.range(segment, static_cast<uint32_t>(i));
      const size_t begin = push->server_entries.back();
      const size_t end = std::lower_bound(indices.begin() + begin, indices.end(), range.end()) - indices.begin();
      push->data.push_back(EncodeValues(values.subspan(begin, end - begin), dtype_));
      push->server_entries.push_back(end);
    }
    return push;
  }

  absl::Status Send(const EncodedPush& encoded) override {
    return SendChunks(static_cast<const GrpcEncodedPush&>(encoded), {}).status();
  }

  absl::StatusOr<uint64_t> SendAndPull(const EncodedPush& encoded, absl::Span<float> dest) override {
    return SendChunks(static_cast<const GrpcEncodedPush&>(encoded), dest);
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
    std::vector<v1::HeartbeatRequest> requests(stubs_.size());
    std::vector<v1::HeartbeatResponse> responses(stubs_.size());
    for (size_t i = 0; i < stubs_.size(); ++i) {
      requests[i].set_worker_id(worker_ids_[i]);
      requests[i].set_registration_secret(secrets_[i]);
    }
    absl::Status status = FanOut(
        "Heartbeat", rpc_deadline_, rpc_deadline_,
        [&](size_t i, grpc::ClientContext* context, grpc::CompletionQueue* cq, Call* call) {
          call->Start(stubs_[i]->PrepareAsyncHeartbeat(context, requests[i], cq), &responses[i]);
        });
    if (!status.ok()) return status;
    for (size_t i = 0; i < stubs_.size(); ++i) {
      if (!responses[i].live()) {
        return Annotate(absl::FailedPreconditionError("lease expired; this worker was dropped"), i, "Heartbeat");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Leave() override {
    std::vector<v1::LeaveRequest> requests(stubs_.size());
    std::vector<v1::LeaveResponse> responses(stubs_.size());
    for (size_t i = 0; i < stubs_.size(); ++i) {
      requests[i].set_worker_id(worker_ids_[i]);
      requests[i].set_registration_secret(secrets_[i]);
    }
    return FanOut("Leave", rpc_deadline_, rpc_deadline_,
                  [&](size_t i, grpc::ClientContext* context, grpc::CompletionQueue* cq, Call* call) {
                    call->Start(stubs_[i]->PrepareAsyncLeave(context, requests[i], cq), &responses[i]);
                  });
  }

  absl::StatusOr<std::vector<v1::StatsResponse>> Stats() override {
    std::vector<v1::StatsRequest> requests(stubs_.size());
    std::vector<v1::StatsResponse> responses(stubs_.size());
    // Twice a call's deadline: servers that are still starting, or slow to
    // finish a TLS handshake on a loaded machine.
    absl::Status status = FanOut("Stats", rpc_deadline_ * 2, rpc_deadline_,
                                 [&](size_t i, grpc::ClientContext* context, grpc::CompletionQueue* cq, Call* call) {
                                   call->Start(stubs_[i]->PrepareAsyncStats(context, requests[i], cq), &responses[i]);
                                 });
    if (!status.ok()) return status;
    return responses;
  }

 private:
  // One call of a fan-out: its status, and its reader, which must outlive it.
  struct Call {
    size_t index = 0;  // within the attempt
    grpc::Status status;
    std::shared_ptr<void> reader;
    template <typename Response>
    void Start(std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> call, Response* response) {
      call->StartCall();
      call->Finish(response, &status, this);
      reader = std::move(call);
    }
  };
  // Starts the call to server i on `cq`, with Call::Start.
  using StartCall = std::function<void(size_t, grpc::ClientContext*, grpc::CompletionQueue*, Call*)>;

  // Pushes every chunk of every server's range; with a destination, each
  // chunk's call also pulls that chunk for the push's clock + 1 into it, and
  // the clock the values reflect comes back.
  absl::StatusOr<uint64_t> SendChunks(const GrpcEncodedPush& push, absl::Span<float> pull_into) {
    const bool pull = !pull_into.empty();
    if (pull && pull_into.size() != map_.segment_size(push.segment)) {
      return absl::InvalidArgumentError("SendAndPull: destination size does not match the segment");
    }
    std::vector<size_t> servers;
    std::vector<Range> chunks;
    std::vector<grpc::ByteBuffer> requests;
    for (size_t i = 0; i < stubs_.size(); ++i) {
      for (const Range& chunk : Chunks(map_.range(push.segment, static_cast<uint32_t>(i)), chunk_elements_)) {
        requests.push_back(PushMessage(push, i, chunk, pull));
        servers.push_back(i);
        chunks.push_back(chunk);
      }
    }
    uint64_t min_clock = UINT64_MAX;
    const absl::Duration wait = pull ? pull_wait_ : absl::ZeroDuration();
    MutexLock lock(&push_mu_);
    RequestStreams* const streams = push_streams_.get();
    SEGPS_RETURN_IF_ERROR(FanOut("Push", wait * 6 + rpc_deadline_ * 2, servers, [&](const std::vector<size_t>& pending) {
      return streams->Exchange(
          servers, requests, kChunksInFlight, wait + rpc_deadline_,
          [&](size_t j, grpc::ByteBuffer* reply) {
            if (!pull) return absl::OkStatus();
            return TakeValues<v1::PushResponse>(reply, v1::PushResponse::kValuesFieldNumber, chunks[j], pull_into,
                                                &min_clock, servers[j] == 0 ? push.segment : -1);
          },
          pending);
    }));
    return min_clock;
  }

  // The message pushing `chunk` of server i's range.
  grpc::ByteBuffer PushMessage(const GrpcEncodedPush& push, size_t i, Range chunk, bool pull) const {
    v1::PushRequest header;
    header.set_segment(push.segment);
    header.set_worker_id(worker_ids_[i]);
    header.set_registration_secret(secrets_[i]);
    header.set_clock(push.clock);
    header.set_pull(pull);
    if (push.samples.has_value()) header.set_samples(*push.samples);
    header.set_samples_per_second(push.samples_per_second);
    v1::TensorSlice tensor;
    tensor.set_offset(chunk.offset);
    tensor.set_count(chunk.count);
    tensor.set_dtype(dtype_);
    const size_t width = DTypeBytes(dtype_);
    if (!push.sparse) {
      const size_t begin = (chunk.offset - map_.range(push.segment, static_cast<uint32_t>(i)).offset) * width;
      return EncodeTensorMessage(header, v1::PushRequest::kGradientFieldNumber, tensor,
                                 push.data[i].sub(begin, begin + chunk.count * width));
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
    return EncodeTensorMessage(header, v1::PushRequest::kGradientFieldNumber, tensor,
                               push.data[i].sub((begin - first) * width, (end - first) * width));
  }

  // Copies the values `reply` (a Response) carries for `chunk` into `dest`
  // (the whole segment), frees the reply, and lowers `min_clock` to the
  // clock they reflect; a reply from server 0 (plan_segment >= 0) adds its
  // share plan. A float16 reply with non-finite values fails after landing
  // them (the caller stops on it).
  template <typename Response>
  absl::Status TakeValues(grpc::ByteBuffer* reply, int field, Range chunk, absl::Span<float> dest,
                          uint64_t* min_clock, int plan_segment) {
    Response header;
    v1::TensorSlice tensor;
    Payload values;
    SEGPS_RETURN_IF_ERROR(DecodeTensorMessage(*reply, field, &header, &tensor, &values));
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
    return absl::Status(status.code(), absl::StrCat(call, " to server ", server, " (", addresses_[server],
                                                    "): ", status.message()));
  }

  // Runs `attempt` until it succeeds, fails for good, or `budget` runs out.
  template <typename F>
  absl::Status WithRetries(absl::Duration budget, F attempt) {
    Backoff backoff(budget);
    while (true) {
      absl::Status status = attempt(backoff.left());
      if (status.ok() || !IsTransient(status) || !backoff.Wait()) return status;
    }
  }

  // Issues a call to every server at once and waits for all; retries the
  // ones that failed transiently, each attempt with deadline `per_call`.
  absl::Status FanOut(const char* call, absl::Duration budget, absl::Duration per_call, const StartCall& start) {
    std::vector<size_t> servers(stubs_.size());
    for (size_t i = 0; i < servers.size(); ++i) servers[i] = i;
    return FanOut(call, budget, servers, [&](const std::vector<size_t>& pending) {
      return RunCalls(per_call, start, pending);
    });
  }

  // One attempt at the requests in `pending` (request j goes to server
  // servers[j]): the status of each, in the same order.
  using Attempt = std::function<std::vector<absl::Status>(const std::vector<size_t>& pending)>;

  // Makes attempts at requests 0..servers.size()-1 until each succeeded,
  // one failed for good, or `budget` ran out; backs off between attempts.
  absl::Status FanOut(const char* call, absl::Duration budget, const std::vector<size_t>& servers,
                      const Attempt& attempt) {
    std::vector<size_t> pending(servers.size());
    for (size_t j = 0; j < pending.size(); ++j) pending[j] = j;
    Backoff backoff(budget);
    while (true) {
      std::vector<absl::Status> results = attempt(pending);
      std::vector<size_t> failed;  // to retry, if every failure is transient
      absl::Status first_failure;
      for (size_t k = 0; k < pending.size(); ++k) {
        if (results[k].ok()) continue;
        if (!IsTransient(results[k])) return Annotate(results[k], servers[pending[k]], call);
        if (failed.empty()) first_failure = Annotate(results[k], servers[pending[k]], call);
        failed.push_back(pending[k]);
      }
      if (failed.empty()) return absl::OkStatus();
      if (!backoff.Wait()) return first_failure;
      pending = std::move(failed);
    }
  }

  // One attempt at the calls to the servers in `pending`: the status of each.
  std::vector<absl::Status> RunCalls(absl::Duration per_call, const StartCall& start,
                                     const std::vector<size_t>& pending) {
    // The calling thread drives the queue: replies reach it without a
    // hand-off from another thread (latency on a busy machine).
    grpc::CompletionQueue cq;
    const size_t count = pending.size();
    std::vector<grpc::ClientContext> contexts(count);
    std::vector<Call> calls(count);
    for (size_t k = 0; k < count; ++k) {
      contexts[k].set_deadline(absl::ToChronoTime(absl::Now() + per_call));
      calls[k].index = k;
      start(pending[k], &contexts[k], &cq, &calls[k]);
    }
    std::vector<absl::Status> results(count);
    for (size_t done = 0; done < count; ++done) {
      void* tag = nullptr;
      bool ok = false;
      cq.Next(&tag, &ok);  // a unary call's Finish always completes, ok or not
      const size_t k = static_cast<Call*>(tag)->index;
      results[k] = FromGrpcStatus(calls[k].status);
    }
    cq.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
    return results;
  }

  const ShardMap map_;
  const std::vector<std::string> addresses_;
  const std::string fingerprint_;
  const absl::Duration rpc_deadline_, pull_wait_;
  const v1::DType dtype_;        // of tensors on the wire
  const uint64_t chunk_elements_;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;  // the control calls
  Mutex push_mu_, pull_mu_;  // one exchange at a time on each set of streams
  std::unique_ptr<RequestStreams> push_streams_ ABSL_GUARDED_BY(push_mu_);
  std::unique_ptr<RequestStreams> pull_streams_ ABSL_GUARDED_BY(pull_mu_);
  std::vector<uint64_t> worker_ids_;  // per server; 0 until registered
  std::vector<std::string> secrets_;  // per server: each registration's secret
  std::vector<uint64_t> incarnations_;  // per server: as of the last registration (0: none yet)
  Mutex plan_mu_;  // replies land on the push and pull threads
  std::map<int, v1::SharePlan> plans_ ABSL_GUARDED_BY(plan_mu_);  // per segment, from server 0
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterClient>> ConnectGrpc(const v1::JobConfig& config,
                                                             const std::vector<std::string>& addresses) {
  if (addresses.size() != config.cluster().num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat(addresses.size(), " server addresses given, but the config has ",
                                                   config.cluster().num_servers(), " servers"));
  }
  absl::StatusOr<ShardMap> map = ShardMap::Create(config.model(), config.cluster().num_servers());
  if (!map.ok()) return map.status();
  absl::StatusOr<Security> security = LoadSecurity(config.security());
  if (!security.ok()) return security.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = ChannelCredentials(*security);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<ParameterClient>(new GrpcClient(config, *std::move(map), addresses, *credentials));
}

std::vector<std::string> ServerAddresses(const std::string& flag, const v1::JobConfig& config) {
  if (!flag.empty()) return absl::StrSplit(flag, ',', absl::SkipEmpty());
  return {config.cluster().server_addresses().begin(), config.cluster().server_addresses().end()};
}

}  // namespace segps
