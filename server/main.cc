// segps-server: one parameter server process of a segps cluster.
//
//   segps-server --config job.pbtxt --index I [--listen ADDR]
//
// Prints "segps-server listening on HOST:PORT" on stdout once it serves, and
// shuts down cleanly on SIGTERM or SIGINT.
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/lock_checks.h"
#include "common/malloc_tuning.h"
#include "common/config.h"
#include "common/security.h"
#include "common/log.h"
#include "common/metrics.h"
#include "server/failover.h"
#include "server/grpc_service.h"
#include "server/listener_watch.h"
#include "server/parameter_server.h"
#include "server/region_listener.h"
#include "server/replica_links.h"

ABSL_FLAG(std::string, config, "", "Job config file (*.pbtxt). Required.");
ABSL_FLAG(int32_t, index, -1, "This server's index in [0, cluster.num_servers). Required.");
ABSL_FLAG(std::string, metrics_listen, "",
          "[host:]port to serve Prometheus metrics on (/metrics); a port alone is loopback, 0.0.0.0:PORT serves "
          "other hosts (with --insecure). Default: no metrics.");
ABSL_FLAG(int32_t, apply_threads, 1,
          "Threads a push's optimizer update is split over (updates of 128K elements or more). More than one "
          "shortens a synchronous worker's wait where the server has idle cores.");
ABSL_FLAG(int32_t, handler_threads, 2,
          "Threads that serve pushes and pulls of 256 KiB or more, so that gRPC's own threads keep reading the "
          "sockets meanwhile (smaller requests are served where they arrive).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory of this server's checkpoints (overrides checkpoint.dir of the config). At start the newest "
          "valid checkpoint there is restored; checkpoints are written at every checkpoint.every_clocks.");
ABSL_FLAG(bool, insecure, false,
          "Serve plaintext on an address other hosts can reach: the parameters without TLS (without a "
          "certificate such a server refuses to start: give it --tls_cert and --tls_key, which "
          "deploy/make-certs.sh makes), and the metrics endpoint (--metrics_listen), which is plaintext HTTP.");
ABSL_FLAG(std::string, servers, "",
          "Every server's host:port, in index order, comma-separated: with cluster.replicas >= 2 a server "
          "sends its ranges' changes to the servers that back them. Default: cluster.server_addresses.");
ABSL_FLAG(std::string, listen, "",
          "host:port to serve on. Default: cluster.server_addresses[index] if listed, else "
          "127.0.0.1:0 (a free loopback port). Use 0.0.0.0:PORT to serve other hosts.");

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "segps-server: " << status.message() << "\n";
  return 1;
}

// The server's settings: its config, after the flags.
struct Settings {
  segps::v1::JobConfig config;
  int32_t index = 0;
  int32_t apply_threads = 1, handler_threads = 1;
  std::string listen;
};

