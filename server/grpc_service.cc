#include "server/grpc_service.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/security.h"
#include "common/server_route.h"
#include "common/sync.h"
#include "common/tensor_wire_grpc.h"
#include "server/handler_pool.h"
#include "server/replication_service.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "segps/v1/parameter_server.grpc.pb.h"

namespace segps {
namespace {

// The wait a call may spend: the client's deadline, capped by the server's
// own limit so that no call waits forever (on the server's clock).
absl::Time WaitDeadline(const grpc::CallbackServerContext* context, const ParameterServer& server) {
  const absl::Time now = server.clock()->Now();
  const absl::Time capped = now + server.max_wait();
  const auto client = context->deadline();
  if (client == std::chrono::system_clock::time_point::max()) return capped;
  return std::min(capped, now + (absl::FromChrono(client) - absl::Now()));
}

// Values a reply carries, encoded straight from the shard into the slice
// gRPC sends.
class OutgoingValues {
 public:
  auto reader() {
    return [this](absl::Span<const float> values, v1::DType dtype) {
      data_ = EncodeValues(values, dtype);
      present_ = true;
    };
  }
  // `message` (a PullResponse or PushResponse: field `field` is its
  // `values`) with the values as its values' data, if there are any.
  template <typename Message>
  grpc::ByteBuffer Encode(Message* message, int field) {
    if (!present_) {
      grpc::Slice bytes(message->SerializeAsString());
      return grpc::ByteBuffer(&bytes, 1);
    }
    const v1::TensorSlice tensor = std::move(*message->mutable_values());
    message->clear_values();
    return EncodeTensorMessage(*message, field, tensor, data_);
  }

 private:
  grpc::Slice data_;
  bool present_ = false;
};

// The registrations whose calls a PushStream or PullStream carried, told to
// the server as the stream sees each first and when it ends (so that a
// worker whose process died frees its rank at once). Thread-safe.
class StreamUsers {
 public:
  void Saw(ParameterServer* server, uint32_t segment, uint64_t id, const std::string& secret,
           const std::string& caller) {
    MutexLock lock(&mu_);
    if (ended_ || absl::c_linear_search(seen_, std::pair{segment, id})) return;
    if (server->StreamOpened(segment, id, secret, caller)) seen_.emplace_back(segment, id);
  }
  // The stream ended or was cancelled (its client went away); once.
  void End(ParameterServer* server) {
    MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
    for (const auto& [segment, id] : seen_) server->StreamClosed(segment, id);
  }

