// Whole clusters of separate processes on localhost: segps-local on the
// shipped configs, and a hand-started cluster that loses a worker.
#include <signal.h>
#include <sys/wait.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "tests/support/reference_training.h"
#include "tests/support/subprocess.h"
#include "worker/data/dataset.h"

namespace segps {
namespace {

std::string Config(const std::string& name) {
  return std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/" + name;
}

struct LocalRun {
  int status = -1;
  std::string output;
  std::string report;
};

LocalRun RunLocal(const std::string& config, const std::string& dir, absl::Duration timeout) {
  std::unique_ptr<Subprocess> p = Subprocess::Start({BinaryPath("segps-local"), "--config", config, "--report",
                                                     dir + "/report.json", "--params_dir", dir});
  std::optional<int> status = p->Wait(timeout);
  LocalRun run;
  run.status = status.value_or(-1);
  run.output = p->output();
  run.report = ReadFile(dir + "/report.json");
  return run;
}

TEST(Cluster, SeedRecipeRunsAndEqualsTheSingleProcessReference) {
  const std::string dir = MakeTempDir();
  LocalRun run = RunLocal(Config("seed.pbtxt"), dir, absl::Minutes(3));
  ASSERT_TRUE(ExitedOk(run.status)) << run.output;
  EXPECT_NE(run.output.find("ENSEMBLE (average of softmax outputs) accuracy"), std::string::npos);
  EXPECT_NE(run.output.find("labels are drawn at random"), std::string::npos);
  const double accuracy = EnsembleAccuracy(run.report);
  // Random labels: held-out accuracy is chance, 10% give or take sampling noise.
  EXPECT_GT(accuracy, 0.05) << run.report;
  EXPECT_LT(accuracy, 0.16) << run.report;

  // One worker per segment, staleness 0: exactly the single-process steps.
  const v1::JobConfig config = *LoadConfig(Config("seed.pbtxt"));
  TrainTest data = *LoadData(config);
  std::vector<std::vector<float>> reference = TrainReference(config, data.train);
  for (int k = 0; k < 2; ++k) {
    std::vector<float> trained = ReadNpyFloat32(dir + "/" + config.model().segments(k).name() + ".npy");
    ASSERT_EQ(trained.size(), 3914u);
    EXPECT_LT(MaxRelativeError(trained, reference[k]), 1e-5) << "segment " << k;
  }
}

TEST(Cluster, TeacherConfigReachesItsAccuracyBar) {
  const std::string dir = MakeTempDir();
  LocalRun run = RunLocal(Config("teacher.pbtxt"), dir, absl::Minutes(5));
  ASSERT_TRUE(ExitedOk(run.status)) << run.output;
  EXPECT_GT(EnsembleAccuracy(run.report), 0.90) << run.report;
}

TEST(Cluster, FashionMnistConfigReachesItsAccuracyBar) {
  const std::string dir = MakeTempDir();
  LocalRun run = RunLocal(Config("fashion_mnist.pbtxt"), dir, absl::Minutes(10));
  ASSERT_TRUE(ExitedOk(run.status)) << run.output;
  EXPECT_GE(EnsembleAccuracy(run.report), 0.88) << run.report;
}

TEST(DataTool, ExportsWhatTheWorkersTrainOn) {
  const std::string dir = MakeTempDir() + "/made/by/segps-data";  // folders it creates
  std::unique_ptr<Subprocess> p =
      Subprocess::Start({BinaryPath("segps-data"), "--config", Config("seed.pbtxt"), "--out", dir});
  std::optional<int> status = p->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << p->output();
  const std::string x = ReadFile(dir + "/train_x.npy");
  EXPECT_NE(x.find("'descr': '<f4'"), std::string::npos);
  EXPECT_NE(x.find("'shape': (10000, 50)"), std::string::npos);
  std::vector<float> values = ReadNpyFloat32(dir + "/train_x.npy");
  ASSERT_EQ(values.size(), 500000u);
  uint32_t first;
  std::memcpy(&first, values.data(), 4);
  EXPECT_EQ(first, 0x3ebfc3b9u);  // numpy's x[0, 0] for seed 42 (tests/fixtures)
  EXPECT_NE(ReadFile(dir + "/test_y.npy").find("'shape': (2000,)"), std::string::npos);
}

// Runs `args` to its end and expects it to fail; returns its output.
std::string FailureOf(const std::vector<std::string>& args) {
  std::unique_ptr<Subprocess> p = Subprocess::Start(args);
  std::optional<int> status = p->Wait(absl::Seconds(60));
  EXPECT_TRUE(status.has_value()) << "still running: " << args[0];
  EXPECT_FALSE(status.has_value() && ExitedOk(*status)) << "succeeded: " << args[0];
  return p->output();
}

TEST(Cluster, LocalLauncherFailsClearlyOnABrokenConfig) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/broken.pbtxt", "cluster { num_servers: 0 }");
  const std::string output = FailureOf({BinaryPath("segps-local"), "--config", dir + "/broken.pbtxt"});
  EXPECT_NE(output.find("broken.pbtxt line 1: cluster.num_servers: must be >= 1"), std::string::npos) << output;
}

// Workers start alongside the servers; one that fails before training is
// named, with its own message, and the launcher fails.
TEST(Cluster, LocalLauncherNamesAWorkerThatFailsAtStart) {
  const std::string output = FailureOf({BinaryPath("segps-local"), "--config", Config("seed.pbtxt"), "--device",
                                        "bogus", "--report", MakeTempDir() + "/report.json"});
  EXPECT_NE(output.find("--device bogus: expected cpu, cuda:N or auto"), std::string::npos) << output;
  EXPECT_NE(output.find("segps-local: segment"), std::string::npos) << output;
  EXPECT_NE(output.find("failed (exit code 1)"), std::string::npos) << output;
}

// `--servers=-` reads the addresses from stdin; without a line it says so.
TEST(WorkerFlags, ServersFromStdinNeedALine) {
  const std::string output =
      FailureOf({BinaryPath("segps-worker"), "--config", Config("seed.pbtxt"), "--segment", "0", "--servers=-"});
  EXPECT_NE(output.find("--servers -: stdin ended before a line of server addresses"), std::string::npos) << output;
}

TEST(WorkerFlags, AMisspelledSegmentIsNamedWithTheNearestName) {
  const std::string output = FailureOf({BinaryPath("segps-worker"), "--config", Config("teacher.pbtxt"), "--segment",
                                        "relu46", "--servers", "127.0.0.1:1"});
  EXPECT_NE(output.find("--segment 'relu46' names no segment of the config (give an index or a name). Did you mean "
                        "\"relu64\"? The names: relu64, tanh128."),
            std::string::npos)
      << output;
}

TEST(WorkerFlags, CpuThreadsOutOfRangeAreNamed) {
  const std::string output = FailureOf({BinaryPath("segps-worker"), "--config", Config("seed.pbtxt"), "--segment",
                                        "0", "--servers", "127.0.0.1:1", "--cpu_threads", "0"});
  EXPECT_NE(output.find("--cpu_threads 0: expected 1..256"), std::string::npos) << output;
}

TEST(Cluster, LocalLauncherLeavesNoProcessBehindOnCtrlC) {
  const std::string dir = MakeTempDir();
  const std::string config = WriteEndlessJob(dir, 2, 0);
  std::unique_ptr<Subprocess> local = Subprocess::Start({BinaryPath("segps-local"), "--config", config});
  ASSERT_TRUE(local->WaitForLine("loss", absl::Seconds(60)).has_value()) << local->output();
  local->Signal(SIGINT);
  std::optional<int> status = local->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << "segps-local did not stop on SIGINT";
  EXPECT_FALSE(ExitedOk(*status));
  EXPECT_NE(local->output().find("interrupted"), std::string::npos) << local->output();
  // Every child was started with this config path on its command line.
  std::unique_ptr<Subprocess> pgrep = Subprocess::Start({"/usr/bin/pgrep", "-f", config});
  std::optional<int> found = pgrep->Wait(absl::Seconds(30));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(WEXITSTATUS(*found), 1) << "processes left behind: " << pgrep->output();
}

// A one-segment teacher job with 1-second leases, written to a fresh
// directory; `training` is the training block's fields. Returns its path.
std::string SmallTeacherJob(int servers, const std::string& training, int train_samples) {
  const std::string config = MakeTempDir() + "/job.pbtxt";
  WriteFile(config, absl::StrCat(R"pb(
    cluster { num_servers: )pb", servers, R"pb( lease_ms: 1000 }
    model {
      input_width: 50
      num_classes: 10
      segments { name: "s" layers { units: 32 activation: RELU } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { kind: ADAM }
    training { batch_size: 32 log_interval_s: 0.05 )pb", training, R"pb( }
    data { source: SYNTHETIC_TEACHER test_samples: 500 train_samples: )pb", train_samples, " }\n"));
  return config;
}

// A worker whose host stops answering (here: the process frozen, its socket
// left open) must not hold its server's stream handlers for ever: the
// server's keepalive pings go unanswered and the streams end.
TEST(Cluster, FrozenWorkerReleasesItsServerStreams) {
  const std::string config = SmallTeacherJob(1, "epochs: 1000 staleness: 1", 2000);
  ServerProcesses servers = StartServers(config, 1);
  ASSERT_TRUE(servers.ok()) << servers.Output();
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(servers.addresses[0], grpc::InsecureChannelCredentials()));
  auto open_streams = [&]() -> int64_t {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatsResponse stats;
    return stub->Stats(&context, v1::StatsRequest(), &stats).ok() ? stats.open_streams() : -1;
  };
  std::unique_ptr<Subprocess> worker = Subprocess::Start({BinaryPath("segps-worker"), "--config", config, "--segment",
                                                          "s", "--rank", "0", "--servers", servers.Joined()});
  ASSERT_TRUE(worker->WaitForLine("epoch 1/1000 step", absl::Seconds(60)).has_value()) << worker->output();
  // Its pushes and its pulls. Polled: a slow first step (a sanitized build
  // on a loaded machine) may log before its second stream opens.
  int64_t open = open_streams();
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30); open != 2 && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(50));
    open = open_streams();
  }
  ASSERT_EQ(open, 2) << worker->output();
  worker->Signal(SIGSTOP);
  // Polled: nothing in the server announces the end of a stream.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  open = open_streams();
  while (open != 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
    open = open_streams();
  }
  EXPECT_EQ(open, 0) << "a frozen worker still holds server streams after 20 s";
}