// Reads the config and checks the flags; an error names the flag.
absl::StatusOr<Settings> ReadSettings() {
  Settings s;
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (config_path.empty()) return absl::InvalidArgumentError("--config is required (see --help)");
  absl::StatusOr<segps::v1::JobConfig> config = segps::LoadConfig(config_path);
  if (!config.ok()) return config.status();
  s.config = *std::move(config);
  segps::ApplySecurityFlags(s.config.mutable_security());
  s.index = absl::GetFlag(FLAGS_index);
  if (s.index < 0 || s.index >= static_cast<int32_t>(s.config.cluster().num_servers())) {
    return absl::InvalidArgumentError(absl::StrCat("--index must be in [0, ", s.config.cluster().num_servers(),
                                                   ") for this config, got ", s.index));
  }
  s.apply_threads = absl::GetFlag(FLAGS_apply_threads);
  if (s.apply_threads < 1 || s.apply_threads > 256) {
    return absl::InvalidArgumentError(absl::StrCat("--apply_threads must be in [1, 256], got ", s.apply_threads));
  }
  s.handler_threads = absl::GetFlag(FLAGS_handler_threads);
  if (s.handler_threads < 1 || s.handler_threads > 256) {
    return absl::InvalidArgumentError(absl::StrCat("--handler_threads must be in [1, 256], got ", s.handler_threads));
  }
  s.listen = absl::GetFlag(FLAGS_listen);
  if (s.listen.empty()) {
    s.listen = s.index < s.config.cluster().server_addresses_size() ? s.config.cluster().server_addresses(s.index)
                                                                     : "127.0.0.1:0";
  }
  const bool tls = !s.config.security().cert().empty();
  if (!tls && !s.config.security().token_file().empty() && !segps::IsLoopbackAddress(s.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to take tokens on ", s.listen,
        " without TLS: they would cross the network in the clear. Listen on loopback, or give a certificate "
        "and key (--tls_cert, --tls_key; deploy/make-certs.sh makes them)"));
  }
  if (!tls && !segps::IsLoopbackAddress(s.listen) && !absl::GetFlag(FLAGS_insecure)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to serve ", s.listen,
        " in plaintext: other hosts could read the parameters and call every method. Give a certificate "
        "and key (--tls_cert, --tls_key, or security { cert key } in the config; deploy/make-certs.sh "
        "makes them), listen on loopback, or pass --insecure on a network you trust"));
  }
  if (!tls) {
    std::cout << "segps-server: plaintext, "
              << (s.config.security().token_file().empty() ? "no authentication" : "tokens from loopback peers only")
              << " (" << s.listen << ")" << std::endl;
  }
  return s;
}

