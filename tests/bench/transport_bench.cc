// segps-bench-transport: push+pull rounds of dense float32 segments between
// workers (threads of this process, each with its own channels) and
// segps-server processes on loopback, against a bare gRPC echo of the same
// bytes (this binary again, as a separate process) in the same run. With
// --size_mode it measures one large segment over several servers and each
// server's peak resident memory against its share of parameters and Adam
// state.
//
//   segps-bench-transport [--sizes_mb 0.0625,1,4,64] [--servers 1,2] [--workers 1,2]
//   segps-bench-transport --size_mode --size_mb 1024 --servers 4
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/command_line.h"
#include "common/malloc_tuning.h"
#include "common/config.h"
#include "echo.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/support/subprocess.h"
#include "worker/client/ps_client.h"
#include "worker/client/completion.h"
#include "worker/client/completion_loop.h"
#include "worker/client/request_streams.h"

ABSL_FLAG(std::string, sizes_mb, "0.0625,1,4,64", "Segment sizes in MB of float32");
ABSL_FLAG(std::string, servers, "1,2", "Server counts");
ABSL_FLAG(std::string, workers, "1,2", "Worker counts");
ABSL_FLAG(double, seconds, 1.0, "Minimum timed seconds per configuration");
ABSL_FLAG(bool, size_mode, false, "Measure one large segment and the servers' peak memory");
ABSL_FLAG(double, size_mb, 1024, "Segment size in MB for --size_mode");
ABSL_FLAG(bool, echo_server, false, "Internal: serve the echo service and print its address");
ABSL_FLAG(double, compute_ms, 0,
          "Busy time between a worker's rounds, as a training step's compute (0: back to back)");
ABSL_FLAG(double, chunk_mb, 0, "cluster.chunk_bytes in MB (0: the default)");
ABSL_FLAG(bool, shared_memory, false,
          "cluster.shared_memory: tensor bytes through a shared region (same host); off: over TCP");
ABSL_FLAG(int32_t, replicas, 1, "cluster.replicas: copies of each server's range (on the next servers)");
ABSL_FLAG(bool, tls, false,
          "Run the cluster over mutual TLS with bearer tokens (certificates from deploy/make-certs.sh)");
ABSL_FLAG(std::string, wire_dtype, "FLOAT32",
          "cluster.wire_dtype: FLOAT32, BFLOAT16 or FLOAT16 (GB/s still counts float32 bytes)");