TEST(Cluster, KilledWorkerDoesNotHangItsPeers) {
  const std::string config = SmallTeacherJob(2, "epochs: 4 staleness: 0 workers_per_segment: 2", 8000);
  ServerProcesses servers = StartServers(config, 2);
  ASSERT_TRUE(servers.ok()) << servers.Output();
  const std::string addresses = servers.Joined();
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(Subprocess::Start({BinaryPath("segps-worker"), "--config", config, "--segment", "s",
                                         "--rank", std::to_string(r), "--servers", addresses}));
  }
  // Once the victim is training (synchronously with its peer), kill it.
  ASSERT_TRUE(workers[1]->WaitForLine("epoch 1/4 step", absl::Seconds(60)).has_value()) << workers[1]->output();
  workers[1]->Signal(SIGKILL);
  std::optional<int> victim = workers[1]->Wait(absl::Seconds(30));
  ASSERT_TRUE(victim.has_value());
  EXPECT_TRUE(WIFSIGNALED(*victim));
  std::optional<int> survivor = workers[0]->Wait(absl::Seconds(120));
  ASSERT_TRUE(survivor.has_value()) << "the surviving worker hung:\n" << workers[0]->output();
  EXPECT_TRUE(ExitedOk(*survivor)) << workers[0]->output();
  // The survivor trains to the end of the schedule (clock 500), from wherever it joined.
  EXPECT_NE(workers[0]->output().find("step 500/500"), std::string::npos) << workers[0]->output();
}

}  // namespace
}  // namespace segps