 private:
  Mutex mu_;
  std::vector<std::pair<uint32_t, uint64_t>> seen_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

// How a call that may wait ends: its status and, when OK, its reply.
using Reply = absl::AnyInvocable<void(grpc::Status, grpc::ByteBuffer) &&>;

// `name`'s request parsed from `bytes`, or INVALID_ARGUMENT naming the method
// and the message: bytes that do not parse are the client's mistake, not
// the INTERNAL gRPC's own parsing would answer.
template <typename Request>
grpc::Status Parse(const char* name, const grpc::ByteBuffer& bytes, Request* request) {
  grpc::ByteBuffer copy(bytes);  // shares the slices
  grpc::ProtoBufferReader reader(&copy);
  if (!request->ParseFromZeroCopyStream(&reader)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat(name, ": the request does not parse as ", Request::descriptor()->full_name()));
  }
  return grpc::Status::OK;
}

grpc::ByteBuffer Serialize(const google::protobuf::MessageLite& message) {
  grpc::Slice bytes(message.SerializeAsString());
  return grpc::ByteBuffer(&bytes, 1);
}

// A Pull or Push in flight: the reply being built and the values the
// server hands over for it, kept until the call completes.
template <typename Response>
struct InFlight {
  Response response;
  OutgoingValues values;
};

// Serves a parsed pull from `caller`.
void Pull(ParameterServer* server, absl::Time deadline, const v1::PullRequest& request, std::string caller,
          Reply finish);

// Tensor bytes from which a request is served on the handler pool.
constexpr size_t kHeavyBytes = 256 << 10;

void ServePull(ParameterServer* server, HandlerPool* pool, const Caller& caller, absl::Time deadline,
               const char* name, const grpc::ByteBuffer& bytes, Reply finish, StreamUsers* users = nullptr) {
  v1::PullRequest request;
  if (grpc::Status parsed = Parse(name, bytes, &request); !parsed.ok()) {
    return std::move(finish)(parsed, grpc::ByteBuffer());
  }
  if (absl::Status allowed = AuthorizeCall(caller, request.worker_id() != 0 || !request.reader(), name);
      !allowed.ok()) {
    return std::move(finish)(ToGrpcStatus(allowed), grpc::ByteBuffer());
  }
  if (users != nullptr && request.worker_id() != 0) {
    users->Saw(server, request.segment(), request.worker_id(), request.registration_secret(), caller.identity);
  }
  // The values' encoding is the work: by the range the reply carries.
  const ShardMap& map = server->shard_map();
  if (pool != nullptr && request.segment() < static_cast<uint32_t>(map.num_segments())) {
    const uint64_t count = request.count() != 0 ? request.count() : map.range(request.segment(), server->index()).count;
    if (count * sizeof(float) >= kHeavyBytes) {
      return pool->Post([server, deadline, request, identity = caller.identity, finish = std::move(finish)]() mutable {
        Pull(server, deadline, request, std::move(identity), std::move(finish));
      });
    }
  }
  Pull(server, deadline, request, caller.identity, std::move(finish));
}

void Pull(ParameterServer* server, absl::Time deadline, const v1::PullRequest& request, std::string caller,
          Reply finish) {
  auto call = std::make_unique<InFlight<v1::PullResponse>>();
  InFlight<v1::PullResponse>* const c = call.get();
  server->Pull(request, deadline, c->values.reader(), &c->response,
               [call = std::move(call), finish = std::move(finish)](absl::Status status) mutable {
                 if (!status.ok()) return std::move(finish)(ToGrpcStatus(status), grpc::ByteBuffer());
                 std::move(finish)(grpc::Status::OK,
                                   call->values.Encode(&call->response, v1::PullResponse::kValuesFieldNumber));
               },
               caller);
}

void ServePush(ParameterServer* server, HandlerPool* pool, const Caller& caller, absl::Time deadline,
               const grpc::ByteBuffer& bytes, Reply finish, StreamUsers* users = nullptr) {
  if (absl::Status allowed = AuthorizeCall(caller, true, "Push"); !allowed.ok()) {
    return std::move(finish)(ToGrpcStatus(allowed), grpc::ByteBuffer());
  }
  // `bytes` stays valid until `finish` runs.
  if (pool != nullptr && bytes.Length() >= kHeavyBytes) {
    return pool->Post([server, caller, deadline, &bytes, finish = std::move(finish), users]() mutable {
      ServePush(server, nullptr, caller, deadline, bytes, std::move(finish), users);
    });
  }
  v1::PushRequest header;
  v1::TensorSlice tensor;
  Payload data;
  absl::Status decoded = DecodeTensorMessage(bytes, v1::PushRequest::kGradientFieldNumber, &header, &tensor, &data);
  if (!decoded.ok()) {
    return std::move(finish)(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("Push: ", decoded.message()))),
                             grpc::ByteBuffer());
  }
  if (users != nullptr) {
    users->Saw(server, header.segment(), header.worker_id(), header.registration_secret(), caller.identity);
  }
  *header.mutable_gradient() = std::move(tensor);
  auto call = std::make_unique<InFlight<v1::PushResponse>>();
  InFlight<v1::PushResponse>* const c = call.get();
  server->Push(header, std::move(data), deadline, c->values.reader(), &c->response,
               [call = std::move(call), finish = std::move(finish)](absl::Status status) mutable {
                 if (!status.ok()) return std::move(finish)(ToGrpcStatus(status), grpc::ByteBuffer());
                 std::move(finish)(grpc::Status::OK,
                                   call->values.Encode(&call->response, v1::PushResponse::kValuesFieldNumber));
               },
               caller.identity);
}

