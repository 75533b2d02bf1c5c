// A worker against servers in the same process, over real gRPC on loopback
// (port 0): the whole training path without process management.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/grpc_service.h"
#include "server/parameter_server.h"
#include "tests/support/faulty_client.h"
#include "worker/client/heartbeat_loop.h"
#include "tests/support/inprocess_cluster.h"
#include "tests/support/reference_training.h"
#include "tests/support/subprocess.h"
#include "worker/model/backend.h"
#include "worker/data/dataset.h"
#include "worker/client/ps_client.h"
#include "worker/train/pipeline_link.h"
#include "worker/train/pipeline_trainer.h"
#include "worker/train/trainer.h"
#include "worker/train/worker_metrics.h"

namespace segps {
namespace {

v1::JobConfig SeedConfig(uint32_t epochs) {
  v1::JobConfig config = *LoadConfig(std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/seed.pbtxt");
  config.mutable_training()->set_epochs(epochs);
  // Leases are not under test here; a long one keeps slow sanitizer builds from dropping workers.
  config.mutable_cluster()->set_lease_ms(60000);
  return config;
}

class SynchronousTraining : public ::testing::TestWithParam<uint64_t> {};

// Whole ranges in one message, and ranges cut into chunks (a few KB here).
TEST_P(SynchronousTraining, EqualsSingleProcessReference) {
  v1::JobConfig config = SeedConfig(2);
  if (GetParam() != 0) config.mutable_cluster()->set_chunk_bytes(GetParam());
  InProcessCluster cluster(config);
  TrainTest data = *LoadData(config);
  std::vector<std::thread> workers;
  std::vector<absl::StatusOr<TrainReport>> reports(2);
  for (int k = 0; k < 2; ++k) {
    workers.emplace_back([&, k] {
      std::unique_ptr<Backend> backend = CreateCpuBackend(1);
      std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
      TrainerOptions options;
      options.segment = k;
      reports[k] = Train(config, options, data.train, backend.get(), client.get());
    });
  }
  for (auto& t : workers) t.join();
  std::vector<std::vector<float>> reference = TrainReference(config, data.train);
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(reports[k].ok()) << reports[k].status();
    EXPECT_EQ(reports[k]->steps, 80u);  // 2 epochs x ceil(5000 / 128)
    EXPECT_EQ(reports[k]->first_clock, 0u);
    EXPECT_EQ(reports[k]->last_clock, 80u);
    EXPECT_TRUE(reports[k]->confirmed) << "the servers' count of its steps";
    EXPECT_EQ(reports[k]->max_staleness, 0u);
    EXPECT_LT(MaxRelativeError(cluster.Parameters(k), reference[k]), 1e-5) << "segment " << k;
    // One pull per step and chunk: the first step's, then one with each
    // step's push; none more (a reply must say its values are fresh enough).
    const ShardMap map = *ShardMap::Create(config.model(), 2);
    for (uint32_t i = 0; i < 2; ++i) {
      const uint64_t chunk = config.cluster().chunk_bytes() / sizeof(float);
      const uint64_t chunks = (map.range(k, i).count + chunk - 1) / chunk;
      EXPECT_EQ(cluster.Pulls(i, k), chunks * reports[k]->steps) << "segment " << k << " server " << i;
    }
  }
}

// Lost replies, duplicated pushes, calls that never left, dropped
// registrations and a failing re-registration, injected at chosen calls:
// the worker recovers from each by registering again, continues where the
// servers say, and ends with exactly the parameters of a run without faults.
TEST(FaultInjection, RecoveredRunEqualsTheRunWithoutFaultsBitForBit) {
  v1::JobConfig config = SeedConfig(2);
  TrainTest data = *LoadData(config);
  auto run = [&](std::vector<FaultRule> rules, int* injected) {
    InProcessCluster cluster(config);
    std::unique_ptr<Backend> backend = CreateCpuBackend(1);
    FaultyClient client(*ConnectGrpc(config, cluster.addresses()), std::move(rules));
    prometheus::Registry registry;
    WorkerMetrics metrics(registry, "s");
    TrainerOptions options;
    options.metrics = &metrics;
    absl::StatusOr<TrainReport> report = Train(config, options, data.train, backend.get(), &client);
    EXPECT_TRUE(report.ok()) << report.status();
    // The recoveries are counted where Prometheus scrapes them too.
    const std::string scraped = prometheus::TextSerializer().Serialize(registry.Collect());
    EXPECT_NE(scraped.find(absl::StrCat("segps_worker_recoveries_total{segment=\"s\"} ",
                                        report.ok() ? report->recoveries : 0)),
              std::string::npos)
        << scraped;
    if (injected != nullptr) *injected = client.injected();
    return std::make_pair(cluster.Parameters(0), report.ok() ? report->recoveries : 0);
  };
  const auto [clean, none] = run({}, nullptr);
  EXPECT_EQ(none, 0u);
  int injected = 0;
  const auto [faulty, recoveries] = run(
      {
          {"Pull", 1, Fault::kFailBefore},          // the first step's pull never left
          {"SendAndPull", 10, Fault::kLoseReply},   // step 10 applied, its reply lost
          {"SendAndPull", 20, Fault::kDuplicate},   // step 20 sent twice: applied once
          {"SendAndPull", 30, Fault::kFailBefore},  // step 30 never sent: computed again
          {"SendAndPull", 40, Fault::kNotFound},    // the servers dropped the registration
          {"Register", 3, Fault::kFailBefore},      // the second re-registration fails once: retried
          {"SendAndPull", 50, Fault::kDelay, absl::Milliseconds(50)},
      },
      &injected);
  EXPECT_EQ(injected, 7);
  EXPECT_EQ(recoveries, 4u);  // the pull, the lost reply, the unsent push, the dropped registration
  EXPECT_TRUE(faulty == clean) << "the recovered run's parameters differ from the clean run's";
}

// As a worker leaves, each server says how many of its rank's steps it
// applied: a count other than the schedule's fails the worker, naming the
// server; a Leave whose reply is lost leaves the count unconfirmed.
TEST(FaultInjection, AWorkerChecksTheServersCountOfItsSteps) {
  v1::JobConfig config = SeedConfig(2);
  TrainTest data = *LoadData(config);
  auto run = [&](Fault fault) {
    InProcessCluster cluster(config);
    std::unique_ptr<Backend> backend = CreateCpuBackend(1);
    FaultyClient client(*ConnectGrpc(config, cluster.addresses()), {{"Leave", 1, fault}});
    return Train(config, TrainerOptions(), data.train, backend.get(), &client);
  };
  const absl::StatusOr<TrainReport> miscounted = run(Fault::kMiscount);
  EXPECT_EQ(miscounted.status().code(), absl::StatusCode::kDataLoss) << miscounted.status();
  EXPECT_THAT(miscounted.status().message(),
              testing::HasSubstr("server 0 applied 79 steps of this rank, but its schedule ended at clock 80"));
  const absl::StatusOr<TrainReport> lost = run(Fault::kLoseReply);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_FALSE(lost->confirmed);
  EXPECT_THAT(StepsComputed(*lost), testing::HasSubstr("80 steps computed here (clocks 0 to 80; the servers' count unconfirmed)"));
}

// A heartbeat that finds the worker's registration dropped (here injected
// as NOT_FOUND) fails the worker's calls in flight with that status, so
// that it rejoins at once: a pull parked on the servers (no rank has
// pushed the clock before it) ends with the heartbeat's status, which
// nothing else could give it (its wait would end after
// cluster.pull_wait_ms with UNAVAILABLE).
TEST(FaultInjection, AHeartbeatThatFindsTheRegistrationDroppedFailsTheCallsInFlight) {
  v1::JobConfig config = SeedConfig(1);
  config.mutable_model()->mutable_segments(0)->set_workers(2);
  config.mutable_cluster()->set_pull_wait_ms(3000);
  InProcessCluster cluster(config);
  FaultyClient client(*ConnectGrpc(config, cluster.addresses()), {{"Heartbeat", 1, Fault::kNotFound}});
  std::unique_ptr<ParameterClient> peer = *ConnectGrpc(config, cluster.addresses());
  ASSERT_TRUE(client.Register(0, 0).ok());
  ASSERT_TRUE(peer->Register(0, 1).ok());
  std::vector<float> values(cluster.Parameters(0).size());
  Completion<PulledAt> parked = client.StartPull(0, 1, absl::MakeSpan(values));  // waits for both ranks' clock 0
  {
    HeartbeatLoop heartbeat(&client, absl::Milliseconds(10));
    const PulledAt pulled = parked.Wait();
    EXPECT_EQ(pulled.status().code(), absl::StatusCode::kNotFound) << pulled.status();
    EXPECT_THAT(pulled.status().message(), testing::HasSubstr("injected fault in Heartbeat: registration dropped"));
  }
  EXPECT_EQ(client.injected(), 1);
}

// A chain of two stages in this process, the last one's calls faulty: a
// push applied whose reply was lost, one never sent, a registration the
// servers dropped. The last stage rejoins each time and continues where it
// is (its neighbour cannot go back): a step every server took counts as
// done, one that not every server took is sent again as it was. The chain
// ends with every step and exactly the parameters of a run without faults.
TEST(FaultInjection, APipelineStageRecoversWithoutComputingAStepAgain) {
  const v1::JobConfig config = *LoadConfig(WriteChainJob(MakeTempDir(), "chain", ChainJob(2, 2)));
  const TrainTest data = *LoadData(config);
  auto run = [&](std::vector<FaultRule> rules, TrainReport* last) {
    InProcessCluster cluster(config);
    std::unique_ptr<Upstream> upstream = *Upstream::Listen(config, 1, 0, "127.0.0.1:0");
    absl::StatusOr<TrainReport> last_report;
    std::thread stage1([&] {
      std::unique_ptr<Backend> backend = CreateCpuBackend(1);
      FaultyClient client(*ConnectGrpc(config, cluster.addresses()), rules);
      StageOptions options;
      options.stage = 1;
      options.upstream = upstream.get();
      last_report = TrainStage(config, options, nullptr, backend.get(), &client);
    });
    std::unique_ptr<Downstream> downstream = *Downstream::Connect(config, 0, 0, upstream->address());
    std::unique_ptr<Backend> backend = CreateCpuBackend(1);
    std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
    StageOptions options;
    options.downstream = downstream.get();
    absl::StatusOr<TrainReport> first = TrainStage(config, options, &data.train, backend.get(), client.get());
    stage1.join();
    EXPECT_TRUE(first.ok()) << first.status();
    EXPECT_TRUE(last_report.ok()) << last_report.status();
    if (last_report.ok()) *last = *last_report;
    return std::make_pair(cluster.Parameters(0), cluster.Parameters(1));
  };
  TrainReport clean_report, faulty_report;
  const auto clean = run({}, &clean_report);
  const auto faulty = run(
      {
          {"SendAndPull", 10, Fault::kLoseReply},   // taken by every server: done
          {"SendAndPull", 20, Fault::kFailBefore},  // taken by none: sent again
          {"SendAndPull", 30, Fault::kNotFound},    // registration dropped, nothing sent: sent again
      },
      &faulty_report);
  EXPECT_EQ(faulty_report.recoveries, 3u);
  EXPECT_EQ(faulty_report.steps, clean_report.steps) << "a step was lost or counted twice";
  EXPECT_TRUE(faulty.first == clean.first) << "stage 0's parameters differ from the clean run's";
  EXPECT_TRUE(faulty.second == clean.second) << "stage 1's parameters differ from the clean run's";
}

// A learning-rate schedule (a warm-up, then a cosine decay) on the servers:
// each update takes its scheduled rate, as in one process.
TEST(SynchronousTrainingWithASchedule, EqualsSingleProcessReference) {
  v1::JobConfig config = SeedConfig(2);
  v1::LearningRateSchedule* schedule = config.mutable_optimizer()->mutable_schedule();
  schedule->set_decay(v1::LearningRateSchedule::COSINE);
  schedule->set_warmup_updates(10);
  schedule->set_decay_updates(60);
  schedule->set_min_factor(0.1f);
  InProcessCluster cluster(config);
  TrainTest data = *LoadData(config);
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  absl::StatusOr<TrainReport> report = Train(config, TrainerOptions(), data.train, backend.get(), client.get());
  ASSERT_TRUE(report.ok()) << report.status();
  const std::vector<float> reference = TrainReference(config, data.train)[0];
  EXPECT_LT(MaxRelativeError(cluster.Parameters(0), reference), 1e-5);
  v1::JobConfig constant = SeedConfig(2);
  EXPECT_GT(MaxRelativeError(TrainReference(constant, data.train)[0], reference), 1e-3) << "the schedule changed nothing";
}

INSTANTIATE_TEST_SUITE_P(ChunkBytes, SynchronousTraining, ::testing::Values(0, 4096),
                         [](const auto& info) { return info.param == 0 ? std::string("Whole") : std::string("Chunked4096"); });

// Gradients and pulled values rounded to 16 bits on the wire, float32 on the
// servers: the trained parameters stay close to the float32 reference.
class HalfWire : public ::testing::TestWithParam<v1::DType> {};

TEST_P(HalfWire, StaysCloseToFloat32) {
  v1::JobConfig config = SeedConfig(2);
  config.mutable_cluster()->set_wire_dtype(GetParam());
  config.mutable_cluster()->set_chunk_bytes(4096);  // chunks, too
  InProcessCluster cluster(config);
  TrainTest data = *LoadData(config);
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  TrainerOptions options;
  absl::StatusOr<TrainReport> report = Train(config, options, data.train, backend.get(), client.get());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->steps, 80u);
  const std::vector<float> trained = cluster.Parameters(0);
  const std::vector<float> reference = TrainReference(config, data.train)[0];
  ASSERT_EQ(trained.size(), reference.size());
  double mean = 0, worst = 0;
  for (size_t i = 0; i < trained.size(); ++i) {
    const double d = std::abs(trained[i] - reference[i]);
    mean += d / trained.size();
    worst = std::max(worst, d);
  }
  std::cout << v1::DType_Name(GetParam()) << " wire vs float32 reference: mean |difference| " << mean << ", max "
            << worst << "\n";
  EXPECT_GT(worst, 0.0) << "rounding left no trace: is the wire really 16 bits?";
  EXPECT_LT(mean, 2e-3);
  EXPECT_LT(worst, 2e-2);

