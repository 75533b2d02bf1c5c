#include "server/grpc_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
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

class Service final : public v1::ParameterServer::Service {
 public:
  explicit Service(ParameterServer* server) : server_(server) {}

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    return ToGrpcStatus(server_->Register(*request, response));
  }
  grpc::Status Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                    v1::PullResponse* response) override {
    return ToGrpcStatus(server_->Pull(*request, WaitDeadline(context, server_->max_wait()), response));
  }
  grpc::Status Push(grpc::ServerContext* context, const v1::PushRequest* request,
                    v1::PushResponse* response) override {
    return ToGrpcStatus(server_->Push(*request, WaitDeadline(context, server_->max_wait()), response));
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    return ToGrpcStatus(server_->Heartbeat(*request, response));
  }
  grpc::Status Leave(grpc::ServerContext*, const v1::LeaveRequest* request,
                     v1::LeaveResponse*) override {
    return ToGrpcStatus(server_->Leave(*request));
  }
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*,
                     v1::StatsResponse* response) override {
    server_->Stats(response);
    return grpc::Status::OK;
  }

 private:
  ParameterServer* const server_;
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
  builder.RegisterService(service.get());
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
