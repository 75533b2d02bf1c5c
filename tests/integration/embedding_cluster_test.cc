// Embedding tables as separate processes on loopback: a 100M-row table
// trains with a worker whose memory does not grow with the vocab and
// servers that store only the rows touched; a server killed and started
// again mid-run recovers its tables with the job; merged and split for 3
// servers, the tables score as trained; the example config's
// tables beat the same network without them; bad ids stop a worker before
// it reaches the servers.
#include <signal.h>
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <regex>

#include "absl/strings/str_format.h"
#include "common/config.h"
#include "tests/support/process_cluster.h"
#include "tests/support/subprocess.h"
#include "worker/client/ps_client.h"
#include "worker/data/dataset.h"
#include "worker/data/npy.h"

namespace segps {
namespace {

// Segment "ctr": a user table of `vocab` rows and an item table, then
// 32 -> 2; one worker at staleness 0, checkpoints every 10 clocks.
std::string Job(const std::string& dir, uint64_t vocab, int epochs) {
  const std::string path = dir + "/job.pbtxt";
  WriteFile(path, absl::StrFormat(R"pb(
    name: "ctr"
    seed: 3
    cluster { num_servers: 2 lease_ms: 2000 }
    model {
      input_width: 8
      num_classes: 2
      categorical_fields: 2
      segments {
        name: "ctr"
        embeddings { name: "user" vocab: %d dim: 16 field: 0 }
        embeddings { name: "item" vocab: 5000 dim: 8 field: 1 }
        layers { units: 32 activation: RELU }
        layers { units: 2 activation: SOFTMAX }
      }
    }
    optimizer { kind: ADAGRAD learning_rate: 0.1 }
    training { batch_size: 128 epochs: %d log_interval_s: 0.000001 }
    data { source: SYNTHETIC_CTR train_samples: 20000 test_samples: 4000 }
    checkpoint { every_clocks: 10 }
  )pb", vocab, epochs));
  return path;
}

// The resident set of a running process, in MiB (VmRSS).
double ResidentMiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return -1;
}

uint64_t RowsHeld(const std::string& eval_output) {
  std::smatch m;
  return std::regex_search(eval_output, m, std::regex("embedding rows held ([0-9]+)")) ? std::stoull(m[1]) : 0;
}

TEST(EmbeddingCluster, AHundredMillionRowTableTrainsWithWorkerMemoryIndependentOfTheVocab) {
  const std::string dir = MakeTempDir();
  const uint64_t vocab = 100000000;
  ProcessCluster cluster(Job(dir, vocab, 2), dir, 2, false);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("ctr", 0);
  std::optional<int> status = worker->Wait(absl::Seconds(300));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
  // The worker is the only child reaped so far: the peak is its own.
  rusage usage{};
  ASSERT_EQ(getrusage(RUSAGE_CHILDREN, &usage), 0);
  const double worker_peak_mib = static_cast<double>(usage.ru_maxrss) / 1024;
  const std::string eval = cluster.Evaluation();
  const uint64_t held = RowsHeld(eval);
  std::cout << absl::StrFormat("table of %d rows: worker peak RSS %.1f MiB; servers hold %d rows, RSS %.1f and %.1f MiB\n",
                               vocab, worker_peak_mib, held, ResidentMiB(cluster.ServerPid(0)),
                               ResidentMiB(cluster.ServerPid(1)));
  EXPECT_LT(worker_peak_mib, 500);
  // At most two rows a sample are touched (20,000 samples): stored rows follow the data, not the vocab.
  EXPECT_GT(held, 1000u) << eval;
  EXPECT_LE(held, 2u * 20000) << eval;
  EXPECT_LT(ResidentMiB(cluster.ServerPid(0)), 500);
  EXPECT_NE(eval.find("auc 0."), std::string::npos) << eval;
}

// Staleness 0, one worker: a server killed (-9) mid-run and started again
// from its checkpoints ends the job at exactly the parameters and rows of
// the run without a failure (the evaluation's loss and AUC to 6 decimals
// are those of the same rows).
TEST(EmbeddingCluster, AServerKilledMidRunRecoversItsTablesWithTheJob) {
  auto run = [](bool kill) {
    const std::string dir = MakeTempDir();
    ProcessCluster cluster(Job(dir, 1000000, 2), dir, 2);
    std::unique_ptr<Subprocess> worker = cluster.StartWorker("ctr", 0);
    if (kill) {
      EXPECT_TRUE(worker->WaitForLine(" step 150/314 ", absl::Seconds(120)).has_value()) << worker->output();
      // Held while the server goes, so that it cannot finish its last
      // steps first (a step takes about a millisecond).
      worker->Signal(SIGSTOP);
      EXPECT_TRUE(cluster.WaitForFirstCheckpoint(1)) << cluster.Output();
      cluster.KillServer(1);
      worker->Signal(SIGCONT);
      EXPECT_TRUE(cluster.StartServer(1)) << cluster.Output();
      EXPECT_TRUE(worker->WaitForLine("rejoined at clock", absl::Seconds(120)).has_value()) << worker->output();
    }
    std::optional<int> status = worker->Wait(absl::Seconds(300));
    EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
    cluster.Evaluate({"--report", dir + "/report.json"});
    return std::make_pair(cluster.Parameters("ctr"), ReadFile(dir + "/report.json"));
  };
  const auto [params, report] = run(false);
  const auto [params_after_kill, report_after_kill] = run(true);
  ASSERT_GT(params.size(), 1000u);
  EXPECT_TRUE(params_after_kill == params);
  EXPECT_NE(report.find("\"auc\""), std::string::npos) << report;
  EXPECT_EQ(report_after_kill, report);
}

// segps-checkpoint merge, then split for 3 servers: the job's final
// parameters and rows, served by 3 servers started from the split, score
// exactly as the 2 servers that trained them did.
TEST(EmbeddingCluster, MergedAndSplitForThreeServersTheTablesScoreAsTrained) {
  const std::string dir = MakeTempDir();
  const std::string job2 = Job(dir, 1000000, 1);
  std::string evaluation2;
  {
    ProcessCluster cluster(job2, dir, 2);
    std::unique_ptr<Subprocess> worker = cluster.StartWorker("ctr", 0);
    std::optional<int> status = worker->Wait(absl::Seconds(300));
    ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
    evaluation2 = cluster.Evaluation();
  }
  // Every server's files in one folder, as merge reads them.
  for (const char* ckpt : {"/ckpt0", "/ckpt1"}) {
    std::filesystem::copy(dir + ckpt, dir + "/all",
                          std::filesystem::copy_options::recursive | std::filesystem::copy_options::skip_existing);
  }
  std::unique_ptr<Subprocess> merge = Subprocess::Start({BinaryPath("segps-checkpoint"), "merge", "--dir",
                                                         dir + "/all", "--out", dir + "/merged.safetensors",
                                                         "--optimizer_slots"});
  ASSERT_TRUE(ExitedOk(merge->Wait(absl::Seconds(60)).value_or(-1))) << merge->output();
  const std::string dir3 = dir + "/three";
  std::filesystem::create_directories(dir3);
  std::string job3 = ReadFile(job2);
  job3.replace(job3.find("num_servers: 2"), 14, "num_servers: 3");
  WriteFile(dir3 + "/job.pbtxt", job3);
  std::unique_ptr<Subprocess> split = Subprocess::Start(
      {BinaryPath("segps-checkpoint"), "split", "--in", dir + "/merged.safetensors", "--config", dir3 + "/job.pbtxt",
       "--num_servers", "3", "--dir", dir3 + "/split"});
  ASSERT_TRUE(ExitedOk(split->Wait(absl::Seconds(60)).value_or(-1))) << split->output();
  for (int i = 0; i < 3; ++i) std::filesystem::copy(dir3 + "/split", absl::StrCat(dir3, "/ckpt", i),
                                                    std::filesystem::copy_options::recursive);
  ProcessCluster three(dir3 + "/job.pbtxt", dir3, 3);
  const std::string evaluation3 = three.Evaluation();
  std::smatch two_line, three_line;
  ASSERT_TRUE(std::regex_search(evaluation2, two_line, std::regex("segment ctr .*auc [0-9.]+"))) << evaluation2;
  ASSERT_TRUE(std::regex_search(evaluation3, three_line, std::regex("segment ctr .*auc [0-9.]+"))) << evaluation3;
  EXPECT_EQ(three_line.str(), two_line.str());
  EXPECT_GT(RowsHeld(evaluation3), 1000u) << evaluation3;
  EXPECT_EQ(RowsHeld(evaluation3), RowsHeld(evaluation2)) << evaluation2 << evaluation3;
}

// The example config: the segment with tables clearly beats the same
// network that sees the dense features only.
TEST(EmbeddingCluster, TheExampleConfigsTablesBeatTheDenseOnlySegment) {
  const std::string dir = MakeTempDir();
  std::unique_ptr<Subprocess> local = Subprocess::Start(
      {BinaryPath("segps-local"), "--config", std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/ctr.pbtxt", "--report",
       dir + "/report.json"});
  std::optional<int> status = local->Wait(absl::Seconds(300));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << local->output();
  std::smatch ctr, dense;
  const std::string out = local->output();
  ASSERT_TRUE(std::regex_search(out, ctr, std::regex("segment ctr +accuracy.*auc ([0-9.]+)"))) << out;
  ASSERT_TRUE(std::regex_search(out, dense, std::regex("segment dense +accuracy.*auc ([0-9.]+)"))) << out;
  EXPECT_GT(std::stod(ctr[1]), 0.64) << out;
  EXPECT_GT(std::stod(ctr[1]), std::stod(dense[1]) + 0.1) << out;
}

// Exported with its tables (every row of each, dense): segps-predict given
// the test rows' ids gives the probabilities segps-eval scored from the
// servers, and so do python/segps_model.py, the ONNX graph (Gather) and
// to_torch() (tests/python/check_export.py).
TEST(EmbeddingCluster, ExportedWithItsTablesTheModelPredictsAsTheServersScore) {
  const std::string dir = MakeTempDir();
  const std::string job = Job(dir, 20000, 1);
  ProcessCluster cluster(job, dir, 2, /*checkpoints=*/false);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("ctr", 0);
  std::optional<int> status = worker->Wait(absl::Seconds(300));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
  cluster.Evaluate({"--probabilities_out", dir + "/eval.npy", "--report", dir + "/report.json"});
  const std::string servers = cluster.addresses()[0] + "," + cluster.addresses()[1];
  auto run = [](const std::vector<std::string>& argv) {
    std::unique_ptr<Subprocess> p = Subprocess::Start(argv);
    const int code = p->Wait(absl::Seconds(120)).value_or(-1);
    EXPECT_TRUE(ExitedOk(code)) << p->output();
    return p->output();
  };
  // Too large a table is refused, naming it.
  std::unique_ptr<Subprocess> refused = Subprocess::Start({BinaryPath("segps-export"), "--config", job, "--servers",
                                                           servers, "--out", dir + "/no.safetensors",
                                                           "--max_table_mb", "1"});
  EXPECT_FALSE(ExitedOk(refused->Wait(absl::Seconds(60)).value_or(-1)));
  EXPECT_NE(refused->output().find("table ctr/user (20000 rows of 16 floats)"), std::string::npos)
      << refused->output();
  run({BinaryPath("segps-export"), "--config", job, "--servers", servers, "--out", dir + "/model.safetensors",
       "--onnx", dir + "/model.onnx"});
  run({BinaryPath("segps-data"), "--config", job, "--out", dir});
  run({BinaryPath("segps-predict"), "--model", dir + "/model.safetensors", "--input", dir + "/test_x.npy", "--ids",
       dir + "/test_ids.npy", "--out", dir + "/predicted.npy"});
  const std::vector<float> eval = ReadNpyFloat32(dir + "/eval.npy");
  const std::vector<float> predicted = ReadNpyFloat32(dir + "/predicted.npy");
  ASSERT_EQ(eval.size(), 4000u * 2);
  ASSERT_EQ(predicted.size(), eval.size());
  EXPECT_LE(LargestDifference(eval, predicted), 1e-6);
  // Without the ids, a model with tables says what it needs.
  std::unique_ptr<Subprocess> no_ids = Subprocess::Start({BinaryPath("segps-predict"), "--model",
                                                          dir + "/model.safetensors", "--input", dir + "/test_x.npy",
                                                          "--out", dir + "/none.npy"});
  EXPECT_FALSE(ExitedOk(no_ids->Wait(absl::Seconds(60)).value_or(-1)));
  EXPECT_NE(no_ids->output().find("--ids is required"), std::string::npos) << no_ids->output();
  const std::string python = run({"/usr/bin/python3", std::string(SEGPS_SOURCE_DIR) + "/tests/python/check_export.py",
                                  dir + "/model.safetensors", dir + "/model.onnx", dir + "/test_x.npy",
                                  dir + "/test_y.npy", dir + "/eval.npy", dir + "/report.json",
                                  dir + "/test_ids.npy"});
  EXPECT_NE(python.find("onnx: checker accepts"), std::string::npos) << python;
  EXPECT_NE(python.find("OK"), std::string::npos) << python;
  std::cout << python;
}

// An id outside its table's vocab in the user's .npy ids: the worker stops
// naming the file, row and field, and no row reaches the servers.
TEST(EmbeddingCluster, AnIdOutsideItsVocabStopsTheWorkerBeforeTheServers) {
  const std::string dir = MakeTempDir();
  const size_t n = 50;
  std::vector<float> x(n * 8, 0.5f);
  std::vector<int64_t> y(n, 1), ids(n * 2, 3);
  ids[17 * 2 + 1] = 5000;  // row 17, field 1: item's vocab is 5000
  ASSERT_TRUE(WriteNpy(dir + "/x.npy", "<f4", x.data(), x.size() * 4, {n, 8}).ok());
  ASSERT_TRUE(WriteNpy(dir + "/y.npy", "<i8", y.data(), y.size() * 8, {n}).ok());
  ASSERT_TRUE(WriteNpy(dir + "/ids.npy", "<i8", ids.data(), ids.size() * 8, {n, 2}).ok());
  std::string job = ReadFile(Job(dir, 1000, 1));
  job = std::regex_replace(job, std::regex("data \\{[^}]*\\}"),
                           "data { source: NPY train_x: \"x.npy\" train_y: \"y.npy\" train_ids: \"ids.npy\" }");
  WriteFile(dir + "/job.pbtxt", job);
  ProcessCluster cluster(dir + "/job.pbtxt", dir, 2, false);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("ctr", 0);
  std::optional<int> status = worker->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_FALSE(ExitedOk(*status));
  EXPECT_NE(worker->output().find(dir + "/ids.npy: row 17, field 1: id 5000 is outside [0, 5000)"), std::string::npos)
      << worker->output();
  // Ids with no table to look them up are refused too, not ignored.
  v1::JobConfig no_tables = *LoadConfig(dir + "/job.pbtxt");
  no_tables.mutable_model()->set_categorical_fields(0);
  no_tables.mutable_model()->mutable_segments(0)->clear_embeddings();
  EXPECT_NE(LoadData(no_tables).status().message().find("model.categorical_fields is 0"), std::string::npos);
  const v1::JobConfig config = *LoadConfig(dir + "/job.pbtxt");
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const v1::StatsResponse& server : *stats) {
    EXPECT_EQ(server.segments(0).embedding_rows(), 0u);
    EXPECT_EQ(server.segments(0).pushes(), 0u);
  }
}

}  // namespace
}  // namespace segps
