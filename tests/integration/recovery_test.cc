// Jobs that survive failures, as separate processes on loopback: servers
// killed (-9) mid-run and started again with the same command, paused past
// their lease, workers killed and started again. The job completes, and at
// staleness 0 with one worker per segment its parameters are bit-identical
// to the same job never interrupted.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tests/support/process_cluster.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

// 2 servers, segment "s" (50 -> 32 -> 10), Adam, one worker per segment
// unless `training` says otherwise; 375 steps at batch 32 and 3 epochs.
std::string Job(const std::string& dir, const std::string& training, int epochs = 3, int lease_ms = 1000,
                const std::string& cluster = "") {
  const std::string path = dir + "/job.pbtxt";
  WriteFile(path, absl::StrFormat(R"pb(
    cluster { num_servers: 2 lease_ms: %d %s }
    model {
      input_width: 50
      num_classes: 10
      segments { name: "s" layers { units: 32 activation: RELU } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { kind: ADAM }
    training { batch_size: 32 epochs: %d log_interval_s: 0.000001 %s }
    data { source: SYNTHETIC_TEACHER test_samples: 500 train_samples: 4000 }
    checkpoint { every_clocks: 25 }
  )pb", lease_ms, cluster, epochs, training));
  return path;
}

// The parameters of the job run once without interruption.
std::string Uninterrupted(const std::string& training) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, training), dir, 2);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  return cluster.Parameters("s");
}

// A seeded step to fail at, between the first checkpoints and the end.
int StepToFailAt(uint32_t seed) {
  std::mt19937 rng(seed);
  return std::uniform_int_distribution<int>(40, 300)(rng);
}

struct Failure {
  enum Kind { kServer0, kServer1, kWorker } kind;
  int step;  // when the worker prints step N/375
};

// Runs the job with `failures` injected in order, each process killed with
// SIGKILL and started again with the same command; returns the parameters.
std::string Interrupted(const std::vector<Failure>& failures) {
  const std::string dir = MakeTempDir();
  // Calls carry tokens, so the rollbacks a server restarted from its
  // checkpoint needs show the servers' sealed states.
  ProcessCluster cluster(Job(dir, "staleness: 0"), dir, 2, /*checkpoints=*/true, /*tokens=*/true);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  for (const Failure& f : failures) {
    const std::string step = absl::StrCat(" step ", f.step, "/375 ");
    EXPECT_TRUE(worker->WaitForLine(step, absl::Seconds(120)).has_value()) << step << "\n" << worker->output();
    if (f.kind == Failure::kWorker) {
      worker->Signal(SIGKILL);
      worker->Wait(absl::Seconds(30));
      worker = cluster.StartWorker("s", 0);
    } else {
      const int i = f.kind == Failure::kServer0 ? 0 : 1;
      EXPECT_TRUE(cluster.WaitForFirstCheckpoint(i)) << cluster.Output();
      cluster.KillServer(i);
      EXPECT_TRUE(cluster.StartServer(i)) << cluster.Output();
      EXPECT_TRUE(worker->WaitForLine("rejoined at clock", absl::Seconds(120)).has_value()) << worker->output();
    }
  }
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
  return cluster.Parameters("s");
}

TEST(Recovery, KilledServerRestartedGivesTheUninterruptedParametersBitForBit) {
  const std::string reference = Uninterrupted("staleness: 0");
  ASSERT_GT(reference.size(), 1000u);
  const int step = StepToFailAt(1);
  SCOPED_TRACE(absl::StrCat("server 1 killed at step ", step));
  EXPECT_TRUE(Interrupted({{Failure::kServer1, step}}) == reference);
}

TEST(Recovery, KilledWorkerRestartedGivesTheUninterruptedParametersBitForBit) {
  const std::string reference = Uninterrupted("staleness: 0");
  const int step = StepToFailAt(2);
  SCOPED_TRACE(absl::StrCat("the worker killed at step ", step));
  EXPECT_TRUE(Interrupted({{Failure::kWorker, step}}) == reference);
}

TEST(Recovery, TwoFailuresInARowGiveTheUninterruptedParametersBitForBit) {
  const std::string reference = Uninterrupted("staleness: 0");
  const int first = StepToFailAt(3);
  SCOPED_TRACE(absl::StrCat("server 0 killed at step ", first, ", then the worker 40 steps later"));
  EXPECT_TRUE(Interrupted({{Failure::kServer0, first}, {Failure::kWorker, first + 40}}) == reference);
}