  // An observer (the evaluator, a parameter dump) reads the float32 values unrounded.
  std::unique_ptr<ParameterClient> reader = *ConnectGrpc(config, cluster.addresses());
  std::vector<float> read(trained.size());
  ASSERT_TRUE(reader->Pull(0, 0, absl::MakeSpan(read)).ok());
  EXPECT_EQ(read, trained);
}

// Parameters beyond binary16's range reach a float16 worker as infinity: its
// pull fails naming the range instead of handing them to training.
TEST(WorkerInProcess, Float16PullOfParametersBeyondItsRangeFails) {
  v1::JobConfig config = SeedConfig(1);
  config.mutable_optimizer()->set_kind(v1::SGD);
  config.mutable_optimizer()->set_learning_rate(1.0f);
  InProcessCluster cluster(config);
  std::unique_ptr<ParameterClient> wide = *ConnectGrpc(config, cluster.addresses());
  ASSERT_TRUE(wide->Register(0, 0).ok());
  const size_t n = cluster.Parameters(0).size();
  ASSERT_TRUE(wide->Send(wide->Encode(0, 0, std::vector<float>(n, -1e5f))).ok());  // every parameter += 1e5

  v1::JobConfig narrow_config = config;
  narrow_config.mutable_cluster()->set_wire_dtype(v1::FLOAT16);
  // The first worker leaves, so that its rank is free at once (a live rank's
  // registration is refused until its lease lapses).
  ASSERT_TRUE(wide->Leave(std::nullopt).ok());
  std::unique_ptr<ParameterClient> narrow = *ConnectGrpc(narrow_config, cluster.addresses());
  absl::StatusOr<Registration> registered = narrow->Register(0, 0);
  ASSERT_TRUE(registered.ok()) << registered.status();
  std::vector<float> pulled(n);
  absl::Status status = narrow->Pull(0, registered->start_clock, absl::MakeSpan(pulled)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_NE(std::string(status.message()).find("holds magnitudes up to 65504"), std::string::npos) << status;
}

// A push encoded for other servers (another shard map) is refused by the
// client that is asked to send it, naming why, before anything is sent: it
// reads no byte past the push's parts and applies nothing.
TEST(WorkerInProcess, APushEncodedForOtherServersIsRefusedBeforeItIsSent) {
  v1::JobConfig config = SeedConfig(1);
  config.mutable_cluster()->set_num_servers(1);
  InProcessCluster cluster(config);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  ASSERT_TRUE(client->Register(0, 0).ok());
  const std::vector<float> before = cluster.Parameters(0);
  const size_t n = before.size();
  absl::StatusOr<ShardMap> two = ShardMap::Create(config.model(), 2);
  ASSERT_TRUE(two.ok()) << two.status();
  absl::Status status = client->Send(EncodeDense(*two, v1::FLOAT32, 0, 0, std::vector<float>(n, 0.5f)));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("not encoded for these servers"), std::string::npos) << status;
  // One server's part cut short: the sizes are checked, not only the count.
  std::unique_ptr<EncodedPush> shortened =
      EncodeDense(*ShardMap::Create(config.model(), 1), v1::FLOAT32, 0, 0, std::vector<float>(n, 0.5f));
  shortened->values[0].remove_suffix(4);
  status = client->Send(std::move(shortened));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("server 0's part has"), std::string::npos) << status;
  EXPECT_EQ(cluster.Parameters(0), before);
  EXPECT_TRUE(client->Send(client->Encode(0, 0, std::vector<float>(n, 0.5f))).ok());
}

