// segps-bench-scale: how a segps server holds up as workers multiply. N
// lightweight workers (in this process: each with its own registration and
// one PushStream per server, driven by gRPC's callback API, no thread per
// worker) make synchronous rounds (a push with its pull, per server) of a
// small model against S segps-server processes, for each staleness bound.
// Per configuration: worker steps and server pushes per second, p50/p99
// round time, the servers' peak thread count, resident memory per worker
// and CPU per push.
//
//   segps-bench-scale [--workers 1,16,64,256,1024] [--servers 1,2,4] [--staleness 0,2] [--seconds 1.5]
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/command_line.h"
#include "common/config.h"
#include "common/shard_map.h"
#include "common/sync.h"
#include "common/tensor_wire.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/support/subprocess.h"

ABSL_FLAG(std::string, workers, "1,16,64,256,1024", "Worker counts");
ABSL_FLAG(std::string, servers, "1,2,4", "Server counts");
ABSL_FLAG(std::string, staleness, "0,2", "Staleness bounds");
ABSL_FLAG(double, seconds, 1.5, "Timed seconds per configuration (at least 5 rounds per worker)");
ABSL_FLAG(int32_t, workers_per_channel, 64, "Workers sharing one connection to a server");

namespace segps {
namespace {

using bench::CpuSeconds;
using bench::Percentile;
using bench::ProcStatus;

// The integers of a comma-separated flag.
std::vector<int> Numbers(const std::string& list) {
  std::vector<int> out;
  for (double v : bench::Numbers(list)) out.push_back(static_cast<int>(v));
  return out;
}

using Steady = std::chrono::steady_clock;

class Worker;

// One worker's PushStream to one server: writes the worker's push (with
// pull) for each round and reads its reply.
class Stream final : public grpc::ClientBidiReactor<v1::PushRequest, v1::PushResponse> {
 public:
  Stream(Worker* worker, v1::ParameterServer::Stub* stub, v1::PushRequest request)
      : worker_(worker), request_(std::move(request)) {
    stub->async()->PushStream(&context_, this);
    StartCall();
  }
  void Send(uint64_t clock) {
    request_.set_clock(clock);
    StartWrite(&request_);
  }
  void Close() { StartWritesDone(); }
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnWritesDoneDone(bool) override {}
  void OnDone(const grpc::Status& status) override;

 private:
  Worker* const worker_;
  grpc::ClientContext context_;
  v1::PushRequest request_;
  v1::PushResponse reply_;
};

// A lightweight worker: registered with every server, it makes `rounds`
// rounds, each a push-with-pull to every server, the next as soon as the
// last reply of the previous one lands.
class Worker {
 public:
  explicit Worker(Latch* finished) : finished_(finished) {}

  absl::Status Register(const std::vector<std::unique_ptr<v1::ParameterServer::Stub>*>& stubs, uint32_t rank,
                        const v1::JobConfig& config, const ShardMap& map) {
    for (size_t s = 0; s < stubs.size(); ++s) {
      v1::RegisterRequest request;
      request.set_segment(0);
      request.set_rank(rank);
      request.set_model_fingerprint(ModelFingerprint(config));
      request.set_shard_fingerprint(map.fingerprint());
      if (s > 0) request.set_join_clock(clock_);
      v1::RegisterResponse response;
      grpc::ClientContext context;
      grpc::Status status = (*stubs[s])->Register(&context, request, &response);
      if (!status.ok()) return absl::UnavailableError(absl::StrCat("Register: ", status.error_message()));
      clock_ = response.start_clock();
      v1::PushRequest push;
      push.set_segment(0);
      push.set_worker_id(response.worker_id());
      push.set_registration_secret(response.registration_secret());
      push.set_pull(true);
      const Range range = map.range(0, static_cast<uint32_t>(s));
      const std::vector<float> grad(range.count, 1e-3f);
      EncodeFloat32(grad, range.offset, push.mutable_gradient());
      requests_.push_back(std::move(push));
    }
    for (size_t s = 0; s < stubs.size(); ++s) streams_.push_back(new Stream(this, stubs[s]->get(), requests_[s]));
    return absl::OkStatus();
  }

  // Makes `rounds` more rounds; counts down `done` after the last.
  void Run(int rounds, Latch* done) {
    left_ = rounds;
    done_ = done;
    Next();
  }
  void Close() {
    for (Stream* s : streams_) s->Close();
  }

  void Replied() {
    if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    rounds_.push_back(std::chrono::duration<double>(Steady::now() - started_).count());
    ++clock_;
    if (--left_ > 0) return Next();
    done_->CountDown();
  }
  void Failed(const grpc::Status& status) {
    if (!failed_.exchange(true)) {
      std::cerr << "worker failed: " << status.error_code() << " " << status.error_message() << "\n";
      error_ = true;
    }
  }
  void StreamDone() { finished_->CountDown(); }

