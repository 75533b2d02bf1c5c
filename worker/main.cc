// segps-worker: trains one segment's share of the data against the servers.
//
//   segps-worker --config job.pbtxt --segment K --rank R --servers HOST:PORT,...
#include <sys/prctl.h>
#include <unistd.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/lock_checks.h"
#include "common/malloc_tuning.h"
#include "common/config.h"
#include "common/security.h"
#include "common/log.h"
#include "common/metrics.h"
#include "worker/model/backend.h"
#include "worker/data/dataset.h"
#include "worker/train/pipeline_trainer.h"
#include "worker/client/ps_client.h"
#include "worker/train/run_history.h"
#include "worker/train/trainer.h"
#include "worker/train/worker_metrics.h"

ABSL_FLAG(std::string, config, "", "Job config file (*.pbtxt). Required.");
ABSL_FLAG(std::string, segment, "", "Segment to train: its index or its name. Required.");
ABSL_FLAG(std::string, rank, "0",
          "This worker's rank within the segment, in [0, workers), or 'auto' to take the lowest free "
          "rank (identical replicas, e.g. a scaled compose service).");
ABSL_FLAG(std::string, metrics_listen, "",
          "[host:]port to serve Prometheus metrics on (/metrics); a port alone is loopback, 0.0.0.0:PORT serves "
          "other hosts. Default: none.");
ABSL_FLAG(std::string, servers, "",
          "Comma-separated host:port of every server, in index order. Default: "
          "cluster.server_addresses. '-' (--servers=-): read the list from the first line of stdin once the data "
          "is loaded (a launcher can then start workers while its servers start).");
ABSL_FLAG(std::string, device, "cpu", "Compute device: cpu, cuda:N, or auto.");
ABSL_FLAG(int32_t, cpu_threads, 1,
          "On the CPU, threads to compute with. More than 1 pays when the servers "
          "sharing the machine are idle while this worker computes (staleness 0).");
ABSL_FLAG(bool, tf32, false, "On a GPU, let cuBLAS use TF32 tensor cores for float32 products.");
ABSL_FLAG(int32_t, slowdown_ms, 0, "Extra milliseconds per step (to play a straggler).");
ABSL_FLAG(double, slowdown_factor, 1,
          "Stretch each step's compute time by this factor, >= 1 (to play a slower device, whose cost grows with "
          "its share of the samples).");
ABSL_FLAG(double, pass_ms, 0,
          "combine: CHAIN: pad every forward pass to at least this many milliseconds and every backward pass to "
          "twice that (a device of fixed speed: stages of equal time, as GPipe's bubble formula assumes).");
ABSL_FLAG(std::string, stage_listen, "127.0.0.1:0",
          "combine: CHAIN, stages after the first: host:port to take the previous stage's activations on (port 0 "
          "picks one; the address is printed as 'stage link listening on ADDR').");
ABSL_FLAG(std::string, stage_tls_cert, "",
          "combine: CHAIN, stages after the first, with TLS: the certificate the stage link listens with, one a "
          "server certificate naming this host (make-certs.sh's server.pem for its NAMEs). Default: --tls_cert.");
ABSL_FLAG(std::string, stage_tls_key, "", "The private key of --stage_tls_cert.");
ABSL_FLAG(std::string, next_stage, "",
          "combine: CHAIN, stages before the last: host:port of the next stage's replica of the same rank (its "
          "--stage_listen). '-': read it from stdin, on the line after --servers=-'s.");
ABSL_FLAG(std::string, history_dir, "",
          "Write this worker's per-epoch history to DIR/SEGMENT.RANK.json (segps.v1.WorkerHistory) and, with "
          "training.test_every_epoch, its test-set probabilities after each epoch to DIR/SEGMENT.RANK.test_probs.npy "
          "([epochs, test samples, classes]), for segps-eval --history_dir.");