// The metrics endpoint (--metrics_listen); null without one.
absl::StatusOr<std::unique_ptr<segps::MetricsEndpoint>> StartMetrics() {
  if (absl::GetFlag(FLAGS_metrics_listen).empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<segps::MetricsEndpoint>> endpoint =
      segps::MetricsEndpoint::Start(absl::GetFlag(FLAGS_metrics_listen), absl::GetFlag(FLAGS_insecure));
  if (endpoint.ok()) std::cout << "segps-server metrics on http://" << (*endpoint)->address() << "/metrics" << std::endl;
  return endpoint;
}

// Starts `running` again on `address`, its own: gRPC abandoned its listener
// (server/listener_watch.h). Calls in flight fail; workers rejoin. On an
// error `running` is null until a later call succeeds.
absl::Status Relisten(segps::ParameterServer* server, segps::Failover* failover, const std::string& address,
                      int handler_threads, segps::ServerMetrics* metrics,
                      std::unique_ptr<segps::RunningServer>* running) {
  if (*running != nullptr) (*running)->Shutdown(absl::ZeroDuration());  // drains the parked calls
  running->reset();
  server->Reopen();
  if (failover != nullptr) failover->Reopen();
  absl::StatusOr<std::unique_ptr<segps::RunningServer>> again =
      segps::StartGrpcServer(server, address, handler_threads, failover);
  if (!again.ok()) return again.status();
  *running = *std::move(again);
  if (metrics != nullptr) metrics->ObserveListenerRestart();
  SEGPS_LOG_WARNING << "listening again on " << address;
  return absl::OkStatus();
}

// As many descriptors as the hard limit allows: each connection takes one.
void RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// The socket workers of this host hand their shared regions over on
// (cluster.shared_memory); null where it is off or could not start (their
// tensors then go over TCP).
std::unique_ptr<segps::RegionListener> StartRegionListener(segps::ParameterServer* server) {
  if (!segps::SharedMemoryOn(server->config().cluster())) return nullptr;
  absl::StatusOr<std::unique_ptr<segps::RegionListener>> listener = segps::RegionListener::Start(
      [server](const segps::v1::RegionOffer& offer, std::shared_ptr<segps::SharedRegion> region) {
        return server->AttachRegion(offer, std::move(region));
      },
      segps::RegionBytesFor(server->shard_map(), server->config()));
  if (!listener.ok()) {
    SEGPS_LOG_WARNING << "shared memory is off on this server: " << listener.status().message();
    return nullptr;
  }
  server->OfferRegions((*listener)->name());
  return *std::move(listener);
}

// Serves until SIGTERM or SIGINT; the exit code.
int Serve(const Settings& s) {
  // Block the shutdown signals before gRPC starts its threads, so that only
  // sigwait below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  RaiseDescriptorLimit();
  segps::WatchGrpcLog();

  absl::StatusOr<std::unique_ptr<segps::MetricsEndpoint>> metrics_endpoint = StartMetrics();
  if (!metrics_endpoint.ok()) return Fail(metrics_endpoint.status());
  std::unique_ptr<segps::ServerMetrics> metrics;
  if (*metrics_endpoint != nullptr) {
    metrics = std::make_unique<segps::ServerMetrics>((*metrics_endpoint)->registry(), s.config, s.index);
  }
  absl::StatusOr<segps::Security> security = segps::LoadSecurity(s.config.security());
  if (!security.ok()) return Fail(security.status());
  absl::StatusOr<std::unique_ptr<segps::ParameterServer>> server =
      segps::ParameterServer::Create(s.config, static_cast<uint32_t>(s.index),
                                     {.metrics = metrics.get(),
                                      .apply_threads = s.apply_threads,
                                      .checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir),
                                      .authenticated = !security->tokens.empty(),
                                      .state_key = security->state_key});
  if (!server.ok()) return Fail(server.status());
  const std::unique_ptr<segps::RegionListener> regions = StartRegionListener(server->get());
  std::vector<std::string> peers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  if (peers.empty()) peers.assign(s.config.cluster().server_addresses().begin(), s.config.cluster().server_addresses().end());
  segps::ServerOptions taken_over;  // of the ranges this server may take over
  taken_over.metrics = metrics.get();
  taken_over.authenticated = !security->tokens.empty();
  taken_over.state_key = security->state_key;
  absl::StatusOr<std::unique_ptr<segps::Failover>> failover =
      segps::Failover::Start(server->get(), peers, taken_over);
  if (!failover.ok()) return Fail(failover.status());
  absl::StatusOr<std::unique_ptr<segps::RunningServer>> running =
      segps::StartGrpcServer(server->get(), s.listen, s.handler_threads, failover->get());
  if (!running.ok()) return Fail(running.status());
  const segps::ShardMap& map = (*server)->shard_map();
  uint64_t elements = 0;
  for (int k = 0; k < map.num_segments(); ++k) elements += map.range(k, s.index).count;
  SEGPS_LOG_INFO << "server " << s.index << " of " << s.config.cluster().num_servers() << " holds " << elements
                 << " parameters of " << map.num_segments() << " segments; shard map " << map.fingerprint();
  std::cout << "segps-server listening on " << (*running)->address() << std::endl;
  if (absl::Status taken = segps::TakeBackRanges(server->get(), peers,
                                                 absl::Milliseconds(s.config.cluster().recovery_timeout_ms()));
      !taken.ok()) {
    return Fail(taken);
  }
  absl::StatusOr<std::unique_ptr<segps::ReplicaLinks>> links =
      segps::ReplicaLinks::Start(server->get(), peers, failover->get(), metrics.get());
  if (!links.ok()) return Fail(links.status());

  int received = 0;
  {
    segps::ListenerWatch watch(absl::Seconds(1), [&, address = (*running)->address()] {
      return Relisten(server->get(), failover->get(), address, s.handler_threads, metrics.get(), &*running);
    });
    sigwait(&signals, &received);
  }
  SEGPS_LOG_INFO << "server " << s.index << ": " << (received == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down";
  if (*running != nullptr) (*running)->Shutdown(absl::Seconds(1));
  links->reset();
  failover->reset();
  (*server)->FlushCheckpoints();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  segps::TuneMallocForLargeBuffers();
  segps::RouteProtobufLogs();
  segps::SkipMutexDeadlockDetection();
  std::vector<char*> positional = segps::ParseCommandLine(
      argc, argv,
      "segps parameter server.\n"
      "  segps-server --config FILE --index I [--listen HOST:PORT] [--apply_threads N]");
  if (positional.size() > 1) {
    std::cerr << "segps-server: unexpected argument '" << positional[1] << "' (see --help)\n";
    return 2;
  }
  absl::StatusOr<Settings> settings = ReadSettings();
  if (!settings.ok()) {
    std::cerr << "segps-server: " << settings.status().message() << "\n";
    return 2;
  }
  return Serve(*settings);
}
