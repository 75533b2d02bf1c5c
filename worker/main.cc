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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "common/lock_checks.h"
#include "common/malloc_tuning.h"
#include "common/config.h"
#include "common/config_hints.h"
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
          "other hosts (with --insecure). Default: none.");
ABSL_FLAG(bool, insecure, false,
          "Serve the metrics endpoint (--metrics_listen), which is plaintext HTTP, on an address other hosts "
          "can reach; without it such an address is refused.");
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
int Fail(const absl::Status& status) { return Fail(std::string(status.message())); }

// What every kind of worker starts from.
struct Worker {
  segps::v1::JobConfig config;
  int segment = 0;
  std::optional<uint32_t> rank;
  // With --servers=- the list is read from stdin once everything that does
  // not need the servers is ready.
  bool servers_from_stdin = false;
  std::vector<std::string> servers;
  std::unique_ptr<segps::Backend> backend;
  std::unique_ptr<segps::MetricsEndpoint> metrics_endpoint;
  std::unique_ptr<segps::WorkerMetrics> metrics;
};

absl::Status ReadServersFromStdin(std::vector<std::string>* servers) {
  std::string line;
  if (!std::getline(std::cin, line)) {
    return absl::InvalidArgumentError("--servers -: stdin ended before a line of server addresses");
  }
  *servers = absl::StrSplit(line, ',', absl::SkipEmpty());
  if (servers->empty()) return absl::InvalidArgumentError("--servers -: the line read from stdin names no server");
  return absl::OkStatus();
}

absl::StatusOr<double> SlowdownFactor() {
  const double factor = absl::GetFlag(FLAGS_slowdown_factor);
  if (!(factor >= 1 && factor <= 1000)) {
    return absl::InvalidArgumentError(absl::StrCat("--slowdown_factor must be in [1, 1000], got ", factor));
  }
  return factor;
}

// A stage after the first: the listening end of the link from the previous
// stage. It is a server: its own certificate, and with a CA, mutual TLS (the
// previous stage presents its worker certificate).
absl::StatusOr<std::unique_ptr<segps::Upstream>> ListenUpstream(const segps::v1::JobConfig& config, int stage,
                                                                uint32_t rank) {
  segps::v1::JobConfig link_config = config;
  segps::v1::SecurityConfig& link_security = *link_config.mutable_security();
  if (!absl::GetFlag(FLAGS_stage_tls_cert).empty() || !absl::GetFlag(FLAGS_stage_tls_key).empty()) {
    if (absl::GetFlag(FLAGS_stage_tls_cert).empty() || absl::GetFlag(FLAGS_stage_tls_key).empty()) {
      return absl::InvalidArgumentError("--stage_tls_cert and --stage_tls_key go together");
    }
    link_security.set_cert(absl::GetFlag(FLAGS_stage_tls_cert));
    link_security.set_key(absl::GetFlag(FLAGS_stage_tls_key));
  }
  link_security.set_require_client_cert(!link_security.ca_cert().empty() && !link_security.cert().empty());
  absl::StatusOr<std::unique_ptr<segps::Upstream>> listening =
      segps::Upstream::Listen(link_config, stage, rank, absl::GetFlag(FLAGS_stage_listen));
  if (listening.ok()) std::cout << "stage link listening on " << (*listening)->address() << std::endl;
  return listening;
}

// The next stage's address (--next_stage, or stdin's next line); empty for the last stage.
absl::StatusOr<std::string> NextStage(int stage, int stages) {
  std::string next = absl::GetFlag(FLAGS_next_stage);
  if (stage + 1 < stages && next == "-" && !std::getline(std::cin, next)) {
    return absl::InvalidArgumentError("--next_stage -: stdin ended before the next stage's address");
  }
  if ((stage + 1 < stages) == next.empty()) {
    return absl::InvalidArgumentError(stage + 1 < stages ? "--next_stage is required for every stage but the last"
                                                         : "--next_stage is for stages before the last");
  }
  return next;
}