// A push the server rejects ends that server's push stream: the error names
// the element, nothing is applied, and the next push opens a new stream.
TEST(WorkerInProcess, RejectedPushIsNamedAndTheNextPushGoesThrough) {
  v1::JobConfig config = SeedConfig(1);
  config.mutable_cluster()->set_num_servers(1);
  config.mutable_optimizer()->set_kind(v1::SGD);
  config.mutable_optimizer()->set_learning_rate(1.0f);
  InProcessCluster cluster(config);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  ASSERT_TRUE(client->Register(0, 0).ok());
  const std::vector<float> before = cluster.Parameters(0);
  const size_t n = before.size();

  std::vector<float> bad(n, 1.0f);
  bad[7] = NAN;
  absl::Status rejected = client->Send(client->Encode(0, 0, bad));
  EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument) << rejected;
  EXPECT_NE(std::string(rejected.message()).find("element 7 of segment 0 is nan"), std::string::npos) << rejected;
  EXPECT_EQ(cluster.Parameters(0), before);

  std::vector<float> pulled(n);
  absl::StatusOr<uint64_t> clock = client->SendAndPull(client->Encode(0, 0, std::vector<float>(n, 0.5f)),
                                                       absl::MakeSpan(pulled));
  ASSERT_TRUE(clock.ok()) << clock.status();
  EXPECT_EQ(*clock, 1u);
  EXPECT_EQ(pulled, cluster.Parameters(0));
  EXPECT_FLOAT_EQ(pulled[7], before[7] - 0.5f);
}