// Staleness 2, two workers per segment: each server in turn is killed
// mid-run and started again; every worker completes and the model is good.
TEST(Recovery, EachServerKilledInTurnAtStaleness2TheJobCompletesAndReachesItsBar) {
  const std::string dir = MakeTempDir();
  // A lease long enough that a peer slow to notice a restart (a loaded
  // machine) still holds the segment: it rejoins at its own clock rather
  // than at the clock its peer reached alone, skipping its steps.
  ProcessCluster cluster(Job(dir, "staleness: 2 workers_per_segment: 2", 8, 5000), dir, 2, /*checkpoints=*/true,
                         /*tokens=*/true);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < 2; ++r) workers.push_back(cluster.StartWorker("s", r));
  // 8 epochs of 63 steps per worker (2000 samples each). A worker that
  // starts late (a loaded machine) joins at its peer's clock: the kills
  // count from the later of the two, so that both are registered by then.
  uint64_t start = 0;
  for (auto& w : workers) {
    std::optional<std::string> joined = w->WaitForLine("registered at clock ", absl::Seconds(60));
    ASSERT_TRUE(joined.has_value()) << w->output();
    const size_t at = joined->find("at clock ") + 9;
    uint64_t clock = 0;
    ASSERT_TRUE(absl::SimpleAtoi(joined->substr(at, joined->find(' ', at) - at), &clock)) << *joined;
    start = std::max(start, clock);
  }
  ASSERT_LT(start, 300u) << "a worker joined too late for two kills";
  for (const auto& [server, step] : {std::pair{0, start + 60}, std::pair{1, start + 160}}) {
    ASSERT_TRUE(workers[0]->WaitForLine(absl::StrCat(" step ", step, "/"), absl::Seconds(120)).has_value())
        << workers[0]->output();
    ASSERT_TRUE(cluster.WaitForFirstCheckpoint(server)) << cluster.Output();
    cluster.KillServer(server);
    ASSERT_TRUE(cluster.StartServer(server)) << cluster.Output();
    for (auto& w : workers) {
      EXPECT_TRUE(w->WaitForLine("rejoined at clock", absl::Seconds(120)).has_value()) << w->output();
    }
  }
  for (auto& w : workers) {
    std::optional<int> status = w->Wait(absl::Seconds(180));
    EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << w->output();
  }
  EXPECT_GT(cluster.EnsembleAccuracy(), 0.80);
}

// A server paused for longer than the lease: once it runs again, the
// worker's lease there has run out (unless the worker's queued calls reach
// it before its lease check does); either way the job completes.
// Server 1 paused for 6 s: longer than its leases (1 s) and than any call
// to it may take (0.5 s a call, retried within 1 s for a push, 3.5 s for a
// pull), so the worker must give up on it, wait for it and rejoin, and the
// job completes.
TEST(Recovery, ServerPausedPastTheLeaseAndResumedTheJobCompletes) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, "staleness: 1", 4, 1000, "rpc_deadline_ms: 500 pull_wait_ms: 500"), dir, 2,
                         /*checkpoints=*/true, /*tokens=*/true);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  ASSERT_TRUE(worker->WaitForLine(" step 100/", absl::Seconds(120)).has_value()) << worker->output();
  cluster.Pause(1, absl::Seconds(6));
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  EXPECT_NE(worker->output().find("step 500/500"), std::string::npos) << worker->output();
  EXPECT_NE(worker->output().find("rejoined at clock"), std::string::npos)
      << "the worker did not recover: " << worker->output();
}