// A pipeline stage (combine: CHAIN): its links to the neighbouring stages,
// then its training loop. Only stage 0 loads the data.
int RunStage(Worker& w) {
  if (!w.rank.has_value()) return Fail("--rank auto is not for pipeline stages: replica r of each stage pairs up by rank");
  const int stage = w.segment, stages = w.config.model().segments_size();
  segps::StageOptions options;
  options.stage = stage;
  options.replica = *w.rank;
  std::unique_ptr<segps::Upstream> upstream;
  if (stage > 0) {
    absl::StatusOr<std::unique_ptr<segps::Upstream>> listening = ListenUpstream(w.config, stage, *w.rank);
    if (!listening.ok()) return Fail(listening.status());
    upstream = *std::move(listening);
  }
  absl::StatusOr<segps::TrainTest> data;
  if (stage == 0 && !(data = segps::LoadData(w.config)).ok()) return Fail(data.status());
  if (w.servers_from_stdin) {
    if (absl::Status read = ReadServersFromStdin(&w.servers); !read.ok()) return Fail(read);
  }
  absl::StatusOr<std::string> next = NextStage(stage, stages);
  if (!next.ok()) return Fail(next.status());
  absl::StatusOr<std::unique_ptr<segps::ParameterClient>> client = segps::ConnectGrpc(w.config, w.servers);
  if (!client.ok()) return Fail(client.status());
  std::unique_ptr<segps::Downstream> downstream;
  if (stage + 1 < stages) {
    absl::StatusOr<std::unique_ptr<segps::Downstream>> connected =
        segps::Downstream::Connect(w.config, stage, *w.rank, *next);
    if (!connected.ok()) return Fail(connected.status());
    downstream = *std::move(connected);
  }
  // The last stage's replica 0 scores the whole chain as each epoch ends.
  std::unique_ptr<segps::ParameterClient> reader;
  if ((w.config.training().test_every_epoch() || w.config.data().validation_fraction() > 0) &&
      stage + 1 == stages && *w.rank == 0) {
    if (!data.ok() && !(data = segps::LoadData(w.config)).ok()) return Fail(data.status());
    absl::StatusOr<std::unique_ptr<segps::ParameterClient>> connected = segps::ConnectGrpc(w.config, w.servers);
    if (!connected.ok()) return Fail(connected.status());
    reader = *std::move(connected);
    if (w.config.training().test_every_epoch()) options.test = &data->test;
    if (data->validation.size() > 0) options.validation = &data->validation;
    options.reader = reader.get();
  }
  options.upstream = upstream.get();
  options.downstream = downstream.get();
  options.patience = absl::Milliseconds(w.config.cluster().recovery_timeout_ms());
  std::unique_ptr<segps::StageMetrics> stage_metrics;
  if (w.metrics_endpoint != nullptr) {
    stage_metrics = std::make_unique<segps::StageMetrics>(w.metrics_endpoint->registry(),
                                                          w.config.model().segments(stage).name(), stage);
  }
  options.metrics = w.metrics.get();
  options.stage_metrics = stage_metrics.get();
  absl::StatusOr<double> slowdown = SlowdownFactor();
  if (!slowdown.ok()) return Fail(slowdown.status());
  options.slowdown_factor = *slowdown;
  const double pass_ms = absl::GetFlag(FLAGS_pass_ms);
  if (!(pass_ms >= 0 && pass_ms <= 60000)) return Fail(absl::StrCat("--pass_ms must be in [0, 60000], got ", pass_ms));
  options.pass_time = absl::Milliseconds(pass_ms);
  if (options.slowdown_factor > 1 || pass_ms > 0) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  absl::StatusOr<segps::TrainReport> report =
      segps::TrainStage(w.config, options, stage == 0 ? &data->train : nullptr, w.backend.get(), client->get());
  if (!report.ok()) return Fail(report.status());
  if (!absl::GetFlag(FLAGS_history_dir).empty() && report->history.epochs_size() > 0) {  // the last stage's
    absl::Status written =
        segps::WriteHistory(absl::GetFlag(FLAGS_history_dir), report->history, {}, w.config.model().num_classes());
    if (!written.ok()) return Fail(written);
  }
  SEGPS_LOG_INFO << w.config.model().segments(stage).name() << ": done: " << segps::StepsComputed(*report) << ", "
                 << report->samples << " samples in " << report->seconds << " s"
                 << (stage + 1 == stages
                         ? absl::StrCat("; ", segps::LastEpoch(*report, w.config.model()))
                         : std::string());
  return 0;
}