// A server that stops serving ends the push stream from its side: the
// worker sees a transient failure (retried, then reported naming the
// server), not a cancellation it never asked for.
TEST(WorkerInProcess, PushesToAServerThatStoppedFailAsUnavailable) {
  v1::JobConfig config = SeedConfig(1);
  config.mutable_cluster()->set_num_servers(1);
  config.mutable_cluster()->set_rpc_deadline_ms(200);
  InProcessCluster cluster(config);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  ASSERT_TRUE(client->Register(0, 0).ok());
  const size_t n = cluster.Parameters(0).size();
  ASSERT_TRUE(client->Send(client->Encode(0, 0, std::vector<float>(n, 0.5f))).ok());  // the stream is open
  cluster.StopServing(0);
  absl::Status status = client->Send(client->Encode(0, 1, std::vector<float>(n, 0.5f)));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(std::string(status.message()).find("Push to server 0"), std::string::npos) << status;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfWire, ::testing::Values(v1::BFLOAT16, v1::FLOAT16),
                         [](const auto& info) { return v1::DType_Name(info.param); });

// The teacher task, small and synchronous (deterministic), as one segment.
v1::JobConfig SmallTeacher() {
  v1::JobConfig config = *LoadConfig(std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/teacher.pbtxt");
  config.mutable_cluster()->set_lease_ms(60000);
  config.mutable_training()->set_epochs(3);
  config.mutable_model()->mutable_segments()->DeleteSubrange(1, 1);
  config.mutable_model()->mutable_segments(0)->set_workers(1);
  config.mutable_model()->mutable_segments(0)->set_staleness(0);
  config.mutable_data()->set_train_samples(4000);
  config.mutable_data()->set_test_samples(1000);
  return config;
}

// One CPU worker trains the first segment, scoring it on the test set after every epoch.
absl::StatusOr<TrainReport> TrainScoringEachEpoch(const v1::JobConfig& config, const InProcessCluster& cluster,
                                                  const TrainTest& data) {
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ConnectGrpc(config, cluster.addresses());
  if (!client.ok()) return client.status();
  TrainerOptions options;
  options.test = &data.test;
  return Train(config, options, data.train, backend.get(), client->get());
}

// The test accuracy after each epoch of a TrainScoringEachEpoch run, printed
// under `label`; empty when training failed.
std::vector<double> EpochAccuracies(const absl::StatusOr<TrainReport>& report, const std::string& label) {
  EXPECT_TRUE(report.ok()) << report.status();
  if (!report.ok()) return {};
  std::vector<double> accuracies;
  std::cout << label << ": test accuracy by epoch";
  for (const auto& epoch : report->history.epochs()) {
    accuracies.push_back(epoch.test_accuracy());
    std::cout << " " << epoch.test_accuracy();
  }
  std::cout << "\n";
  return accuracies;
}

// Top-k pushes of 5% of the entries, in 4 KB chunks over two servers: the
// task is still learnt, and the parameters differ from dense training's.
TEST(WorkerInProcess, TopKPushesLearnTheTeacherTask) {
  v1::JobConfig config = SmallTeacher();
  config.mutable_training()->set_gradient_topk(0.05f);
  config.mutable_cluster()->set_chunk_bytes(4096);
  InProcessCluster cluster(config);
  const TrainTest data = *LoadData(config);
  const std::vector<double> accuracy = EpochAccuracies(TrainScoringEachEpoch(config, cluster, data), "top-k 5%");
  ASSERT_EQ(accuracy.size(), 3u);
  EXPECT_GT(accuracy[2], 0.4);  // chance: about 0.1-0.2
  const std::vector<float> dense = TrainReference(config, data.train)[0];
  EXPECT_NE(cluster.Parameters(0), dense) << "top-k left no trace: are the pushes really sparse?";
}

// optimizer.clip_gradient_norm: with SGD every step moves the parameters
// by at most learning_rate x the bound, so an epoch of 63 steps moves them
// by at most 63 x 0.1 x 0.01 in L2 norm; unclipped, the same epoch moves
// them much further. clip_value bounds each element the same way.
TEST(WorkerInProcess, ClippedGradientsMoveTheParametersAtMostTheirBoundAStep) {
  auto moved = [](float clip_norm, float clip_value) {
    v1::JobConfig config = SmallTeacher();
    config.mutable_training()->set_epochs(1);
    config.mutable_optimizer()->Clear();
    config.mutable_optimizer()->set_kind(v1::SGD);
    config.mutable_optimizer()->set_learning_rate(0.1f);
    config.mutable_optimizer()->set_clip_gradient_norm(clip_norm);
    config.mutable_optimizer()->set_clip_value(clip_value);
    InProcessCluster cluster(config);
    const std::vector<float> before = cluster.Parameters(0);
    const TrainTest data = *LoadData(config);
    absl::StatusOr<TrainReport> report = TrainScoringEachEpoch(config, cluster, data);
    EXPECT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report.ok() ? report->steps : 0, 63u);
    const std::vector<float> after = cluster.Parameters(0);
    double squares = 0, largest = 0;
    for (size_t i = 0; i < after.size(); ++i) {
      const double d = static_cast<double>(after[i]) - before[i];
      squares += d * d;
      largest = std::max(largest, std::abs(d));
    }
    return std::pair{std::sqrt(squares), largest};
  };
  const double bound = 63 * 0.1 * 0.01;
  EXPECT_LE(moved(0.01f, 0).first, bound * (1 + 1e-4));
  EXPECT_LE(moved(0, 0.001f).second, 63 * 0.1 * 0.001 * (1 + 1e-4));
  EXPECT_GT(moved(0, 0).first, 10 * bound) << "unclipped training moves as little: the test shows nothing";
}