// The calls a server holds open (streams, and unary calls from their
// headers until they are answered): `server_limit` over all connections,
// half of that per host (the peer's address without its port) so that one
// host cannot take every call, and `stream_limit` streams per connection
// (its peer address). Once a flood of calls has ended, the memory they took
// goes back to the system. Thread-safe.
class CallCounts {
 public:
  CallCounts(uint32_t stream_limit, uint32_t server_limit)
      : stream_limit_(stream_limit), server_limit_(server_limit), host_limit_(server_limit / 2) {}
  // Counts a new call of `peer`'s (`stream`: a PushStream or PullStream);
  // at a limit, counts nothing and says which (`name`: the method).
  std::optional<std::string> Open(const std::string& peer, const char* name, bool stream) {
    MutexLock lock(&mu_);
    if (streams_ + unary_ >= server_limit_) {
      return absl::StrCat(name, ": this server holds ", server_limit_,
                          " open calls over all its connections (cluster.max_open_calls)");
    }
    const std::string host = Host(peer);
    if (Count(hosts_, host) >= host_limit_) {
      return absl::StrCat(name, ": connections from ", host, " hold ", host_limit_,
                          " open calls, half of what this server holds over all its connections (cluster.max_open_calls)");
    }
    if (stream && Count(streams_of_, peer) >= stream_limit_) {
      return absl::StrCat(name, ": this connection already holds ", stream_limit_,
                          " open streams (cluster.max_streams_per_connection)");
    }
    if (stream) ++streams_of_[peer];
    ++hosts_[host];
    ++(stream ? streams_ : unary_);
    peak_ = std::max(peak_, streams_ + unary_);
    return std::nullopt;
  }
  void Close(const std::string& peer, bool stream) {
    MutexLock lock(&mu_);
    if (stream) {
      auto it = streams_of_.find(peer);
      if (--it->second == 0) streams_of_.erase(it);
    }
    auto host = hosts_.find(Host(peer));
    if (--host->second == 0) hosts_.erase(host);
    --(stream ? streams_ : unary_);
    // A few calls a worker are the resting state; after a flood, glibc
    // keeps the freed buffers in its arenas unless asked to return them.
    if (streams_ + unary_ <= peak_ / 8 && peak_ >= kFlood) {
      malloc_trim(0);
      peak_ = streams_ + unary_;
    }
  }

  uint32_t streams() {
    MutexLock lock(&mu_);
    return streams_;
  }
  uint32_t unary() {
    MutexLock lock(&mu_);
    return unary_;
  }

 private:
  static constexpr uint32_t kFlood = 1024;  // calls at once beyond any job's needs
  // gRPC's peer "ipv4:10.0.0.7:51234" (or "ipv6:[::1]:51234") without its port.
  static std::string Host(const std::string& peer) { return peer.substr(0, peer.rfind(':')); }
  // A count, adding no entry for a key that has none.
  static uint32_t Count(const absl::flat_hash_map<std::string, uint32_t>& counts, const std::string& key) {
    auto it = counts.find(key);
    return it == counts.end() ? 0 : it->second;
  }

  const uint32_t stream_limit_, server_limit_, host_limit_;
  Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> streams_of_ ABSL_GUARDED_BY(mu_);  // by connection
  absl::flat_hash_map<std::string, uint32_t> hosts_ ABSL_GUARDED_BY(mu_);
  uint32_t streams_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t unary_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t peak_ ABSL_GUARDED_BY(mu_) = 0;  // since the last trim
};