// A worker of an ensemble's segment.
int RunEnsemble(Worker& w) {
  absl::StatusOr<segps::TrainTest> data = segps::LoadData(w.config);
  if (!data.ok()) return Fail(data.status());
  if (std::optional<std::string> warning = segps::MissingClassesWarning(w.config, data->train, w.segment);
      warning.has_value() && w.rank == 0) {
    SEGPS_LOG_WARNING << *warning;
  }
  if (w.servers_from_stdin) {
    if (absl::Status read = ReadServersFromStdin(&w.servers); !read.ok()) return Fail(read);
  }
  absl::StatusOr<std::unique_ptr<segps::ParameterClient>> client = segps::ConnectGrpc(w.config, w.servers);
  if (!client.ok()) return Fail(client.status());
  segps::TrainerOptions options;
  options.segment = w.segment;
  options.rank = w.rank;
  options.metrics = w.metrics.get();
  options.slowdown = absl::Milliseconds(absl::GetFlag(FLAGS_slowdown_ms));
  absl::StatusOr<double> slowdown = SlowdownFactor();
  if (!slowdown.ok()) return Fail(slowdown.status());
  options.slowdown_factor = *slowdown;
  // A stretched step sleeps for tens of microseconds: without the kernel's
  // default 50 us timer slack, the sleep is what was asked for.
  if (options.slowdown_factor > 1) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  options.progress_bar = isatty(STDOUT_FILENO) != 0;
  std::vector<std::vector<float>> test_probabilities;
  if (data->validation.size() > 0) options.validation = &data->validation;
  if (w.config.training().test_every_epoch()) {
    options.test = &data->test;
    if (!absl::GetFlag(FLAGS_history_dir).empty()) options.test_probabilities = &test_probabilities;
  }
  absl::StatusOr<segps::TrainReport> report =
      segps::Train(w.config, options, data->train, w.backend.get(), client->get());
  if (!report.ok()) return Fail(report.status());
  if (!absl::GetFlag(FLAGS_history_dir).empty()) {
    absl::Status written = segps::WriteHistory(absl::GetFlag(FLAGS_history_dir), report->history, test_probabilities,
                                               w.config.model().num_classes());
    if (!written.ok()) return Fail(written);
  }
  SEGPS_LOG_INFO << w.config.model().segments(w.segment).name() << ": done: " << segps::StepsComputed(*report)
                 << ", " << report->samples << " samples in " << report->seconds << " s ("
                 << static_cast<int64_t>(report->samples / std::max(1e-9, report->seconds))
                 << " samples/s); " << segps::LastEpoch(*report, w.config.model())
                 << "; staleness mean " << report->mean_staleness << " max " << report->max_staleness
                 << "; blocked " << report->blocked_seconds << " s";
  return 0;
}

