// segps-health: asks a server's standard grpc.health.v1.Health service
// whether it serves; exit 0 when SERVING. For container healthchecks.
//
//   segps-health --address HOST:PORT [--timeout_ms 2000] [--tls_ca FILE [--tls_cert F --tls_key F] --token_file F]
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <iostream>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "common/security.h"
#include "grpc/health/v1/health.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:7000", "host:port of the server to check");
ABSL_FLAG(int32_t, timeout_ms, 2000, "Deadline of the check");

int main(int argc, char** argv) {
  segps::ParseCommandLine(
      argc, argv, "Checks that a segps server answers.\n  segps-health [--address HOST:PORT] [--timeout_ms MS]");
  segps::v1::SecurityConfig flags;
  segps::ApplySecurityFlags(&flags);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = segps::LoadChannelCredentials(flags);
  if (!credentials.ok()) {
    std::cerr << "segps-health: " << credentials.status().message() << "\n";
    return 2;
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(absl::GetFlag(FLAGS_address), *credentials));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  if (!status.ok()) {
    std::cerr << "segps-health: " << absl::GetFlag(FLAGS_address) << ": " << status.error_message() << "\n";
    return 1;
  }
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()) << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}