// One call from its headers: a PushStream or PullStream, or a unary call
// (registered as a stream of one request and one reply, so that the server
// holds it from its headers on rather than gRPC holding it unseen until its
// request arrives). Reads a request, serves it (which may wait, holding no
// thread), writes its reply and, on a stream, reads the next; a request that
// fails ends the call with its status. A call beyond a limit of `counts`
// ends at once with RESOURCE_EXHAUSTED, and one that sends no request
// within `first_request` ends with DEADLINE_EXCEEDED. A stream has no
// deadline of its own after that, so a request's wait is capped by the
// server's limit alone.
class CallReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  using Serve = std::function<void(const grpc::ByteBuffer&, Reply, StreamUsers*)>;
  CallReactor(const char* name, bool stream, std::string peer, absl::Duration first_request, Serve serve,
              CallCounts* counts, ParameterServer* server)
      : name_(name), stream_(stream), serve_(std::move(serve)), counts_(counts), server_(server),
        peer_(std::move(peer)) {
    if (std::optional<std::string> refused = counts_->Open(peer_, name, stream)) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, *refused));
      return;
    }
    counted_ = armed_ = true;
    refs_.fetch_add(1);  // the alarm's: its callback runs once, fired or cancelled
    alarm_.Set(absl::ToChronoTime(absl::Now() + first_request), [this](bool fired) { FirstRequestDue(fired); });
    StartRead(&request_);
  }
  // A call refused at its headers with `refused`.
  CallReactor(const char* name, const grpc::Status& refused)
      : name_(name), stream_(false), counts_(nullptr), server_(nullptr) {
    End(refused);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done or went away (a unary call: before its request)
      return End(stream_ ? grpc::Status::OK
                         : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                        absl::StrCat(name_, ": the call ended without its request")));
    }
    bool first = false;
    {
      MutexLock lock(&mu_);
      if (ended_) return;  // its deadline ended it meanwhile
      first = !std::exchange(heard_, true);
    }
    if (first) alarm_.Cancel();  // once: not on every message of a stream
    serve_(request_, [this](grpc::Status status, grpc::ByteBuffer reply) { Answer(status, &reply); }, &users_);
  }
  void OnCancel() override { users_.End(server_); }
  void OnWriteDone(bool ok) override {
    if (!ok) return End(grpc::Status::OK);  // the client went away
    reply_.Clear();
    StartRead(&request_);
  }
  void OnDone() override {
    users_.End(server_);
    if (counted_) counts_->Close(peer_, stream_);
    if (armed_) alarm_.Cancel();
    Unref();
  }

 private:
  void Answer(const grpc::Status& status, grpc::ByteBuffer* reply) {
    if (!status.ok()) return End(status);
    request_.Clear();
    reply_.Swap(reply);  // a ByteBuffer copies by reference count; a swap does not even that
    if (stream_) return StartWrite(&reply_);
    if (Ending()) StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void FirstRequestDue(bool fired) {
    bool silent = false;
    if (fired) {
      MutexLock lock(&mu_);
      silent = !heard_;
    }
    if (silent) {
      End(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       absl::StrCat(name_, ": no request within cluster.rpc_deadline_ms of the call's start")));
    }
    Unref();
  }
  // Finishes the call with `status` unless it is ending already.
  void End(const grpc::Status& status) {
    if (Ending()) Finish(status);
  }
  // Whether the caller is the first to end the call (and must).
  bool Ending() {
    MutexLock lock(&mu_);
    return !std::exchange(ended_, true);
  }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  const char* const name_;
  const bool stream_;
  const Serve serve_;
  CallCounts* const counts_;
  ParameterServer* const server_;
  StreamUsers users_;
  const std::string peer_;
  bool counted_ = false, armed_ = false;
  grpc::ByteBuffer request_, reply_;
  grpc::Alarm alarm_;
  std::atomic<int> refs_{1};  // gRPC's, until OnDone
  Mutex mu_;
  bool heard_ ABSL_GUARDED_BY(mu_) = false;  // a request arrived
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
};

// How a method's calls get their CallReactors, from their contexts.
using MakeReactor =
    std::function<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*(grpc::CallbackServerContext*)>;

// A generated gRPC service (`Base`) whose methods are served by CallReactors.
template <typename Base>
class ReactorService : public Base {
 protected:
  // Serves `method` of the service named `service` with `make`'s reactors.
  void Serve(const char* service, const char* method, const MakeReactor& make) {
    const int index = google::protobuf::DescriptorPool::generated_pool()
                          ->FindServiceByName(service)
                          ->FindMethodByName(method)
                          ->index();
    using Handler = grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>;
    // A unary method served as a stream (read at its headers) needs both:
    // the streaming type, then the raw callback API.
    this->MarkMethodStreamed(index, new Handler(make));
    this->MarkMethodRawCallback(index, new Handler(make));
  }
};