  std::vector<double>& rounds() { return rounds_; }
  bool error() const { return error_; }
  size_t streams() const { return streams_.size(); }

 private:
  void Next() {
    outstanding_.store(static_cast<int>(streams_.size()), std::memory_order_relaxed);
    started_ = Steady::now();
    for (Stream* s : streams_) s->Send(clock_);
  }

  Latch* const finished_;
  std::vector<v1::PushRequest> requests_;
  std::vector<Stream*> streams_;  // each deletes itself when done
  std::atomic<int> outstanding_{0};
  std::atomic<bool> failed_{false};
  bool error_ = false;
  uint64_t clock_ = 0;
  int left_ = 0;
  Latch* done_ = nullptr;
  Steady::time_point started_;
  std::vector<double> rounds_;
};

void Stream::OnWriteDone(bool ok) {
  if (!ok) return;  // OnDone reports why
  StartRead(&reply_);
}
void Stream::OnReadDone(bool ok) {
  if (ok) worker_->Replied();
}
void Stream::OnDone(const grpc::Status& status) {
  if (!status.ok()) worker_->Failed(status);
  Worker* const worker = worker_;
  delete this;  // before the count that lets the channels go
  worker->StreamDone();
}

struct Row {
  int workers = 0, servers = 0, staleness = 0;
  bool complete = false;
  double steps_per_s = 0, pushes_per_s = 0, p50_ms = 0, p99_ms = 0, threads = 0, kb_per_worker = 0,
         cpu_us_per_push = 0;
};

std::string ConfigText(int servers, int workers, int staleness) {
  return absl::StrFormat(R"pb(
    cluster { num_servers: %d lease_ms: 60000 pull_wait_ms: 60000 }
    model { input_width: 31 num_classes: 10 segments { name: "s" layers { units: 10 activation: SOFTMAX } } }
    optimizer { kind: SGD learning_rate: 1e-3 }
    training { staleness: %d workers_per_segment: %d }
    data { source: SYNTHETIC_SEED train_samples: 1 test_samples: 1 }
  )pb", servers, staleness, workers);
}

// Runs `rounds` rounds of every worker at once; the wall seconds it took.
double RunRounds(std::vector<std::unique_ptr<Worker>>& workers, int rounds) {
  Latch done(static_cast<int>(workers.size()));
  const auto start = Steady::now();
  for (auto& w : workers) w->Run(rounds, &done);
  done.Wait();
  return std::chrono::duration<double>(Steady::now() - start).count();
}

Row Measure(const std::string& dir, int n, int s, int staleness) {
  Row row{n, s, staleness};
  const std::string path = absl::StrCat(dir, "/scale.pbtxt");
  WriteFile(path, ConfigText(s, n, staleness));
  absl::StatusOr<v1::JobConfig> config = LoadConfig(path);
  if (!config.ok()) {
    std::cerr << config.status() << "\n";
    return row;
  }
  const ShardMap map = *ShardMap::Create(config->model(), s);
  ServerProcesses servers = StartServers(path, s);
  if (!servers.ok()) {
    std::cerr << servers.Output() << "\n";
    return row;
  }
  std::vector<double> rss0;
  for (auto& p : servers.processes) rss0.push_back(ProcStatus(p->pid(), "VmRSS"));

  // Connections: one per workers_per_channel workers per server.
  const int per_channel = std::max(1, absl::GetFlag(FLAGS_workers_per_channel));
  const int channels = (n + per_channel - 1) / per_channel;
  std::vector<std::vector<std::unique_ptr<v1::ParameterServer::Stub>>> stubs(s);
  for (int i = 0; i < s; ++i) {
    for (int c = 0; c < channels; ++c) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      stubs[i].push_back(v1::ParameterServer::NewStub(
          grpc::CreateCustomChannel(servers.addresses[i], grpc::InsecureChannelCredentials(), args)));
    }
  }
  Latch finished(n * s);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int w = 0; w < n; ++w) {
    workers.push_back(std::make_unique<Worker>(&finished));
    std::vector<std::unique_ptr<v1::ParameterServer::Stub>*> mine;
    for (int i = 0; i < s; ++i) mine.push_back(&stubs[i][w % channels]);
    absl::Status registered = workers.back()->Register(mine, static_cast<uint32_t>(w), *config, map);
    if (!registered.ok()) {
      std::cerr << registered << "\n";
      workers.pop_back();
      for (int rest = w; rest < n; ++rest) {
        for (int i = 0; i < s; ++i) finished.CountDown();
      }
      for (auto& worker : workers) worker->Close();
      finished.Wait();
      return row;
    }
  }
  // Warm-up: three rounds, which also sizes the timed run.
  const double warm = RunRounds(workers, 3) / 3;
  const int rounds = std::clamp(static_cast<int>(absl::GetFlag(FLAGS_seconds) / std::max(warm, 1e-6)), 5, 2000);
  double kb = 0;
  for (int i = 0; i < s; ++i) kb += ProcStatus(servers.processes[i]->pid(), "VmRSS") - rss0[i];
  row.kb_per_worker = kb / n;
  for (auto& w : workers) w->rounds().clear();