namespace {

int Fail(const std::string& message) {
  std::cerr << "segps-worker: " << message << "\n";
  return 1;
}

// A pipeline stage (combine: CHAIN): its links to the neighbouring stages,
// then its training loop. Only stage 0 loads the data.
int RunStage(const segps::v1::JobConfig& config, int stage, std::optional<uint32_t> rank, bool servers_from_stdin,
             std::vector<std::string> servers, segps::Backend* backend, segps::MetricsEndpoint* metrics_endpoint,
             segps::WorkerMetrics* metrics) {
  if (!rank.has_value()) return Fail("--rank auto is not for pipeline stages: replica r of each stage pairs up by rank");
  const int stages = config.model().segments_size();
  std::unique_ptr<segps::Upstream> upstream;
  if (stage > 0) {
    // The link's listening end is a server: its own certificate, and with
    // a CA, mutual TLS (the previous stage presents its worker certificate).
    segps::v1::JobConfig link_config = config;
    segps::v1::SecurityConfig& link_security = *link_config.mutable_security();
    if (!absl::GetFlag(FLAGS_stage_tls_cert).empty() || !absl::GetFlag(FLAGS_stage_tls_key).empty()) {
      if (absl::GetFlag(FLAGS_stage_tls_cert).empty() || absl::GetFlag(FLAGS_stage_tls_key).empty()) {
        return Fail("--stage_tls_cert and --stage_tls_key go together");
      }
      link_security.set_cert(absl::GetFlag(FLAGS_stage_tls_cert));
      link_security.set_key(absl::GetFlag(FLAGS_stage_tls_key));
    }
    link_security.set_require_client_cert(!link_security.ca_cert().empty() && !link_security.cert().empty());
    absl::StatusOr<std::unique_ptr<segps::Upstream>> listening =
        segps::Upstream::Listen(link_config, stage, *rank, absl::GetFlag(FLAGS_stage_listen));
    if (!listening.ok()) return Fail(std::string(listening.status().message()));
    upstream = *std::move(listening);
    std::cout << "stage link listening on " << upstream->address() << std::endl;
  }
  absl::StatusOr<segps::TrainTest> data;
  if (stage == 0) {
    data = segps::LoadData(config);
    if (!data.ok()) return Fail(std::string(data.status().message()));
  }
  std::string next = absl::GetFlag(FLAGS_next_stage);
  if (servers_from_stdin) {
    std::string line;
    if (!std::getline(std::cin, line)) return Fail("--servers -: stdin ended before a line of server addresses");
    servers = absl::StrSplit(line, ',', absl::SkipEmpty());
    if (servers.empty()) return Fail("--servers -: the line read from stdin names no server");
  }
  if (stage + 1 < stages && next == "-" && !std::getline(std::cin, next)) {
    return Fail("--next_stage -: stdin ended before the next stage's address");
  }
  if ((stage + 1 < stages) == next.empty()) {
    return Fail(stage + 1 < stages ? "--next_stage is required for every stage but the last"
                                   : "--next_stage is for stages before the last");
  }
  absl::StatusOr<std::unique_ptr<segps::ParameterClient>> client = segps::ConnectGrpc(config, servers);
  if (!client.ok()) return Fail(std::string(client.status().message()));
  std::unique_ptr<segps::Downstream> downstream;
  if (stage + 1 < stages) {
    absl::StatusOr<std::unique_ptr<segps::Downstream>> connected = segps::Downstream::Connect(config, stage, *rank, next);
    if (!connected.ok()) return Fail(std::string(connected.status().message()));
    downstream = *std::move(connected);
  }
  segps::StageOptions options;
  options.stage = stage;
  options.replica = *rank;
  options.upstream = upstream.get();
  options.downstream = downstream.get();
  options.patience = absl::Milliseconds(config.cluster().recovery_timeout_ms());
  std::unique_ptr<segps::StageMetrics> stage_metrics;
  if (metrics_endpoint != nullptr) {
    stage_metrics = std::make_unique<segps::StageMetrics>(metrics_endpoint->registry(),
                                                          config.model().segments(stage).name(), stage);
  }
  options.metrics = metrics;
  options.stage_metrics = stage_metrics.get();
  options.slowdown_factor = absl::GetFlag(FLAGS_slowdown_factor);
  if (!(options.slowdown_factor >= 1 && options.slowdown_factor <= 1000)) {
    return Fail(absl::StrCat("--slowdown_factor must be in [1, 1000], got ", options.slowdown_factor));
  }
  const double pass_ms = absl::GetFlag(FLAGS_pass_ms);
  if (!(pass_ms >= 0 && pass_ms <= 60000)) return Fail(absl::StrCat("--pass_ms must be in [0, 60000], got ", pass_ms));
  options.pass_time = absl::Milliseconds(pass_ms);
  if (options.slowdown_factor > 1 || pass_ms > 0) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  absl::StatusOr<segps::TrainReport> report =
      segps::TrainStage(config, options, stage == 0 ? &data->train : nullptr, backend, client->get());
  if (!report.ok()) return Fail(std::string(report.status().message()));
  SEGPS_LOG_INFO << config.model().segments(stage).name() << ": done: " << report->steps << " steps, "
                 << report->samples << " samples in " << report->seconds << " s"
                 << (stage + 1 == stages ? absl::StrCat("; last epoch loss ", report->last_loss, " acc ",
                                                        report->last_accuracy)
                                         : std::string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  segps::TuneMallocForLargeBuffers();
  segps::SkipMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "segps worker.\n  segps-worker --config FILE --segment K --rank R --servers HOST:PORT,...");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) return Fail(std::string("unexpected argument '") + positional[1] + "'");
  if (absl::GetFlag(FLAGS_config).empty()) return Fail("--config is required (see --help)");
  absl::StatusOr<segps::v1::JobConfig> config = segps::LoadConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) return Fail(std::string(config.status().message()));
  segps::ApplySecurityFlags(config->mutable_security());

  const std::string segment_flag = absl::GetFlag(FLAGS_segment);
  const int segment = segps::SegmentIndex(config->model(), segment_flag);
  if (segment < 0) {
    return Fail("--segment '" + segment_flag + "' names no segment of the config (give an index or a name)");
  }
  std::optional<uint32_t> rank;
  const std::string rank_flag = absl::GetFlag(FLAGS_rank);
  if (rank_flag != "auto") {
    uint32_t r = 0;
    if (!absl::SimpleAtoi(rank_flag, &r) || r >= segps::WorkersOf(*config, segment)) {
      return Fail("--rank must be 'auto' or in [0, " + std::to_string(segps::WorkersOf(*config, segment)) +
                  ") for segment " + config->model().segments(segment).name() + ", got '" + rank_flag + "'");
    }
    rank = r;
  }
  // With --servers=- the list is read below, once everything that does not
  // need the servers is ready.
  const bool servers_from_stdin = absl::GetFlag(FLAGS_servers) == "-";
  std::vector<std::string> servers;
  if (!servers_from_stdin) {
    servers = segps::ServerAddresses(absl::GetFlag(FLAGS_servers), *config);
    if (servers.empty()) return Fail("--servers is required (the config lists no server_addresses)");
  }

  std::unique_ptr<segps::MetricsEndpoint> metrics_endpoint;
  std::unique_ptr<segps::WorkerMetrics> metrics;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    absl::StatusOr<std::unique_ptr<segps::MetricsEndpoint>> endpoint =
        segps::MetricsEndpoint::Start(absl::GetFlag(FLAGS_metrics_listen));
    if (!endpoint.ok()) return Fail(std::string(endpoint.status().message()));
    metrics_endpoint = *std::move(endpoint);
    // A pipeline stage before the last computes no loss.
    const bool reports_loss =
        config->model().combine() != segps::v1::CHAIN || segment + 1 == config->model().segments_size();
    metrics = std::make_unique<segps::WorkerMetrics>(metrics_endpoint->registry(),
                                                     config->model().segments(segment).name(), reports_loss);
    SEGPS_LOG_INFO << "metrics on http://" << metrics_endpoint->address() << "/metrics";
  }

  if (config->model().combine() != segps::v1::CHAIN && absl::GetFlag(FLAGS_pass_ms) != 0) {
    return Fail("--pass_ms is for pipeline stages (model.combine: CHAIN)");
  }
  absl::StatusOr<std::unique_ptr<segps::Backend>> backend = segps::CreateBackend(
      absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_tf32), absl::GetFlag(FLAGS_cpu_threads));
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  if (config->model().combine() == segps::v1::CHAIN) {
    return RunStage(*config, segment, rank, servers_from_stdin, std::move(servers), backend->get(),
                    metrics_endpoint.get(), metrics.get());
  }
  absl::StatusOr<segps::TrainTest> data = segps::LoadData(*config);
  if (!data.ok()) return Fail(std::string(data.status().message()));
  if (servers_from_stdin) {
    std::string line;
    if (!std::getline(std::cin, line)) return Fail("--servers -: stdin ended before a line of server addresses");
    servers = absl::StrSplit(line, ',', absl::SkipEmpty());
    if (servers.empty()) return Fail("--servers -: the line read from stdin names no server");
  }
  absl::StatusOr<std::unique_ptr<segps::ParameterClient>> client = segps::ConnectGrpc(*config, servers);
  if (!client.ok()) return Fail(std::string(client.status().message()));

  segps::TrainerOptions options;
  options.segment = segment;
  options.rank = rank;
  options.metrics = metrics.get();
  options.slowdown = absl::Milliseconds(absl::GetFlag(FLAGS_slowdown_ms));
  options.slowdown_factor = absl::GetFlag(FLAGS_slowdown_factor);
  if (!(options.slowdown_factor >= 1 && options.slowdown_factor <= 1000)) {
    return Fail(absl::StrCat("--slowdown_factor must be in [1, 1000], got ", options.slowdown_factor));
  }
  // A stretched step sleeps for tens of microseconds: without the kernel's
  // default 50 us timer slack, the sleep is what was asked for.
  if (options.slowdown_factor > 1) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  options.progress_bar = isatty(STDOUT_FILENO) != 0;
  std::vector<std::vector<float>> test_probabilities;
  if (config->training().test_every_epoch()) {
    options.test = &data->test;
    if (!absl::GetFlag(FLAGS_history_dir).empty()) options.test_probabilities = &test_probabilities;
  }
  absl::StatusOr<segps::TrainReport> report =
      segps::Train(*config, options, data->train, backend->get(), client->get());
  if (!report.ok()) return Fail(std::string(report.status().message()));
  if (!absl::GetFlag(FLAGS_history_dir).empty()) {
    absl::Status written = segps::WriteHistory(absl::GetFlag(FLAGS_history_dir), report->history, test_probabilities,
                                               config->model().num_classes());
    if (!written.ok()) return Fail(std::string(written.message()));
  }
  SEGPS_LOG_INFO << config->model().segments(segment).name() << ": done: " << report->steps
                 << " steps, " << report->samples << " samples in " << report->seconds << " s ("
                 << static_cast<int64_t>(report->samples / std::max(1e-9, report->seconds))
                 << " samples/s); last epoch loss " << report->last_loss << " acc " << report->last_accuracy
                 << "; staleness mean " << report->mean_staleness << " max " << report->max_staleness
                 << "; blocked " << report->blocked_seconds << " s";
  return 0;
}