// The standard grpc.health.v1.Health service, for orchestrators' probes:
// SERVING for this server ("" or segps.v1.ParameterServer), NOT_FOUND for
// any other service. Open to every caller (probes carry no token), its
// calls are counted with the server's others. Watch answers once and ends.
class HealthService final : public ReactorService<grpc::health::v1::Health::Service> {
 public:
  HealthService(CallCounts* calls, absl::Duration first_request, ParameterServer* server) {
    for (const char* method : {"Check", "Watch"}) {
      Serve(grpc::health::v1::Health::service_full_name(), method,
            [=](grpc::CallbackServerContext* context) -> grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* {
              return new CallReactor(
                  method, false, context->peer(), first_request,
                  [method](const grpc::ByteBuffer& bytes, Reply finish, StreamUsers*) {
                    Answer(method, bytes, std::move(finish));
                  },
                  calls, server);
            });
    }
  }

 private:
  static void Answer(const char* method, const grpc::ByteBuffer& bytes, Reply finish) {
    grpc::health::v1::HealthCheckRequest request;
    grpc::Status status = Parse(method, bytes, &request);
    if (status.ok() && !request.service().empty() && request.service() != v1::ParameterServer::service_full_name()) {
      status = grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat(method, ": this server serves ", v1::ParameterServer::service_full_name(),
                                         " (or \"\"), not \"", request.service(), "\""));
    }
    grpc::health::v1::HealthCheckResponse response;
    response.set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    std::move(finish)(status, status.ok() ? Serialize(response) : grpc::ByteBuffer());
  }
};

// The ParameterServer service on gRPC's callback API, every method raw and
// served as a CallReactor: tensor data leaves the server from one copy of
// the range and is read from the received slices (common/tensor_wire_grpc.h),
// and every request is parsed here (Parse). A call that must wait parks in
// the shard and is finished by whichever call releases it. A call without a
// token the server takes is refused at its headers.
class Service final : public ReactorService<v1::ParameterServer::Service> {
 public:
  Service(ParameterServer* server, Failover* failover, int handler_threads, std::vector<Token> tokens)
      : server_(server),
        failover_(failover),
        tokens_(std::move(tokens)),
        pool_(handler_threads),
        calls_(server->config().cluster().max_streams_per_connection(), server->config().cluster().max_open_calls()),
        first_request_(absl::Milliseconds(server->config().cluster().rpc_deadline_ms())),
        health_(&calls_, first_request_, server) {
    Control<v1::RegisterRequest, v1::RegisterResponse>(
        "Register", true, [](ParameterServer* server, const auto& request, auto* response, const std::string& caller) {
          return server->Register(request, response, caller);
        });
    Control<v1::HeartbeatRequest, v1::HeartbeatResponse>(
        "Heartbeat", true, [](ParameterServer* server, const auto& request, auto* response, const std::string& caller) {
          return server->Heartbeat(request, response, caller);
        });
    Control<v1::LeaveRequest, v1::LeaveResponse>(
        "Leave", true, [](ParameterServer* server, const auto& request, auto* response, const std::string& caller) {
          return server->Leave(request, caller, response);
        });
    Control<v1::RollbackRequest, v1::RollbackResponse>(
        "Rollback", true, [](ParameterServer* server, const auto& request, auto* response, const std::string& caller) {
          return server->Rollback(request, response, caller);
        });
    Control<v1::StatsRequest, v1::StatsResponse>("Stats", false, [this](ParameterServer* server, const auto& request,
                                                                        auto* response, const std::string&) {
      server->Stats(request, response);
      response->set_open_streams(calls_.streams());
      response->set_open_unary_calls(calls_.unary());
      return absl::OkStatus();
    });
    HandleTensors();
  }
  grpc::Service* health() { return &health_; }

 private:
  // How a call of one method is served, from its context.
  // How a method's calls are served, from the call's context and caller.
  // `server`: the one the call is for (Target).
  using Serving =
      std::function<CallReactor::Serve(const grpc::CallbackServerContext&, const Caller&, ParameterServer* server)>;