  std::atomic<bool> sampling{true};
  double threads = 0;
  std::thread sampler([&] {
    while (sampling.load()) {
      for (auto& p : servers.processes) threads = std::max(threads, ProcStatus(p->pid(), "Threads"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  double cpu0 = 0;
  for (auto& p : servers.processes) cpu0 += CpuSeconds(p->pid());
  const double wall = RunRounds(workers, rounds);
  double cpu = -cpu0;
  for (auto& p : servers.processes) cpu += CpuSeconds(p->pid());
  sampling = false;
  sampler.join();

  std::vector<double> all;
  bool error = false;
  for (auto& w : workers) {
    all.insert(all.end(), w->rounds().begin(), w->rounds().end());
    error |= w->error();
  }
  for (auto& w : workers) w->Close();
  finished.Wait();
  const double steps = static_cast<double>(n) * rounds;
  row.complete = !error && all.size() == static_cast<size_t>(steps);
  row.steps_per_s = steps / wall;
  row.pushes_per_s = steps * s / wall;
  row.p50_ms = Percentile(all, 0.5) * 1e3;
  row.p99_ms = Percentile(all, 0.99) * 1e3;
  row.threads = threads;
  row.cpu_us_per_push = cpu / (steps * s) * 1e6;
  return row;
}

int Run() {
  const std::string dir = MakeTempDir();
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::cout << absl::StrFormat("%7s %7s %9s %10s %11s %9s %9s %8s %11s %11s %s\n", "workers", "servers", "staleness",
                               "steps/s", "pushes/s", "p50 ms", "p99 ms", "threads", "KB/worker", "CPU us/push",
                               "complete");
  std::vector<Row> rows;
  for (int staleness : Numbers(absl::GetFlag(FLAGS_staleness))) {
    for (int s : Numbers(absl::GetFlag(FLAGS_servers))) {
      for (int n : Numbers(absl::GetFlag(FLAGS_workers))) {
        const Row r = Measure(dir, n, s, staleness);
        rows.push_back(r);
        std::cout << absl::StrFormat("%7d %7d %9d %10.0f %11.0f %9.3f %9.3f %8.0f %11.1f %11.1f %s\n", n, s,
                                     staleness, r.steps_per_s, r.pushes_per_s, r.p50_ms, r.p99_ms, r.threads,
                                     r.kb_per_worker, r.cpu_us_per_push, r.complete ? "yes" : "NO")
                  << std::flush;
      }
    }
  }
  // Figures for tests/bench/run.sh's targets, from one server at staleness 0.
  auto find = [&](int n, int s, int staleness) -> const Row* {
    for (const Row& r : rows) {
      if (r.workers == n && r.servers == s && r.staleness == staleness) return &r;
    }
    return nullptr;
  };
  double best = 0;
  for (const Row& r : rows) {
    if (r.servers == 1 && r.staleness == 0) best = std::max(best, r.steps_per_s);
  }
  std::cout << absl::StrFormat("RESULT scale_thread_limit %ld\n", 4 * cores + 8);
  if (const Row* r = find(1024, 1, 0)) {
    std::cout << absl::StrFormat("RESULT scale_1024_complete %d\nRESULT scale_1024_threads %.0f\n", r->complete ? 1 : 0,
                                 r->threads);
  }
  if (const Row* r = find(256, 1, 0); r != nullptr && best > 0) {
    std::cout << absl::StrFormat("RESULT scale_256_vs_best_throughput %.3f\n", r->steps_per_s / best);
  }
  const Row* one = find(1, 1, 0);
  if (const Row* r = find(256, 1, 0); r != nullptr && one != nullptr && one->p50_ms > 0) {
    std::cout << absl::StrFormat("RESULT scale_256_p99_vs_1_p50 %.3f\n", r->p99_ms / one->p50_ms);
  }
  return 0;
}

}  // namespace
}  // namespace segps

int main(int argc, char** argv) {
  segps::ParseCommandLine(argc, argv, "How a segps server holds up as workers multiply.");
  return segps::Run();
}