namespace segps {
namespace {

// Every report keeps per-epoch history, and segps-local --plot turns it into
// learning curves: a PNG of the expected size, one line per segment
// (tests/python/check_plots.py, with Debian's /usr/bin/python3 and matplotlib).
TEST(Cluster, ReportKeepsHistoryAndPlotDrawsItsLearningCurves) {
  const std::string dir = MakeTempDir();
  std::string job = ReadFile(Config("teacher.pbtxt"));
  job.replace(job.find("epochs: 6"), 9, "epochs: 3 test_every_epoch: true");
  WriteFile(dir + "/job.pbtxt", job);
  std::unique_ptr<Subprocess> p = Subprocess::Start({BinaryPath("segps-local"), "--config", dir + "/job.pbtxt",
                                                     "--report", dir + "/report.json", "--plot", dir + "/plots"});
  std::optional<int> status = p->Wait(absl::Minutes(3));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << p->output();
  const std::string report = ReadFile(dir + "/report.json");
  for (const char* field : {"\"history\"", "\"samples_per_second\"", "\"mean_staleness\"", "\"blocked_seconds\"",
                            "\"test_accuracy\"", "\"ensemble\":[{\"epoch\":1"}) {
    EXPECT_NE(report.find(field), std::string::npos) << field << " missing from " << report;
  }
  std::unique_ptr<Subprocess> check = Subprocess::Start(
      {"/usr/bin/python3", std::string(SEGPS_SOURCE_DIR) + "/tests/python/check_plots.py", dir + "/report.json",
       dir + "/plots"});
  std::optional<int> checked = check->Wait(absl::Minutes(2));
  EXPECT_TRUE(checked.has_value() && ExitedOk(*checked)) << check->output();
  EXPECT_NE(check->output().find("OK"), std::string::npos) << check->output();
}

// A plot that cannot be drawn (here: its folder cannot be made) is a
// warning; the job's trained and scored model stands, and it exits 0.
TEST(Cluster, APlotThatCannotBeDrawnIsAWarningNotAFailedJob) {
  const std::string dir = MakeTempDir();
  std::unique_ptr<Subprocess> p = Subprocess::Start({BinaryPath("segps-local"), "--config", Config("seed.pbtxt"),
                                                     "--report", dir + "/report.json", "--plot", "/proc/no/plots"});
  std::optional<int> status = p->Wait(absl::Minutes(3));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << p->output();
  EXPECT_NE(p->output().find("segps-local: warning: --plot: cannot create /proc/no/plots"), std::string::npos)
      << p->output();
  EXPECT_NE(ReadFile(dir + "/report.json").find("\"ensemble\""), std::string::npos);
}

// The teacher job, one worker a segment at staleness 0 (so that its model
// is a pure function of the config), written to `path` with `optimizer` and
// the first segment's hidden `units`.
void WriteResumableTeacher(const std::string& path, const std::string& optimizer, int units) {
  std::string job = ReadFile(Config("teacher.pbtxt"));
  job.replace(job.find("optimizer { kind: ADAM learning_rate: 0.003 }"), 45, optimizer);
  job.replace(job.find("epochs: 6 staleness: 2 workers_per_segment: 2"), 45,
              "epochs: 8 staleness: 0 workers_per_segment: 1 log_interval_s: 0.01 test_every_epoch: true");
  job.replace(job.find("units: 64"), 9, absl::StrCat("units: ", units));
  WriteFile(path, job);
}

// The epochs of a report's ensemble history (segps-report.json in `dir`).
std::vector<int> EnsembleEpochs(const std::string& dir) {
  const std::string report = ReadFile(dir + "/segps-report.json");
  const std::regex entry(R"re(\{\s*"epoch":\s*([0-9]+),\s*"test_accuracy")re");
  std::vector<int> epochs;
  for (auto it = std::sregex_iterator(report.begin(), report.end(), entry); it != std::sregex_iterator(); ++it) {
    epochs.push_back(std::stoi((*it)[1]));
  }
  return epochs;
}

// segps-local keeps a job's checkpoints in segps-runs/<job name> of its
// working directory: stopped with Ctrl-C and started again with the same
// command, the job resumes, and its model equals the uninterrupted job's
// bit for bit (--fresh starts over, and runs uninterrupted); a changed
// learning rate resumes with the new rate, a changed layer is refused
// naming the field. The resumed run's ensemble history has the epochs it
// scored, under their own numbers.
TEST(Cluster, CtrlCThenTheSameCommandResumesAndEqualsTheUninterruptedRun) {
  const std::string dir = MakeTempDir(), here = MakeTempDir();
  const std::string config = dir + "/teacher.pbtxt";
  // relu64 as wide as tanh128: the two segments, independent at staleness
  // 0, then move at about one pace, also on a loaded or sanitized build.
  WriteResumableTeacher(config, "optimizer { kind: ADAM learning_rate: 0.003 }", 128);
  auto run = [&](const std::string& cwd, const std::string& params, std::vector<std::string> more = {}) {
    std::vector<std::string> argv = {BinaryPath("segps-local"), "--config", config, "--params_dir", params};
    argv.insert(argv.end(), more.begin(), more.end());
    return Subprocess::Start(argv, cwd);
  };
  auto model = [&dir] { return ReadFile(dir + "/relu64.npy") + ReadFile(dir + "/tanh128.npy"); };
  std::unique_ptr<Subprocess> stopped = run(here, dir);
  ASSERT_TRUE(stopped->WaitForLine("checkpoints in segps-runs/teacher (the same command resumes the job)",
                                   absl::Minutes(1)).has_value()) << stopped->output();
  // Both segments into their third epoch: each has a checkpoint past its
  // first (one every 100 of an epoch's 469 clocks), and neither is done.
  int relu = 0, tanh = 0;
  const std::regex progress("(relu64|tanh128)/0: epoch ([0-9]+)/8");
  while (std::min(relu, tanh) < 3) {
    const std::optional<std::string> line = stopped->WaitForLine(": epoch ", absl::Minutes(2));
    ASSERT_TRUE(line.has_value()) << stopped->output();
    std::smatch m;
    if (!std::regex_search(*line, m, progress)) continue;
    (m[1] == "relu64" ? relu : tanh) = std::max(m[1] == "relu64" ? relu : tanh, std::stoi(m[2]));
  }
  stopped->Signal(SIGINT);
  ASSERT_FALSE(ExitedOk(stopped->Wait(absl::Minutes(1)).value_or(0))) << stopped->output();
  ASSERT_EQ(stopped->output().find("ENSEMBLE"), std::string::npos) << "it finished before the interrupt";

  std::unique_ptr<Subprocess> resumed = run(here, dir);
  ASSERT_TRUE(ExitedOk(resumed->Wait(absl::Minutes(3)).value_or(-1))) << resumed->output();
  EXPECT_NE(resumed->output().find("resuming the job from its checkpoints in segps-runs/teacher"), std::string::npos)
      << resumed->output();
  EXPECT_NE(resumed->output().find("restored relu64 at clock"), std::string::npos) << resumed->output();
  EXPECT_EQ(resumed->output().find(": epoch 1/8"), std::string::npos) << "it started over:\n" << resumed->output();
  const std::string resumed_params = model();
  ASSERT_GT(resumed_params.size(), 10000u);
  const std::vector<int> resumed_epochs = EnsembleEpochs(here);
  ASSERT_FALSE(resumed_epochs.empty()) << ReadFile(here + "/segps-report.json");
  EXPECT_GT(resumed_epochs.front(), 1);
  for (size_t i = 0; i < resumed_epochs.size(); ++i) {
    EXPECT_EQ(resumed_epochs[i], resumed_epochs.front() + static_cast<int>(i)) << "a gap in the ensemble's epochs";
  }
  EXPECT_EQ(resumed_epochs.back(), 8);

  // --fresh starts over and runs uninterrupted: the reference.
  std::unique_ptr<Subprocess> fresh = run(here, dir, {"--fresh"});
  ASSERT_TRUE(ExitedOk(fresh->Wait(absl::Minutes(3)).value_or(-1))) << fresh->output();
  EXPECT_EQ(fresh->output().find("restored"), std::string::npos) << fresh->output();
  EXPECT_NE(fresh->output().find("relu64/0: epoch 1/8"), std::string::npos) << fresh->output();
  EXPECT_TRUE(model() == resumed_params) << "the resumed job's model differs from the uninterrupted job's";
  EXPECT_EQ(EnsembleEpochs(here), std::vector<int>({1, 2, 3, 4, 5, 6, 7, 8}));

  WriteResumableTeacher(config, "optimizer { kind: ADAM learning_rate: 0.001 }", 128);
  std::unique_ptr<Subprocess> new_rate = run(here, dir);
  ASSERT_TRUE(ExitedOk(new_rate->Wait(absl::Minutes(3)).value_or(-1))) << new_rate->output();
  EXPECT_NE(new_rate->output().find(
                "it goes on with optimizer.learning_rate: 0.001 here, 0.003 in the checkpoint"),
            std::string::npos)
      << new_rate->output();

  WriteResumableTeacher(config, "optimizer { kind: ADAM learning_rate: 0.001 }", 32);
  std::unique_ptr<Subprocess> new_layer = run(here, dir);
  EXPECT_FALSE(ExitedOk(new_layer->Wait(absl::Minutes(3)).value_or(0))) << new_layer->output();
  EXPECT_NE(new_layer->output().find("model.segments[0].layers[0].units: 32 here, 128 in the checkpoint"),
            std::string::npos)
      << new_layer->output();
}

// Dropout on hidden layers, in an ensemble and in a chain: both train to
// the teacher's bar (prediction uses every unit). At staleness 0 with one
// worker a segment the masks are a function of the job, so two runs give
// the same model, and one without dropout another.
TEST(Cluster, HiddenLayersWithDropoutTrainToTheBarInAnEnsembleAndAChain) {
  // The job `name` with `layer` given `dropout` (and, `synchronous`, one
  // worker a segment at staleness 0); its run's first segment's model.
  auto run = [](const char* name, const std::string& layer, const char* dropout, bool synchronous) {
    const std::string dir = MakeTempDir();
    std::string job = ReadFile(Config(name));
    EXPECT_NE(job.find(layer), std::string::npos) << job;
    std::string dropped = layer;
    dropped.replace(dropped.size() - 2, 2, absl::StrCat(" dropout: ", dropout, " }"));
    job.replace(job.find(layer), layer.size(), dropped);
    const std::string asynchronous = "staleness: 2 workers_per_segment: 2";
    if (synchronous) job.replace(job.find(asynchronous), asynchronous.size(), "staleness: 0 workers_per_segment: 1");
    WriteFile(dir + "/job.pbtxt", job);
    LocalRun local = RunLocal(dir + "/job.pbtxt", dir, absl::Minutes(3));
    EXPECT_TRUE(ExitedOk(local.status)) << local.output;
    EXPECT_GT(EnsembleAccuracy(local.report), 0.90) << local.output;
    return ReadFile(dir + "/relu64.npy");
  };
  const std::string layer = "layers { units: 64 activation: RELU }";
  const std::string dropped = run("teacher.pbtxt", layer, "0.2", true);
  ASSERT_GT(dropped.size(), 1000u);
  EXPECT_TRUE(run("teacher.pbtxt", layer, "0.2", true) == dropped) << "the masks differ between runs";
  EXPECT_FALSE(run("teacher.pbtxt", layer, "0", true) == dropped) << "dropout changed nothing";
  run("teacher_chain.pbtxt", "layers { units: 96 activation: RELU }", "0.2", false);
}

// data.validation_fraction: every epoch's validation loss and accuracy, of
// each segment in an ensemble and of the whole network in a chain, in the
// log, the report's history and the plot.
TEST(Cluster, AValidationSetIsScoredAfterEveryEpochInTheLogTheReportAndThePlot) {
  for (const auto& [name, scored] : {std::pair{"teacher.pbtxt", "relu64/0: epoch 3 validation loss "},
                                     std::pair{"teacher_chain.pbtxt", "stage2/0: epoch 3 validation loss "}}) {
    SCOPED_TRACE(name);
    const std::string dir = MakeTempDir();
    std::string job = ReadFile(Config(name));
    job.replace(job.find("epochs: 6"), 9, "epochs: 3");
    job.replace(job.find("data {"), 6, "data { validation_fraction: 0.1");
    WriteFile(dir + "/job.pbtxt", job);
    std::unique_ptr<Subprocess> p = Subprocess::Start({BinaryPath("segps-local"), "--config", dir + "/job.pbtxt",
                                                       "--report", dir + "/report.json", "--plot", dir + "/plots"});
    ASSERT_TRUE(ExitedOk(p->Wait(absl::Minutes(3)).value_or(-1))) << p->output();
    const size_t at = p->output().find(scored);
    ASSERT_NE(at, std::string::npos) << p->output();
    std::smatch m;
    const std::string line = p->output().substr(at, p->output().find('\n', at) - at);
    ASSERT_TRUE(std::regex_search(line, m, std::regex("validation loss ([0-9.]+) acc ([0-9.]+)"))) << line;
    EXPECT_LT(std::stod(m[1]), 0.6) << line;
    EXPECT_GT(std::stod(m[2]), 0.85) << line;
    const std::string report = ReadFile(dir + "/report.json");
    size_t records = 0;
    for (size_t i = report.find("\"validation_loss\""); i != std::string::npos;
         i = report.find("\"validation_loss\"", i + 1)) {
      ++records;
    }
    EXPECT_GE(records, 3u) << report;
    EXPECT_NE(p->output().find("wrote " + dir + "/plots/learning_curves.png"), std::string::npos) << p->output();
  }
}

}  // namespace
}  // namespace segps