// Staleness 1 with momentum lookahead, over real gRPC: the task is learnt
// about as well as synchronously (the drift itself is tested in the server's
// and the shard's tests).
TEST(WorkerInProcess, MomentumLookaheadLearnsTheTeacherTask) {
  v1::JobConfig config = SmallTeacher();
  config.mutable_model()->mutable_segments(0)->set_staleness(1);
  config.mutable_optimizer()->set_momentum_lookahead(true);
  InProcessCluster cluster(config);
  const TrainTest data = *LoadData(config);
  const std::vector<double> accuracy =
      EpochAccuracies(TrainScoringEachEpoch(config, cluster, data), "staleness 1 + lookahead");
  ASSERT_EQ(accuracy.size(), 3u);
  EXPECT_GT(accuracy[2], 0.8);  // synchronous: about 0.9; chance: 0.1-0.2
}

TEST(WorkerInProcess, ScoresTheTestSetAfterEveryEpoch) {
  // A learnable task, small: a score far above chance shows the scoring reads
  // the trained parameters and the right labels.
  const v1::JobConfig config = SmallTeacher();
  InProcessCluster cluster(config);
  const TrainTest data = *LoadData(config);
  absl::StatusOr<TrainReport> report = TrainScoringEachEpoch(config, cluster, data);
  ASSERT_TRUE(report.ok()) << report.status();
  const auto& epochs = report->history.epochs();
  ASSERT_EQ(epochs.size(), 3);
  EXPECT_GT(epochs[0].test_accuracy(), 0.4);   // chance: about 0.1-0.2
  EXPECT_GT(epochs[2].test_accuracy(), epochs[0].test_accuracy());
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(epochs[e].epoch(), static_cast<uint32_t>(e + 1));
    if (e > 0) {
      EXPECT_GT(epochs[e].train_seconds(), epochs[e - 1].train_seconds());
    }
    EXPECT_GT(epochs[e].samples_per_second(), 0);
    EXPECT_GT(epochs[e].loss(), 0);
  }
  EXPECT_GT(epochs[0].loss(), epochs[2].loss());
  EXPECT_LE(epochs[2].train_seconds(), report->seconds + 1e-9);
}