// The same pause with two workers a segment and no checkpoint directory:
// the servers share no checkpoint to roll back to, so each worker continues
// from the lowest clock a server has it at, and the others acknowledge the
// repeated pushes. The servers end with the same clock and update count
// (segps-eval scores only such a model): every step once, but those a
// worker skipped to catch up with a live peer (its lease lapsed while the
// peer went on; it says so: "rejoined at clock R ... (at clock A < R").
TEST(Recovery, ServerPausedPastTheLeaseWithoutCheckpointsTheServersEndAgreeing) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, "staleness: 2 workers_per_segment: 2", 4, 1000, "rpc_deadline_ms: 500 pull_wait_ms: 500"),
                  dir, 2, /*checkpoints=*/false);
  std::unique_ptr<Subprocess> a = cluster.StartWorker("s", 0), b = cluster.StartWorker("s", 1);
  // Both registered before the pause (one that starts late, as under
  // ThreadSanitizer, joins at its peer's clock: counted below).
  ASSERT_TRUE(b->WaitForLine("registered at clock", absl::Seconds(120)).has_value()) << b->output();
  ASSERT_TRUE(a->WaitForLine(" step 60/", absl::Seconds(120)).has_value()) << a->output();
  cluster.Pause(1, absl::Seconds(3));
  for (Subprocess* w : {a.get(), b.get()}) {
    std::optional<int> status = w->Wait(absl::Seconds(120));
    EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << w->output();
  }
  // A worker whose calls to server 1 timed out rejoined; the other may
  // have waited for it on server 0 all along.
  EXPECT_NE((a->output() + b->output()).find("rejoined at clock"), std::string::npos)
      << "no recovery: " << a->output() << b->output();
  uint64_t skipped = 0;
  const std::string logs = a->output() + b->output();
  const std::regex rejoined("rejoined at clock ([0-9]+) after [^(]*\\(at clock ([0-9]+):");
  for (auto it = std::sregex_iterator(logs.begin(), logs.end(), rejoined); it != std::sregex_iterator(); ++it) {
    const uint64_t resumed = std::stoull((*it)[1]), at = std::stoull((*it)[2]);
    if (resumed > at) skipped += resumed - at;
  }
  const std::regex joined(": registered at clock ([0-9]+) on");  // a late start's steps are its peer's
  for (auto it = std::sregex_iterator(logs.begin(), logs.end(), joined); it != std::sregex_iterator(); ++it) {
    skipped += std::stoull((*it)[1]);
  }
  const std::string scored = cluster.Evaluation();
  // 4000 samples in halves of 2000, batch 32, 4 epochs: 63 steps an epoch each.
  EXPECT_NE(scored.find(absl::StrCat("traffic s: ", 504 - skipped, " steps")), std::string::npos)
      << "the servers disagree, or steps were lost:\n" << scored << logs << cluster.Output();
}

// segps-local restarts a server killed mid-run on its address; it restores
// its checkpoint, the workers rejoin, and the job reaches its bar.
TEST(Recovery, LocalLauncherRestartsAKilledServerAndTheJobReachesItsBar) {
  const std::string dir = MakeTempDir();
  const std::string config = dir + "/teacher.pbtxt";
  std::string job = ReadFile(std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/teacher.pbtxt");
  // 20 epochs (about 5 s here): the kill lands in training even when this
  // test reads the job's output late on a loaded machine.
  job.replace(job.find("epochs: 6"), 9, "epochs: 20 log_interval_s: 0.01");
  WriteFile(config, job);
  std::unique_ptr<Subprocess> local =
      Subprocess::Start({BinaryPath("segps-local"), "--config", config, "--report", dir + "/report.json"});
  ASSERT_TRUE(local->WaitForLine("epoch 2/20 step", absl::Seconds(120)).has_value()) << local->output();
  const std::optional<pid_t> server = FindProcess(BinaryPath("segps-server"), {"--config", config, "--index", "1"});
  ASSERT_TRUE(server.has_value());
  ASSERT_EQ(kill(*server, SIGKILL), 0);
  std::optional<int> status = local->Wait(absl::Minutes(3));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << local->output();
  EXPECT_NE(local->output().find("server1 stopped during training (killed by signal 9); restarting it (1 of 3)"),
            std::string::npos)
      << local->output();
  EXPECT_NE(local->output().find("restored relu64"), std::string::npos) << local->output();
  std::smatch m;
  const std::string report = ReadFile(dir + "/report.json");
  ASSERT_TRUE(std::regex_search(report, m, std::regex("\"ensemble\": \\{\"name\": \"ensemble\", \"accuracy\": ([0-9.]+)")))
      << report;
  EXPECT_GT(std::stod(m[1]), 0.90) << report;
}

}  // namespace
}  // namespace segps
