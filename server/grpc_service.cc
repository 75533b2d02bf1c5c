#include "server/grpc_service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/tensor_wire.h"
#include "segps/v1/parameter_server.grpc.pb.h"

namespace segps {
namespace {

// The wait a handler may spend: the client's deadline, capped by the
// server's own limit so that no call waits forever.
absl::Time WaitDeadline(const grpc::ServerContext* context, absl::Duration cap) {
  const absl::Time capped = absl::Now() + cap;
  const auto client = context->deadline();
  if (client == std::chrono::system_clock::time_point::max()) return capped;
  return std::min(capped, absl::FromChrono(client));
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

// The ParameterServer service, written out instead of generated so that
// Pull replies and Push requests are raw byte buffers: tensor data leaves
// the server from one copy of the range and is read from the received slices
// (common/tensor_wire.h). The control calls use the generated messages.
class Service final : public grpc::Service {
 public:
  explicit Service(ParameterServer* server) : server_(server) {
    Add<v1::RegisterRequest, v1::RegisterResponse>("/segps.v1.ParameterServer/Register", &Service::Register);
    Add<v1::PullRequest, grpc::ByteBuffer>(kPullMethod, &Service::Pull);
    Add<grpc::ByteBuffer, grpc::ByteBuffer>(kPushMethod, &Service::Push);
    AddStream(kPushStreamMethod, &Service::PushStream);
    AddStream(kPullStreamMethod, &Service::PullStream);
    Add<v1::HeartbeatRequest, v1::HeartbeatResponse>("/segps.v1.ParameterServer/Heartbeat", &Service::Heartbeat);
    Add<v1::LeaveRequest, v1::LeaveResponse>("/segps.v1.ParameterServer/Leave", &Service::Leave);
    Add<v1::StatsRequest, v1::StatsResponse>("/segps.v1.ParameterServer/Stats", &Service::Stats);
  }

 private:
  template <typename Request, typename Response>
  using Method = grpc::Status (Service::*)(grpc::ServerContext*, const Request*, Response*);

  // The wire type a handler (de)serialises: messages as MessageLite, raw buffers as themselves.
  template <typename T>
  using Wire = std::conditional_t<std::is_same_v<T, grpc::ByteBuffer>, grpc::ByteBuffer, grpc::protobuf::MessageLite>;

  // Every request arrives as bytes and message requests are parsed here, so
  // that bytes that do not parse are answered as the client's mistake
  // (INVALID_ARGUMENT naming the method and the message), not with the
  // INTERNAL gRPC's own parsing would give.
  template <typename Request, typename Response>
  void Add(const char* path, Method<Request, Response> method) {  // path: a string literal
    const std::string name = std::string(path).substr(std::string(path).rfind('/') + 1);
    AddMethod(new grpc::internal::RpcServiceMethod(
        path, grpc::internal::RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<Service, grpc::ByteBuffer, Response, grpc::ByteBuffer, Wire<Response>>(
            [method, name](Service* service, grpc::ServerContext* context, const grpc::ByteBuffer* bytes,
                           Response* response) {
              if constexpr (std::is_same_v<Request, grpc::ByteBuffer>) {
                return (service->*method)(context, bytes, response);
              } else {
                Request request;
                grpc::ByteBuffer copy(*bytes);  // shares the slices
                grpc::ProtoBufferReader reader(&copy);
                if (!request.ParseFromZeroCopyStream(&reader)) {
                  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                      absl::StrCat(name, ": the request does not parse as ",
                                                   Request::descriptor()->full_name()));
                }
                return (service->*method)(context, &request, response);
              }
            },
            this)));
  }

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request, v1::RegisterResponse* response) {
    return ToGrpcStatus(server_->Register(*request, response));
  }

  grpc::Status Pull(grpc::ServerContext* context, const v1::PullRequest* request, grpc::ByteBuffer* reply) {
    OutgoingValues values;
    v1::PullResponse header;
    absl::Status status = server_->Pull(*request, WaitDeadline(context, server_->max_wait()), values.reader(), &header);
    if (!status.ok()) return ToGrpcStatus(status);
    *reply = values.Encode(&header, v1::PullResponse::kValuesFieldNumber);
    return grpc::Status::OK;
  }