namespace segps {
namespace {

using bench::CpuSeconds;
using bench::Numbers;
using bench::Percentile;

using Clock = std::chrono::steady_clock;

std::string SelfPath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return std::string(path, n > 0 ? n : 0);
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Peak resident set of a process, bytes (VmHWM).
double PeakRss(pid_t pid) { return bench::ProcStatus(pid, "VmHWM") * 1024; }

struct Result {
  double gbps = 0, p50_ms = 0, p99_ms = 0, cpu_s_per_gb = 0;
};

// Writes back each buffer it reads, as it arrived.
class EchoReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  EchoReactor() { StartRead(&buffer_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    buffer_.Clear();
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buffer_;
};

class EchoService final : public bench::Echo::WithRawCallbackMethod_EchoStream<bench::Echo::Service> {
  grpc::Status Echo(grpc::ServerContext*, const bench::Blob* request, bench::Blob* reply) override {
    *reply->mutable_data() = request->data();
    return grpc::Status::OK;
  }
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* EchoStream(grpc::CallbackServerContext*) override {
    return new EchoReactor;
  }
};

int ServeEcho() {
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(INT32_MAX);
  builder.SetMaxSendMessageSize(INT32_MAX);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  std::cout << "echo listening on 127.0.0.1:" << port << std::endl;
  server->Wait();
  return 0;
}

Result RunEcho(const std::string& address, pid_t pid, size_t bytes, double seconds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(INT32_MAX);
  args.SetMaxSendMessageSize(INT32_MAX);
  auto stub = bench::Echo::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  bench::Blob request;
  request.mutable_data()->assign(bytes, 'x');
  std::vector<double> rounds;
  const double cpu0 = SelfCpuSeconds() + CpuSeconds(pid);
  const auto start = Clock::now();
  while (rounds.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    grpc::ClientContext context;
    bench::Blob reply;
    const auto t0 = Clock::now();
    if (!stub->Echo(&context, request, &reply).ok()) break;
    rounds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double gb = 2.0 * bytes * rounds.size() / 1e9;
  const double cpu = SelfCpuSeconds() + CpuSeconds(pid) - cpu0;
  return {gb / wall, Percentile(rounds, 0.5) * 1e3, Percentile(rounds, 0.99) * 1e3, cpu / gb};
}

// The raw stream echo: one buffer of `bytes` sent by reference (as segps
// sends a gradient), each reply copied once into a destination (as segps
// lands pulled values), on a stream that stays open (worker/client/request_streams.h).
Result RunEchoStream(const std::string& address, pid_t pid, size_t bytes, double seconds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(INT32_MAX);
  args.SetMaxSendMessageSize(INT32_MAX);
  CompletionLoop loop;
  ServerRoutes routes({ServerRoutes::Way::Own(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args), "the echo")});
  RequestStreams streams(&loop, &routes, "/segps.bench.Echo/EchoStream");
  std::vector<char> sent(bytes, 'x'), landed(bytes);
  char* const data = sent.data();
  const grpc::Slice slice(data, bytes, [](void*) {}, nullptr);
  const std::vector<grpc::ByteBuffer> requests = {grpc::ByteBuffer(&slice, 1)};
  std::vector<double> rounds;
  const double cpu0 = SelfCpuSeconds() + CpuSeconds(pid);
  const auto start = Clock::now();
  while (rounds.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const auto t0 = Clock::now();
    auto exchange = std::make_unique<RequestStreams::Exchange>();
    exchange->call = "Echo";
    exchange->servers = {0};
    exchange->requests = requests;
    exchange->patience = exchange->budget = absl::Seconds(60);
    exchange->take = [&](size_t, grpc::ByteBuffer* reply) {
      std::vector<grpc::Slice> slices;
      if (!reply->Dump(&slices).ok()) return absl::InternalError("unreadable reply");
      size_t at = 0;
      for (const grpc::Slice& s : slices) {
        std::memcpy(landed.data() + at, s.begin(), std::min(s.size(), bytes - at));
        at += s.size();
      }
      return at == bytes ? absl::OkStatus() : absl::InternalError("short reply");
    };
    // Waited for on this thread, which drives the queue meanwhile, as a
    // synchronous round of segps's client does.
    exchange->caller_drives = true;
    Completion<absl::Status> done;
    exchange->done = [done](absl::Status status) { done.Set(std::move(status)); };
    streams.Start(std::move(exchange));
    loop.Drive([&done] { return done.done(); });
    if (!done.Wait().ok()) break;
    rounds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double gb = 2.0 * bytes * rounds.size() / 1e9;
  const double cpu = SelfCpuSeconds() + CpuSeconds(pid) - cpu0;
  return {gb / wall, Percentile(rounds, 0.5) * 1e3, Percentile(rounds, 0.99) * 1e3, cpu / gb};
}

// A config whose one segment has about `floats` parameters (input_width x 10 + 10).
std::string ConfigText(size_t floats, int servers, int workers, bool adam) {
  const size_t width = std::max<size_t>(1, floats / 10 - 1);
  const uint64_t max_message = std::max<uint64_t>(256ull << 20, floats * 4 / servers + (16 << 20));
  const uint64_t chunk = static_cast<uint64_t>(absl::GetFlag(FLAGS_chunk_mb) * (1 << 20));
  return absl::StrFormat(R"pb(
    cluster { num_servers: %d replicas: %d lease_ms: 600000 pull_wait_ms: 600000 rpc_deadline_ms: 600000 max_message_bytes: %d chunk_bytes: %d wire_dtype: %s shared_memory: %s }
    model { input_width: %d num_classes: 10 segments { name: "s" layers { units: 10 activation: SOFTMAX } } }
    optimizer { kind: %s learning_rate: 1e-9 }
    training { staleness: -1 workers_per_segment: %d }
    data { source: SYNTHETIC_SEED train_samples: 1 test_samples: 1 }
  )pb", servers, absl::GetFlag(FLAGS_replicas), std::min<uint64_t>(max_message, (1ull << 31) - 1), chunk,
                         absl::GetFlag(FLAGS_wire_dtype), absl::GetFlag(FLAGS_shared_memory) ? "true" : "false", width, adam ? "ADAM" : "SGD", workers);
}

struct Cluster {
  v1::JobConfig config;
  std::vector<std::unique_ptr<Subprocess>> servers;
  std::vector<std::string> addresses;
};

std::unique_ptr<Cluster> StartCluster(const std::string& dir, size_t floats, int servers, int workers, bool adam) {
  auto cluster = std::make_unique<Cluster>();
  const std::string path = dir + "/bench.pbtxt";
  std::string text = ConfigText(floats, servers, workers, adam);
  if (absl::GetFlag(FLAGS_tls)) {
    const std::string certs = dir + "/certs";
    if (std::system(absl::StrCat("bash ", SEGPS_SOURCE_DIR, "/deploy/make-certs.sh ", certs, " > /dev/null").c_str()) != 0) {
      std::cerr << "deploy/make-certs.sh failed\n";
      return nullptr;
    }
    text += absl::StrCat("security { ca_cert: \"", certs, "/ca.pem\" cert: \"", certs, "/server.pem\" key: \"", certs,
                         "/server.key\" require_client_cert: true token_file: \"", certs, "/tokens\" }\n");
  }
  WriteFile(path, text);
  absl::StatusOr<v1::JobConfig> config = LoadConfig(path);
  if (!config.ok()) {
    std::cerr << config.status() << "\n";
    return nullptr;
  }
  cluster->config = *config;
  ServerProcesses started = StartServers(path, servers, config->cluster().replicas() > 1);
  if (!started.ok()) {
    std::cerr << started.Output() << "\n";
    return nullptr;
  }
  cluster->servers = std::move(started.processes);
  cluster->addresses = started.addresses;
  return cluster;
}

// `workers` threads, each registered as its own worker, doing push+pull rounds.
Result RunRounds(Cluster& cluster, int workers, double seconds, int min_rounds) {
  const size_t n = ShardMap::Create(cluster.config.model(), cluster.addresses.size(),
                                    cluster.config.cluster().replicas())->segment_size(0);
  std::vector<std::vector<double>> rounds(workers);
  std::vector<std::unique_ptr<ParameterClient>> clients;
  std::vector<uint64_t> start_clocks;
  for (int w = 0; w < workers; ++w) {
    clients.push_back(*ConnectGrpc(cluster.config, cluster.addresses));
    absl::StatusOr<Registration> registration = clients.back()->Register(0, static_cast<uint32_t>(w));
    if (!registration.ok()) {
      std::cerr << registration.status() << "\n";
      return {};
    }
    start_clocks.push_back(registration->start_clock);
  }
  double cpu0 = SelfCpuSeconds();
  for (auto& s : cluster.servers) cpu0 += CpuSeconds(s->pid());
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  const double compute = absl::GetFlag(FLAGS_compute_ms);
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<float> grad(n, 1e-3f), params(n);
      for (uint64_t clock = start_clocks[w];; ++clock) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        if (static_cast<int>(rounds[w].size()) >= min_rounds && elapsed >= seconds) break;
        if (compute > 0) {
          const auto busy_until = Clock::now() + std::chrono::duration<double, std::milli>(compute);
          while (Clock::now() < busy_until) {
          }
        }
        const auto t0 = Clock::now();
        // The round a synchronous worker makes: one call per server, or a
        // push and then a pull per chunk when a range exceeds chunk_bytes.
        std::unique_ptr<EncodedPush> push = clients[w]->Encode(0, clock, grad);
        absl::StatusOr<uint64_t> pulled = clients[w]->SendAndPull(std::move(push), absl::MakeSpan(params));
        if (!pulled.ok()) {
          std::cerr << "worker " << w << ": " << pulled.status() << "\n";
          break;
        }
        rounds[w].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  double cpu = SelfCpuSeconds() - cpu0;
  for (auto& s : cluster.servers) cpu += CpuSeconds(s->pid());
  for (auto& c : clients) (void)c->Leave(std::nullopt);
  std::vector<double> all;
  for (auto& r : rounds) all.insert(all.end(), r.begin(), r.end());
  if (all.empty()) return {};
  const double gb = 2.0 * n * 4 * all.size() / 1e9;
  return {gb / wall, Percentile(all, 0.5) * 1e3, Percentile(all, 0.99) * 1e3, cpu / gb};
}

int Run() {
  const std::string dir = MakeTempDir();
  if (absl::GetFlag(FLAGS_size_mode)) {
    const size_t floats = static_cast<size_t>(absl::GetFlag(FLAGS_size_mb) * 1e6 / 4);
    const int servers = static_cast<int>(Numbers(absl::GetFlag(FLAGS_servers)).back());
    std::unique_ptr<Cluster> cluster = StartCluster(dir, floats, servers, 1, /*adam=*/true);
    if (!cluster) return 1;
    Result r = RunRounds(*cluster, 1, 0, 3);
    const ShardMap map = *ShardMap::Create(cluster->config.model(), servers);
    std::cout << absl::StrFormat("size: %.0f MB segment (%zu M params) over %d servers, Adam: round %.0f ms (%.2f GB/s)\n",
                                 floats * 4 / 1e6, map.segment_size(0) / 1000000, servers, r.p50_ms, r.gbps);
    double worst = 0;
    for (int i = 0; i < servers; ++i) {
      const double share = map.range(0, i).count * 4.0 * 3;  // parameters + Adam's m and v
      const double peak = PeakRss(cluster->servers[i]->pid());
      worst = std::max(worst, peak / share);
      std::cout << absl::StrFormat("  server %d: peak RSS %.0f MB, parameters + Adam state %.0f MB, ratio %.2f\n", i,
                                   peak / 1e6, share / 1e6, peak / share);
    }
    std::cout << absl::StrFormat("RESULT size_peak_memory_ratio %.3f\n", worst);
    return 0;
  }

  std::unique_ptr<Subprocess> echo = Subprocess::Start({SelfPath(), "--echo_server"});
  std::optional<std::string> line = echo->WaitForLine("echo listening on", absl::Seconds(30));
  if (!line) return 1;
  const std::string echo_address = line->substr(line->rfind(' ') + 1);
  std::cout << absl::StrFormat("%-10s %7s %7s %9s %9s %9s %10s\n", "size", "servers", "workers", "GB/s", "p50 ms",
                               "p99 ms", "CPU s/GB");
  const double seconds = absl::GetFlag(FLAGS_seconds);
  for (double mb : Numbers(absl::GetFlag(FLAGS_sizes_mb))) {
    const size_t floats = static_cast<size_t>(mb * 1e6 / 4);
    const std::string label = mb < 1 ? absl::StrFormat("%.0f KB", mb * 1000) : absl::StrFormat("%.0f MB", mb);
    Result e = RunEcho(echo_address, echo->pid(), floats * 4, seconds);
    std::cout << absl::StrFormat("%-10s %7s %7s %9.2f %9.3f %9.3f %10.2f\n", label, "echo", "-", e.gbps, e.p50_ms,
                                 e.p99_ms, e.cpu_s_per_gb);
    Result es = RunEchoStream(echo_address, echo->pid(), floats * 4, seconds);
    std::cout << absl::StrFormat("%-10s %7s %7s %9.2f %9.3f %9.3f %10.2f\n", label, "stream", "-", es.gbps,
                                 es.p50_ms, es.p99_ms, es.cpu_s_per_gb);
    for (double s : Numbers(absl::GetFlag(FLAGS_servers))) {
      const std::vector<double> worker_counts = Numbers(absl::GetFlag(FLAGS_workers));
      const int max_workers = static_cast<int>(*std::max_element(worker_counts.begin(), worker_counts.end()));
      std::unique_ptr<Cluster> cluster = StartCluster(dir, floats, static_cast<int>(s), max_workers, false);
      if (!cluster) return 1;
      for (double w : worker_counts) {
        Result r = RunRounds(*cluster, static_cast<int>(w), seconds, 5);
        std::cout << absl::StrFormat("%-10s %7.0f %7.0f %9.2f %9.3f %9.3f %10.2f\n", label, s, w, r.gbps, r.p50_ms,
                                     r.p99_ms, r.cpu_s_per_gb);
        if (std::abs(mb - 4) < 0.5 && s == 1 && w == 1) {
          std::cout << absl::StrFormat("RESULT transport_4mb_gbps %.3f\nRESULT echo_4mb_gbps %.3f\n"
                                       "RESULT echo_stream_4mb_gbps %.3f\nRESULT transport_4mb_cpu_s_per_gb %.3f\n",
                                       r.gbps, e.gbps, es.gbps, r.cpu_s_per_gb);
        }
        if (std::abs(mb - 64) < 1 && s == 1 && w == 1) {
          std::cout << absl::StrFormat("RESULT transport_64mb_gbps %.3f\nRESULT transport_64mb_cpu_s_per_gb %.3f\n",
                                       r.gbps, r.cpu_s_per_gb);
        }
        if (std::abs(mb - 4) < 0.5 && s == 2 && w == 1) {
          std::cout << absl::StrFormat("RESULT transport_4mb_2x1_round_ms %.3f\n", r.p50_ms);
        }
        if (std::abs(mb - 4) < 0.5 && s == 2 && w == 2) {
          std::cout << absl::StrFormat("RESULT transport_4mb_2x2_per_worker_gbps %.3f\n"
                                       "RESULT transport_4mb_2x2_cpu_s_per_gb %.3f\n", r.gbps / 2, r.cpu_s_per_gb);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace segps

int main(int argc, char** argv) {
  segps::TuneMallocForLargeBuffers();
  setenv("MALLOC_ARENA_MAX", "2", /*overwrite=*/0);  // for the servers it starts, as segps-local does
  segps::ParseCommandLine(argc, argv, "Push+pull rounds against segps servers on loopback.");
  if (absl::GetFlag(FLAGS_echo_server)) return segps::ServeEcho();
  return segps::Run();
}
