// segps-bench-sparse: embedding rows moved between workers (threads of this
// process, each with its own channels and registration) and segps-server
// processes on loopback, as a training step moves them: a rows-only pull of
// a batch of distinct random rows of one table, then a push of their
// gradients (beside the segment's small dense gradient), applied with SGD.
// The same rounds as ps-lite's sparse peer (../shared/peers/ps-lite):
// batches of `batch` distinct ids out of `rows`, `dim` floats a row.
//
//   segps-bench-sparse --rows 1000000 --dim 64 --batch 4096 --servers 1 --workers 1 --seconds 3
//
// Prints one line per worker: `segps sparse servers S workers W rows/s-per-worker N ms/round M rounds R`.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>
#include <set>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/command_line.h"
#include "common/config.h"
#include "common/malloc_tuning.h"
#include "tests/bench/bench_util.h"
#include "tests/support/subprocess.h"
#include "worker/client/ps_client.h"

ABSL_FLAG(uint64_t, rows, 1000000, "Rows of the table");
ABSL_FLAG(uint32_t, dim, 64, "Floats a row");
ABSL_FLAG(uint32_t, batch, 4096, "Distinct rows a round pulls and pushes");
ABSL_FLAG(int32_t, servers, 1, "Server processes");
ABSL_FLAG(int32_t, workers, 1, "Worker threads");
ABSL_FLAG(double, seconds, 3, "Timed seconds");

namespace segps {
namespace {

using Clock = std::chrono::steady_clock;

std::string ConfigText(uint64_t rows, uint32_t dim, uint32_t batch, int servers, int workers) {
  return absl::StrFormat(R"pb(
    cluster { num_servers: %d lease_ms: 600000 pull_wait_ms: 600000 rpc_deadline_ms: 600000 max_message_bytes: 268435456 }
    model {
      input_width: 1
      num_classes: 2
      categorical_fields: 1
      segments { name: "s" embeddings { name: "t" vocab: %d dim: %d field: 0 } layers { units: 2 activation: SOFTMAX } }
    }
    optimizer { kind: SGD learning_rate: 0.01 }
    training { staleness: -1 workers_per_segment: %d batch_size: %d }
    data { source: SYNTHETIC_CTR train_samples: 1 test_samples: 1 }
  )pb", servers, rows, dim, workers, batch);
}

// 32 batches of `batch` distinct ids below `rows`, ascending, drawn for worker `w`.
std::vector<std::vector<uint64_t>> Batches(uint64_t rows, uint32_t batch, int w) {
  std::mt19937_64 rng(static_cast<uint64_t>(w) + 1);
  std::uniform_int_distribution<uint64_t> pick(0, rows - 1);
  std::vector<std::vector<uint64_t>> out(32);
  for (auto& ids : out) {
    std::set<uint64_t> distinct;
    while (distinct.size() < std::min<uint64_t>(batch, rows)) distinct.insert(pick(rng));
    ids.assign(distinct.begin(), distinct.end());
  }
  return out;
}

int Run() {
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  const uint32_t dim = absl::GetFlag(FLAGS_dim), batch = absl::GetFlag(FLAGS_batch);
  const int servers = absl::GetFlag(FLAGS_servers), workers = absl::GetFlag(FLAGS_workers);
  const std::string dir = MakeTempDir(), path = dir + "/sparse.pbtxt";
  WriteFile(path, ConfigText(rows, dim, batch, servers, workers));
  absl::StatusOr<v1::JobConfig> config = LoadConfig(path);
  if (!config.ok()) return std::cerr << config.status() << "\n", 1;
  ServerProcesses started = StartServers(path, servers);
  if (!started.ok()) return std::cerr << started.Output() << "\n", 1;
  const size_t dense = ShardMap::Create(config->model(), servers)->segment_size(0);
  std::vector<std::thread> threads;
  std::vector<std::string> lines(workers);
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<ParameterClient> client = *ConnectGrpc(*config, started.addresses);
      absl::StatusOr<Registration> registration = client->Register(0, static_cast<uint32_t>(w));
      if (!registration.ok()) return void(lines[w] = absl::StrCat("worker ", w, ": ", registration.status().ToString()));
      const std::vector<std::vector<uint64_t>> batches = Batches(rows, batch, w);
      std::vector<float> dense_grad(dense, 1e-3f);
      std::vector<std::vector<float>> values, grads(1, std::vector<float>(static_cast<size_t>(batch) * dim, 1e-3f));
      std::vector<double> rounds;
      const auto start = Clock::now();
      for (uint64_t clock = registration->start_clock;
           std::chrono::duration<double>(Clock::now() - start).count() < absl::GetFlag(FLAGS_seconds); ++clock) {
        const auto t0 = Clock::now();
        const std::vector<std::vector<uint64_t>> ids = {batches[clock % batches.size()]};
        absl::Status pulled = client->PullRows(0, clock, ids, &values);
        std::unique_ptr<EncodedPush> push = client->Encode(0, clock, dense_grad);
        client->EncodeRows(push.get(), ids, grads);
        absl::Status pushed = pulled.ok() ? client->Send(std::move(push)) : pulled;
        if (!pushed.ok()) return void(lines[w] = absl::StrCat("worker ", w, ": ", pushed.ToString()));
        rounds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      const double wall = std::chrono::duration<double>(Clock::now() - start).count();
      (void)client->Leave(std::nullopt);
      lines[w] = absl::StrFormat("segps sparse servers %d workers %d rows/s-per-worker %.0f ms/round %.3f rounds %d",
                                 servers, workers, static_cast<double>(batch) * rounds.size() / wall,
                                 1000 * bench::Percentile(rounds, 0.5), rounds.size());
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& line : lines) std::cout << line << "\n";
  return 0;
}

}  // namespace
}  // namespace segps

int main(int argc, char** argv) {
  segps::TuneMallocForLargeBuffers();
  segps::ParseCommandLine(argc, argv, "segps-bench-sparse: embedding rows pulled and pushed through segps servers");
  return segps::Run();
}