  // The server a call is for: this one, or with the segps-server header
  // (common/server_route.h) one whose ranges this server took over
  // (server/failover.h).
  absl::StatusOr<ParameterServer*> Target(const grpc::CallbackServerContext& context) {
    const auto& headers = context.client_metadata();
    auto named = headers.find(kServerHeader);
    if (named == headers.end()) return server_;
    uint32_t index = 0;
    if (!absl::SimpleAtoi(absl::string_view(named->second.data(), named->second.size()), &index)) {
      return absl::InvalidArgumentError(absl::StrCat("header ", kServerHeader, " must be a server index"));
    }
    if (failover_ == nullptr && index != server_->index()) {
      return absl::UnavailableError(absl::StrCat("server ", server_->index(), " serves no ranges of server ", index));
    }
    return failover_ == nullptr ? server_ : failover_->Route(index);
  }

  // Serves `method` (`stream`: a streaming one) with CallReactors.
  void Handle(const char* method, bool stream, Serving serving) {
    Serve(v1::ParameterServer::service_full_name(), method,
          [this, method, stream, serving = std::move(serving)](grpc::CallbackServerContext* context)
              -> grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* {
            const Caller caller = CallerOf(*context, tokens_);
            if (absl::Status admitted = AuthorizeCall(caller, false, method); !admitted.ok()) {
              return new CallReactor(method, ToGrpcStatus(admitted));
            }
            absl::StatusOr<ParameterServer*> target = Target(*context);
            if (!target.ok()) return new CallReactor(method, ToGrpcStatus(target.status()));
            return new CallReactor(method, stream, context->peer(), first_request_,
                                   serving(*context, caller, *target), &calls_, *target);
          });
  }

  void HandleTensors() {
    Handle("Pull", false, [this](const grpc::CallbackServerContext& context, const Caller& caller,
                                 ParameterServer* server) -> CallReactor::Serve {
      return [this, &context, caller, server](const grpc::ByteBuffer& bytes, Reply finish, StreamUsers*) {
        ServePull(server, &pool_, caller, WaitDeadline(&context, *server), "Pull", bytes, std::move(finish));
      };
    });
    Handle("Push", false, [this](const grpc::CallbackServerContext& context, const Caller& caller,
                                 ParameterServer* server) -> CallReactor::Serve {
      return [this, &context, caller, server](const grpc::ByteBuffer& bytes, Reply finish, StreamUsers*) {
        ServePush(server, &pool_, caller, WaitDeadline(&context, *server), bytes, std::move(finish));
      };
    });
    Handle("PushStream", true, [this](const grpc::CallbackServerContext&, const Caller& caller,
                                       ParameterServer* server) -> CallReactor::Serve {
      return [this, caller, server](const grpc::ByteBuffer& bytes, Reply finish, StreamUsers* users) {
        ServePush(server, &pool_, caller, server->clock()->Now() + server->max_wait(), bytes, std::move(finish),
                  users);
      };
    });
    Handle("PullStream", true, [this](const grpc::CallbackServerContext&, const Caller& caller,
                                       ParameterServer* server) -> CallReactor::Serve {
      return [this, caller, server](const grpc::ByteBuffer& bytes, Reply finish, StreamUsers* users) {
        ServePull(server, &pool_, caller, server->clock()->Now() + server->max_wait(), "PullStream", bytes,
                  std::move(finish), users);
      };
    });
  }

  // Serves `name`, a call that never waits: authorize, parse, run, reply.
  template <typename Request, typename Response, typename Run>
  void Control(const char* name, bool worker_call, Run run) {
    Handle(name, false,
           [name, worker_call, run](const grpc::CallbackServerContext&, const Caller& caller,
                                    ParameterServer* server) -> CallReactor::Serve {
      return [caller, name, worker_call, run, server](const grpc::ByteBuffer& bytes, Reply finish, StreamUsers*) {
        Request request;
        Response response;
        grpc::Status status = ToGrpcStatus(AuthorizeCall(caller, worker_call, name));
        if (status.ok()) status = Parse(name, bytes, &request);
        if (status.ok()) status = ToGrpcStatus(run(server, request, &response, caller.identity));
        std::move(finish)(status, status.ok() ? Serialize(response) : grpc::ByteBuffer());
      };
    });
  }