TEST(WorkerInProcess, WorkerWithAnotherModelIsRefused) {
  const v1::JobConfig config = SeedConfig(1);
  InProcessCluster cluster(config);
  v1::JobConfig other = config;
  other.mutable_model()->mutable_segments(0)->mutable_layers(0)->set_units(65);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(other, cluster.addresses());
  absl::StatusOr<Registration> registered = client->Register(0, 0);
  ASSERT_EQ(registered.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(registered.status().message());
  EXPECT_NE(message.find(ModelFingerprint(other)), std::string::npos) << message;
  EXPECT_NE(message.find("started with different configs (model differs)"), std::string::npos) << message;
  EXPECT_EQ(message.find(ModelFingerprint(config)), std::string::npos) << "the server's own fingerprint: " << message;
}

TEST(WorkerInProcess, ServersListedOutOfOrderAreNamed) {
  const v1::JobConfig config = SeedConfig(1);
  InProcessCluster cluster(config);
  std::vector<std::string> swapped = {cluster.addresses()[1], cluster.addresses()[0]};
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, swapped);
  absl::StatusOr<Registration> r = client->Register(0, 0);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(r.status().message()).find("give the servers in index order"), std::string::npos)
      << r.status();
}

TEST(WorkerInProcess, ReplicasWithoutARankGetTheFreeOnes) {
  v1::JobConfig config = SeedConfig(1);
  config.mutable_model()->mutable_segments(1)->set_workers(2);
  InProcessCluster cluster(config);
  std::vector<std::unique_ptr<ParameterClient>> clients;
  std::vector<uint32_t> ranks;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(*ConnectGrpc(config, cluster.addresses()));
    absl::StatusOr<Registration> r = clients.back()->Register(1, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status();
    ranks.push_back(r->rank);
  }
  EXPECT_EQ(ranks, (std::vector<uint32_t>{0, 1}));
  std::unique_ptr<ParameterClient> extra = *ConnectGrpc(config, cluster.addresses());
  absl::StatusOr<Registration> refused = extra->Register(1, std::nullopt);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  ASSERT_TRUE(clients[0]->Leave(std::nullopt).ok());
  absl::StatusOr<Registration> again = extra->Register(1, std::nullopt);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rank, 0u);  // the rank its first holder gave back
}

TEST(WorkerInProcess, ReaderPullsWithoutRegistering) {
  const v1::JobConfig config = SeedConfig(1);
  InProcessCluster cluster(config);
  std::unique_ptr<ParameterClient> reader = *ConnectGrpc(config, cluster.addresses());
  std::vector<float> params(3914);
  absl::StatusOr<uint64_t> clock = reader->Pull(1, 0, absl::MakeSpan(params));
  ASSERT_TRUE(clock.ok()) << clock.status();
  EXPECT_EQ(params, cluster.Parameters(1));
}

}  // namespace
}  // namespace segps