  grpc::Status Push(grpc::ServerContext* context, const grpc::ByteBuffer* request, grpc::ByteBuffer* reply) {
    v1::PushRequest header;
    v1::TensorSlice tensor;
    Payload data;
    absl::Status decoded =
        DecodeTensorMessage(*request, v1::PushRequest::kGradientFieldNumber, &header, &tensor, &data);
    if (!decoded.ok()) return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("Push: ", decoded.message())));
    *header.mutable_gradient() = std::move(tensor);
    OutgoingValues values;
    v1::PushResponse response;
    absl::Status status =
        server_->Push(header, data, WaitDeadline(context, server_->max_wait()), values.reader(), &response);
    if (!status.ok()) return ToGrpcStatus(status);
    *reply = values.Encode(&response, v1::PushResponse::kValuesFieldNumber);
    return grpc::Status::OK;
  }

  using StreamIo = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

  void AddStream(const char* path, grpc::Status (Service::*method)(grpc::ServerContext*, StreamIo*)) {
    AddMethod(new grpc::internal::RpcServiceMethod(
        path, grpc::internal::RpcMethod::BIDI_STREAMING,
        new grpc::internal::BidiStreamingHandler<Service, grpc::ByteBuffer, grpc::ByteBuffer>(
            [method](Service* service, grpc::ServerContext* context, StreamIo* stream) {
              return (service->*method)(context, stream);
            },
            this)));
  }

  // Answers each request on `stream` with `handle`, in order, until the
  // client stops or a request fails (whose status ends the stream). The
  // stream has no deadline of its own, so a request's wait is capped by the
  // server's limit alone.
  template <typename Handle>
  grpc::Status Serve(StreamIo* stream, Handle handle) {
    struct Counted {
      std::atomic<uint32_t>& count;
      explicit Counted(std::atomic<uint32_t>& c) : count(c) { ++count; }
      ~Counted() { --count; }
    } counted(open_streams_);
    grpc::ByteBuffer request;
    while (stream->Read(&request)) {
      grpc::ByteBuffer reply;
      grpc::Status status = handle(&request, &reply);
      if (!status.ok()) return status;
      request.Clear();
      if (!stream->Write(reply)) break;  // the client went away
    }
    return grpc::Status::OK;
  }

  grpc::Status PushStream(grpc::ServerContext* context, StreamIo* stream) {
    return Serve(stream, [&](grpc::ByteBuffer* request, grpc::ByteBuffer* reply) {
      return Push(context, request, reply);
    });
  }

  grpc::Status PullStream(grpc::ServerContext* context, StreamIo* stream) {
    return Serve(stream, [&](grpc::ByteBuffer* bytes, grpc::ByteBuffer* reply) {
      v1::PullRequest request;
      if (!grpc::SerializationTraits<v1::PullRequest>::Deserialize(bytes, &request).ok()) {
        return ToGrpcStatus(absl::InvalidArgumentError("PullStream: malformed PullRequest"));
      }
      return Pull(context, &request, reply);
    });
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request, v1::HeartbeatResponse* response) {
    return ToGrpcStatus(server_->Heartbeat(*request, response));
  }
  grpc::Status Leave(grpc::ServerContext*, const v1::LeaveRequest* request, v1::LeaveResponse*) {
    return ToGrpcStatus(server_->Leave(*request));
  }
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse* response) {
    server_->Stats(response);
    response->set_open_streams(open_streams_.load());
    return grpc::Status::OK;
  }

  ParameterServer* const server_;
  std::atomic<uint32_t> open_streams_{0};
};

class GrpcRunningServer final : public RunningServer {
 public:
  GrpcRunningServer(std::unique_ptr<Service> service, std::unique_ptr<grpc::Server> server,
                    std::string address)
      : service_(std::move(service)), server_(std::move(server)), address_(std::move(address)) {}
  ~GrpcRunningServer() override { Shutdown(absl::ZeroDuration()); }

  const std::string& address() const override { return address_; }
  void Shutdown(absl::Duration grace) override {
    if (server_ == nullptr) return;
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    server_->Wait();
    server_.reset();
  }

 private:
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RunningServer>> StartGrpcServer(ParameterServer* server,
                                                               const std::string& listen) {
  auto service = std::make_unique<Service>(server);
  // The standard grpc.health.v1.Health service, for orchestrators' health checks.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  const int max_bytes = static_cast<int>(server->config().cluster().max_message_bytes());
  builder.SetMaxReceiveMessageSize(max_bytes);
  builder.SetMaxSendMessageSize(max_bytes);
  // A worker's streams stay open between its requests, each holding a
  // handler thread in Read. A host that dies without closing its sockets
  // would hold them for ever; pinging every lease period and giving up after
  // another ends them, as the lease itself ends the worker's membership.
  const int lease_ms = static_cast<int>(std::min<uint32_t>(server->config().cluster().lease_ms(), INT32_MAX));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, lease_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, lease_ms);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // idle streams are the point
  builder.RegisterService(service.get());
  // gRPC's sync server starts a thread whenever its last idle poller takes
  // a call, and ends one that finishes a call while max pollers are idle:
  // with the default max of 2, steady traffic creates a thread per call.
  builder.SetSyncServerOption(grpc::ServerBuilder::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::MAX_POLLERS, 64);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen,
                                               " (address in use or not local?)"));
  }
  const size_t colon = listen.rfind(':');
  std::string address = absl::StrCat(listen.substr(0, colon), ":", port);
  return std::unique_ptr<RunningServer>(
      new GrpcRunningServer(std::move(service), std::move(grpc_server), std::move(address)));
}

}  // namespace segps