// The config, the worker's place in it and its servers, from the flags.
absl::Status ReadPlace(Worker* w) {
  if (absl::GetFlag(FLAGS_config).empty()) return absl::InvalidArgumentError("--config is required (see --help)");
  absl::StatusOr<segps::v1::JobConfig> config = segps::LoadConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) return config.status();
  w->config = *std::move(config);
  segps::ApplySecurityFlags(w->config.mutable_security());
  const std::string segment_flag = absl::GetFlag(FLAGS_segment);
  w->segment = segps::SegmentIndex(w->config.model(), segment_flag);
  if (w->segment < 0) {
    std::vector<std::string> names;
    for (const segps::v1::SegmentConfig& s : w->config.model().segments()) names.push_back(s.name());
    return absl::InvalidArgumentError(absl::StrCat("--segment '", segment_flag,
                                                   "' names no segment of the config (give an index or a name).",
                                                   segps::Suggest(segment_flag, names)));
  }
  if (segps::DeclaredByTensors(w->config.model().segments(w->segment))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segment \"", w->config.model().segments(w->segment).name(),
        "\" is declared by its tensors (model.segments.tensors), not layers: segps-worker computes only layers; "
        "train it from Python (segps.torch, docs/python.md)"));
  }
  const std::string rank_flag = absl::GetFlag(FLAGS_rank);
  const uint32_t workers = segps::WorkersOf(w->config, w->segment);
  if (rank_flag != "auto") {
    uint32_t r = 0;
    if (!absl::SimpleAtoi(rank_flag, &r) || r >= workers) {
      return absl::InvalidArgumentError(absl::StrCat("--rank must be 'auto' or in [0, ", workers, ") for segment ",
                                                     w->config.model().segments(w->segment).name(), ", got '",
                                                     rank_flag, "'"));
    }
    w->rank = r;
  }
  w->servers_from_stdin = absl::GetFlag(FLAGS_servers) == "-";
  if (!w->servers_from_stdin) {
    w->servers = segps::ServerAddresses(absl::GetFlag(FLAGS_servers), w->config);
    if (w->servers.empty()) {
      return absl::InvalidArgumentError("--servers is required (the config lists no server_addresses)");
    }
  }
  if (w->config.model().combine() != segps::v1::CHAIN && absl::GetFlag(FLAGS_pass_ms) != 0) {
    return absl::InvalidArgumentError("--pass_ms is for pipeline stages (model.combine: CHAIN)");
  }
  return absl::OkStatus();
}

// The metrics endpoint (--metrics_listen) and the worker's series on it.
absl::Status StartMetrics(Worker* w) {
  if (absl::GetFlag(FLAGS_metrics_listen).empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<segps::MetricsEndpoint>> endpoint =
      segps::MetricsEndpoint::Start(absl::GetFlag(FLAGS_metrics_listen), absl::GetFlag(FLAGS_insecure));
  if (!endpoint.ok()) return endpoint.status();
  w->metrics_endpoint = *std::move(endpoint);
  // A pipeline stage before the last computes no loss.
  const bool reports_loss =
      w->config.model().combine() != segps::v1::CHAIN || w->segment + 1 == w->config.model().segments_size();
  w->metrics = std::make_unique<segps::WorkerMetrics>(w->metrics_endpoint->registry(),
                                                      w->config.model().segments(w->segment).name(), reports_loss);
  SEGPS_LOG_INFO << "metrics on http://" << w->metrics_endpoint->address() << "/metrics";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  segps::TuneMallocForLargeBuffers();
  segps::SkipMutexDeadlockDetection();
  std::vector<char*> positional = segps::ParseCommandLine(
      argc, argv, "segps worker.\n  segps-worker --config FILE --segment K --rank R --servers HOST:PORT,...");
  if (positional.size() > 1) return Fail(std::string("unexpected argument '") + positional[1] + "'");
  Worker w;
  if (absl::Status read = ReadPlace(&w); !read.ok()) return Fail(read);
  if (absl::Status started = StartMetrics(&w); !started.ok()) return Fail(started);
  absl::StatusOr<std::unique_ptr<segps::Backend>> backend = segps::CreateBackend(
      absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_tf32), absl::GetFlag(FLAGS_cpu_threads));
  if (!backend.ok()) return Fail(backend.status());
  w.backend = *std::move(backend);
  return w.config.model().combine() == segps::v1::CHAIN ? RunStage(w) : RunEnsemble(w);
}