  ParameterServer* const server_;
  Failover* const failover_;  // null: calls for this server only
  const std::vector<Token> tokens_;  // the token file's: each call's role comes from its own
  HandlerPool pool_;
  CallCounts calls_;
  const absl::Duration first_request_;
  HealthService health_;
};

class GrpcRunningServer final : public RunningServer {
 public:
  GrpcRunningServer(ParameterServer* core, Failover* failover, std::unique_ptr<Failover> own_failover,
                    std::unique_ptr<Service> service, std::unique_ptr<ReplicationService> replication,
                    std::unique_ptr<grpc::Server> server, std::string address)
      : core_(core),
        failover_(failover),
        own_failover_(std::move(own_failover)),
        service_(std::move(service)),
        replication_(std::move(replication)),
        server_(std::move(server)),
        address_(std::move(address)) {}
  ~GrpcRunningServer() override { Shutdown(absl::ZeroDuration()); }

  const std::string& address() const override { return address_; }
  void Shutdown(absl::Duration grace) override {
    if (server_ == nullptr) return;
    // Parked calls are answered now: gRPC's shutdown waits for every call to finish.
    core_->Drain();
    if (failover_ != nullptr) failover_->Drain();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
    server_.reset();
  }

 private:
  ParameterServer* const core_;
  Failover* const failover_;  // may be null
  std::unique_ptr<Failover> own_failover_;  // where none was given
  std::unique_ptr<Service> service_;
  std::unique_ptr<ReplicationService> replication_;  // null with one copy
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RunningServer>> StartGrpcServer(ParameterServer* server,
                                                               const std::string& listen, int handler_threads,
                                                               Failover* failover) {
  absl::StatusOr<Security> security = LoadSecurity(server->config().security());
  if (!security.ok()) return security.status();
  // A backup serves its primaries' streams (cluster.replicas): with no
  // failover given, it takes no range over.
  std::unique_ptr<Failover> own_failover;
  if (failover == nullptr && server->shard_map().replicas() > 1) {
    absl::StatusOr<std::unique_ptr<Failover>> passive = Failover::Start(server, {}, {});
    if (!passive.ok()) return passive.status();
    own_failover = *std::move(passive);
    failover = own_failover.get();
  }
  auto service = std::make_unique<Service>(server, failover, handler_threads, security->tokens);
  grpc::ServerBuilder builder;
  int port = 0;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(*security);
  if (!credentials.ok()) return credentials.status();
  builder.AddListeningPort(listen, *credentials, &port);
  // One server a port: with SO_REUSEPORT (gRPC's default) a second server
  // given a port in use would share it, and a peer's connections would
  // reach either one.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const int max_bytes = static_cast<int>(server->config().cluster().max_message_bytes());
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  // A worker's streams stay open between its requests. A host that dies
  // without closing its sockets would hold them for ever; pinging every lease period and giving up after
  // another ends them, as the lease itself ends the worker's membership.
  const int lease_ms = static_cast<int>(std::min<uint32_t>(server->config().cluster().lease_ms(), INT32_MAX));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, lease_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, lease_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // idle streams are the point
  // Primaries ping their backups' connections every lease (server/replica_links.h).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, lease_ms / 2);
  // HTTP/2's own cap on a connection's concurrent calls (streams and
  // unary calls, which may park): a client queues beyond it instead of
  // making the server hold what it would refuse.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(std::min<uint32_t>(
                                 server->config().cluster().max_streams_per_connection() + 1024, INT32_MAX)));
  builder.RegisterService(service.get());
  builder.RegisterService(service->health());
  // A backup serves its primaries' streams (cluster.replicas).
  std::unique_ptr<ReplicationService> replication;
  if (server->shard_map().replicas() > 1) {
    replication = std::make_unique<ReplicationService>(server, failover, security->tokens);
    builder.RegisterService(replication.get());
  }
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen,
                                               " (address in use or not local?)"));
  }
  const size_t colon = listen.rfind(':');
  std::string address = absl::StrCat(listen.substr(0, colon), ":", port);
  return std::unique_ptr<RunningServer>(
      new GrpcRunningServer(server, failover, std::move(own_failover), std::move(service), std::move(replication),
                            std::move(grpc_server), std::move(address)));
}

}  // namespace segps
