// Replicated ranges (cluster.replicas) between server processes on
// loopback: after training, every backup's copy of a range equals its
// primary's range bit for bit; the tools read a lost server's ranges from
// their copies; a paused backup holds its primary's pushes until it
// resumes, or for a lease, then is dropped and later filled again; a
// server started again on no disk takes its range back from its
// backup, and the job ends as if uninterrupted.
#include <signal.h>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/server_route.h"
#include "common/shard_map.h"
#include "common/tensor_wire.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "segps/v1/replication.grpc.pb.h"
#include "tests/support/process_cluster.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

// 3 servers, each range on 2 of them; two segments, two workers each, staleness 2.
std::string Job(const std::string& dir, int epochs, int lease_ms = 10000) {
  const std::string path = dir + "/job.pbtxt";
  WriteFile(path, absl::StrFormat(R"pb(
    seed: 7
    cluster { num_servers: 3 replicas: 2 lease_ms: %d }
    model {
      input_width: 50
      num_classes: 10
      segments { name: "relu64" layers { units: 64 activation: RELU } layers { units: 10 activation: SOFTMAX } }
      segments { name: "tanh32" layers { units: 32 activation: TANH } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { kind: ADAM learning_rate: 0.003 }
    training { batch_size: 64 epochs: %d staleness: 2 workers_per_segment: 2 }
    data { source: SYNTHETIC_TEACHER data_seed: 1 train_samples: 8000 test_samples: 1000 teacher_hidden: 32 }
  )pb", lease_ms, epochs));
  return path;
}

// tests/fixtures/replicated_sync.pbtxt in `dir`: one segment "s", one
// worker, staleness 0, a 2 s lease: 375 steps.
std::string SynchronousJob(const std::string& dir) {
  const std::string path = dir + "/sync.pbtxt";
  WriteFile(path, ReadFile(std::string(SEGPS_SOURCE_DIR) + "/tests/fixtures/replicated_sync.pbtxt"));
  return path;
}

// SynchronousJob for `epochs` epochs (3 by default).
std::string LongerJob(const std::string& dir, int epochs) {
  const std::string path = dir + "/longer.pbtxt";
  std::string job = ReadFile(SynchronousJob(dir));
  job.replace(job.find("epochs: 3"), 9, absl::StrCat("epochs: ", epochs));
  WriteFile(path, job);
  return path;
}

// SynchronousJob at staleness 2: a worker has pushes of 3 steps in flight.
std::string BoundedJob(const std::string& dir) {
  const std::string path = dir + "/bounded.pbtxt";
  std::string job = ReadFile(SynchronousJob(dir));
  job.replace(job.find("staleness: 0"), 12, "staleness: 2");
  WriteFile(path, job);
  return path;
}

// ProcessCluster's reader token, where its calls carry tokens.
constexpr char kReaderToken[] = "fedcba9876543210fedcba9876543210";

// The Stats of the server at `address`, or with `as`, of the ranges of
// server `as` it took over (the segps-server header); `token`, if any, is
// the caller's.
v1::StatsResponse Stats(const std::string& address, std::optional<int> as = std::nullopt,
                        const std::string& token = "") {
  auto stub = v1::ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (as.has_value()) context.AddMetadata(kServerHeader, absl::StrCat(*as));
  if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  v1::StatsRequest request;
  request.set_digests(true);
  v1::StatsResponse stats;
  const grpc::Status status = stub->Stats(&context, request, &stats);
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  return stats;
}

// Every range of every segment: its primary's digest and its backup's.
void ExpectCopiesEqual(const ProcessCluster& cluster) {
  std::map<std::pair<uint32_t, uint32_t>, std::string> primaries, backups;
  for (size_t i = 0; i < cluster.addresses().size(); ++i) {
    const v1::StatsResponse stats = Stats(cluster.addresses()[i]);
    for (const v1::SegmentStats& segment : stats.segments()) primaries[{segment.segment(), i}] = segment.digest();
    for (const v1::ReplicaStats& copy : stats.replicas()) {
      EXPECT_GT(copy.seq(), 0u);
      EXPECT_EQ((copy.range() + 1) % 3, i) << "server " << i << " backs range " << copy.range();
      backups[{copy.segment(), copy.range()}] = copy.digest();
    }
  }
  ASSERT_EQ(primaries.size(), 6u);
  ASSERT_EQ(backups.size(), 6u);
  for (const auto& [key, digest] : primaries) {
    EXPECT_FALSE(digest.empty());
    EXPECT_EQ(backups[key], digest) << "segment " << key.first << " range " << key.second;
  }
}

std::vector<std::unique_ptr<Subprocess>> StartWorkers(const ProcessCluster& cluster) {
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (const char* segment : {"relu64", "tanh32"}) {
    for (int rank = 0; rank < 2; ++rank) workers.push_back(cluster.StartWorker(segment, rank));
  }
  return workers;
}

// A worker's log: it neither rolled back nor computed a step again.
void ExpectNothingComputedAgain(const std::string& output) {
  for (const char* never : {"rolling the segment back", "computed again", "continuing from clock"}) {
    EXPECT_EQ(output.find(never), std::string::npos) << never << "\n" << output;
  }
}

void ExpectFinished(std::vector<std::unique_ptr<Subprocess>>& workers) {
  for (auto& worker : workers) {
    std::optional<int> status = worker->Wait(absl::Seconds(300));
    EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  }
}

TEST(ReplicatedCluster, EveryBackupHoldsItsPrimarysRangeBitForBitAfterTraining) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, 2), dir, 3, /*checkpoints=*/false, /*tokens=*/false, /*replicated=*/true);
  std::vector<std::unique_ptr<Subprocess>> workers = StartWorkers(cluster);
  ExpectFinished(workers);
  ExpectCopiesEqual(cluster);
  EXPECT_GT(cluster.EnsembleAccuracy(), 0.85);
}

// Whether server i's clock of segment 0 reaches `clock` within 120 s.
bool ReachesClock(const ProcessCluster& cluster, int i, uint64_t clock, const std::string& token = "") {
  for (absl::Time until = absl::Now() + absl::Seconds(120); absl::Now() < until;) {
    const v1::StatsResponse stats = Stats(cluster.addresses()[i], std::nullopt, token);
    if (stats.segments_size() > 0 && stats.segments(0).clock() >= clock) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// The job of 2 workers a segment at staleness 2, server 1 killed (-9)
// mid-run and started again with no disk: it takes its ranges back from
// server 2, behind the other servers by the pushes in flight, and every
// worker sends it the pushes it lacks. Nothing is rolled back or computed
// again, every server applies each rank's steps once (each worker's Leave
// checks it), and the ensemble reaches its bar.
TEST(ReplicatedCluster, AServerStartedAgainOnNoDiskMidJobCostsNoStepAtStaleness2) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, 6), dir, 3, false, false, true);
  std::vector<std::unique_ptr<Subprocess>> workers = StartWorkers(cluster);
  ASSERT_TRUE(ReachesClock(cluster, 1, 60)) << cluster.Output();  // of about 190
  cluster.KillServer(1);
  ASSERT_TRUE(cluster.StartServer(1)) << cluster.Output();
  ExpectFinished(workers);
  EXPECT_TRUE(cluster.WaitForServerLine(1, "took segment 0's range back from server 2")) << cluster.Output();
  for (const auto& worker : workers) {
    EXPECT_NE(worker->output().find("rejoined at clock"), std::string::npos) << worker->output();
    ExpectNothingComputedAgain(worker->output());
  }
  EXPECT_GT(cluster.EnsembleAccuracy(), 0.9);
}

// The same job with server 1 killed (-9) for good at clock 60 of about 190,
// never started again: server 2 takes its ranges over once server 0 agrees
// it is gone, and the four workers' calls for it go there. Every worker
// exits 0 with every server (server 1's ranges at server 2) having applied
// each of its steps once, none rolls back or computes a step again, and
// segps-eval, given all three addresses (one dead), scores the ensemble.
// Calls carry tokens: the servers' votes are sealed with their key.
TEST(ReplicatedCluster, AServerKilledForGoodMidJobCostsNoStepAtStaleness2) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, 6, /*lease_ms=*/2000), dir, 3, false, /*tokens=*/true, true);
  std::vector<std::unique_ptr<Subprocess>> workers = StartWorkers(cluster);
  ASSERT_TRUE(ReachesClock(cluster, 1, 60, kReaderToken)) << cluster.Output();
  cluster.KillServer(1);
  ExpectFinished(workers);
  EXPECT_TRUE(cluster.WaitForServerLine(2, "took over server 1's ranges")) << cluster.Output();
  for (const auto& worker : workers) {
    EXPECT_NE(worker->output().find("rejoined at clock"), std::string::npos) << worker->output();
    ExpectNothingComputedAgain(worker->output());
  }
  EXPECT_GT(cluster.EnsembleAccuracy(), 0.9);
}

// The tools' reads of a job whose server is lost for good (killed, never
// started again): each of its ranges comes from its backup's copy, and
// segps-eval scores, and segps-export writes, exactly what they did with
// every server up.
TEST(ReplicatedCluster, AServerLostForGoodIsReadFromItsBackupsCopiesByTheTools) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, 1), dir, 3, false, /*tokens=*/true, true);
  std::vector<std::unique_ptr<Subprocess>> workers = StartWorkers(cluster);
  ExpectFinished(workers);
  const std::string up = MakeTempDir(), lost = MakeTempDir();
  const std::string all_up = cluster.Evaluate({"--dump_params", up});
  auto export_to = [&](const std::string& out) {
    std::unique_ptr<Subprocess> exporter = Subprocess::Start(
        {BinaryPath("segps-export"), "--config", dir + "/job.pbtxt", "--servers", cluster.Joined(), "--out", out,
         "--token_file", dir + "/reader.token"});
    std::optional<int> status = exporter->Wait(absl::Seconds(120));
    EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << exporter->output();
    return exporter->output();
  };
  export_to(up + "/model.safetensors");
  cluster.KillServer(1);
  const std::string one_lost = cluster.Evaluate({"--dump_params", lost});
  EXPECT_NE(one_lost.find("its ranges are read from server 2's copy"), std::string::npos) << one_lost;
  EXPECT_NE(one_lost.find("(server counters; not counted: server 1, out of reach)"), std::string::npos) << one_lost;
  const std::string exported = export_to(lost + "/model.safetensors");
  EXPECT_NE(exported.find("its ranges are read from server 2's copy"), std::string::npos) << exported;
  auto ensemble = [](const std::string& output) { return output.substr(output.find("ENSEMBLE")); };
  ASSERT_NE(all_up.find("ENSEMBLE"), std::string::npos) << all_up;
  ASSERT_NE(one_lost.find("ENSEMBLE"), std::string::npos) << one_lost;
  EXPECT_EQ(ensemble(one_lost), ensemble(all_up));
  for (const char* file : {"relu64.npy", "tanh32.npy", "model.safetensors"}) {
    const std::string a = ReadFile(up + "/" + file), b = ReadFile(lost + "/" + file);
    EXPECT_GT(a.size(), 1000u) << file;
    EXPECT_TRUE(a == b) << file << " differs with server 1 lost";
  }
}

// A worker's push of segment 0's range 0, registered on server 0 by hand,
// sent on a thread of its own, so that a test sees it wait.
class RawPush {
 public:
  RawPush(const ProcessCluster& cluster, const std::string& path) {
    const v1::JobConfig config = *LoadConfig(path);
    const ShardMap map = *ShardMap::Create(config.model(), 3, 2);
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(cluster.addresses()[0], grpc::InsecureChannelCredentials()));
    v1::RegisterRequest reg;
    reg.set_model_fingerprint(ModelFingerprint(config));
    reg.set_shard_fingerprint(map.fingerprint());
    v1::RegisterResponse registered;
    // A server just started again refuses registrations (UNAVAILABLE)
    // until it has taken its ranges back: asked again, as a worker does.
    grpc::Status status;
    for (absl::Time until = absl::Now() + absl::Seconds(60); absl::Now() < until;) {
      grpc::ClientContext context;
      status = stub_->Register(&context, reg, &registered);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_TRUE(status.ok()) << status.error_message();
    push_.set_worker_id(registered.worker_id());
    push_.set_registration_secret(registered.registration_secret());
    const Range range = map.range(0, 0);
    EncodeFloat32(std::vector<float>(range.count, 0.5f), range.offset, push_.mutable_gradient());
  }
  ~RawPush() {
    if (thread_.joinable()) thread_.join();
  }
  void Send() {
    thread_ = std::thread([this] {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      status_ = stub_->Push(&context, push_, &response_);
      answered_ = true;
    });
  }
  bool answered() const { return answered_; }
  // Waits for the answer: whether it was acknowledged (any way).
  bool Acknowledged() {
    thread_.join();
    return status_.ok();
  }
  // Waits for the answer: whether it applied the push.
  bool Applied() {
    thread_.join();
    EXPECT_TRUE(status_.ok()) << status_.error_message();
    return status_.ok() && response_.applied();
  }

 private:
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  v1::PushRequest push_;
  std::thread thread_;
  std::atomic<bool> answered_{false};
  grpc::Status status_;
  v1::PushResponse response_;
};

// Whether server 0 comes to hold a push waiting for its backups within 30 s.
bool PushWaits(const ProcessCluster& cluster) {
  for (absl::Time until = absl::Now() + absl::Seconds(30); absl::Now() < until;) {
    if (Stats(cluster.addresses()[0]).waiting_for_backups() == 1) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// Server 1's copy of range 0 and server 0's range: equal bit for bit.
void ExpectBackupHoldsRangeZero(const ProcessCluster& cluster) {
  const v1::StatsResponse primary = Stats(cluster.addresses()[0]), backup = Stats(cluster.addresses()[1]);
  ASSERT_EQ(backup.replicas_size(), 1);
  EXPECT_EQ(backup.replicas(0).digest(), primary.segments(0).digest());
}

// The synchronous job's cluster, server 1 (server 0's backup) then paused
// with a push to server 0 on its way.
struct PausedBackup {
  explicit PausedBackup(const std::string& dir)
      : path(SynchronousJob(dir)), cluster(path, dir, 3, false, false, true) {
    EXPECT_TRUE(cluster.WaitForServerLine(1, "backing server 0's ranges")) << cluster.Output();
    EXPECT_TRUE(cluster.WaitForServerLine(2, "backing server 1's ranges")) << cluster.Output();
    push = std::make_unique<RawPush>(cluster, path);
    kill(cluster.ServerPid(1), SIGSTOP);
    push->Send();
  }
  void Resume() { kill(cluster.ServerPid(1), SIGCONT); }

  const std::string path;
  ProcessCluster cluster;
  std::unique_ptr<RawPush> push;
};

// A push to server 0 while its backup (server 1) is paused is held, not
// answered, until the backup resumes and takes it.
TEST(ReplicatedCluster, APushIsNotAnsweredWhileItsBackupIsPausedAndIsOnceItResumes) {
  PausedBackup paused(MakeTempDir());
  const bool waited = PushWaits(paused.cluster);
  const bool early = paused.push->answered();
  paused.Resume();
  EXPECT_TRUE(waited) << "the push never waited for its backup\n" << paused.cluster.Output();
  EXPECT_FALSE(early) << "answered while its backup was paused";
  EXPECT_TRUE(paused.push->Applied());
  EXPECT_EQ(Stats(paused.cluster.addresses()[0]).waiting_for_backups(), 0u);
  ExpectBackupHoldsRangeZero(paused.cluster);
}

// Server 0's records to its backup slowed by fault injection: each waits
// 2 s (--fault_replica_delay_ms). A push server 0 applied is held while
// its backup lacks it (the backup's copy differs from server 0's range),
// and answered only once the backup holds it.
TEST(ReplicatedCluster, APushIsNotAnsweredBeforeItsSlowedBackupHoldsIt) {
  const std::string dir = MakeTempDir(), path = SynchronousJob(dir);
  ProcessCluster cluster(path, dir, 3, false, false, true);
  cluster.KillServer(0);
  ASSERT_TRUE(cluster.StartServer(0, {"--fault_replica_delay_ms", "2000"})) << cluster.Output();
  RawPush push(cluster, path);
  push.Send();
  ASSERT_TRUE(PushWaits(cluster)) << "the push never waited for its backup\n" << cluster.Output();
  const v1::StatsResponse primary = Stats(cluster.addresses()[0]), backup = Stats(cluster.addresses()[1]);
  EXPECT_FALSE(push.answered()) << "answered while its backup lacked it";
  ASSERT_EQ(backup.replicas_size(), 1);
  EXPECT_NE(backup.replicas(0).digest(), primary.segments(0).digest()) << "the backup held it already";
  EXPECT_TRUE(push.Applied());
  ExpectBackupHoldsRangeZero(cluster);
}

// A backup paused past its lease is dropped: the push its primary held (as
// the test above shows it holds one) is answered while the backup is still
// paused, and the primary says so. Server 1 is also a primary, of range 1:
// its own backup (server 2) takes that range over meanwhile, so once it
// resumes it is refused and stops. Started again, it takes its range back
// from server 2 and is filled again from server 0's state, holding exactly
// what server 0 does.
TEST(ReplicatedCluster, ABackupPausedPastItsLeaseIsDroppedAndFilledAgainOnceItResumes) {
  PausedBackup paused(MakeTempDir());
  ProcessCluster& cluster = paused.cluster;
  EXPECT_TRUE(cluster.WaitForServerLine(0, "its copies of this server's ranges are dropped")) << cluster.Output();
  const bool applied = paused.push->Applied();  // answered with its backup still paused
  EXPECT_TRUE(cluster.WaitForServerLine(2, "took over server 1's ranges")) << cluster.Output();
  paused.Resume();
  EXPECT_TRUE(applied);
  EXPECT_TRUE(cluster.WaitForServerLine(1, "server 1 stops")) << cluster.Output();
  ASSERT_TRUE(cluster.StartServer(1)) << cluster.Output();
  EXPECT_TRUE(cluster.WaitForServerLine(1, "took segment 0's range back from server 2")) << cluster.Output();
  // Server 0 fills the new server 1 (it may have said so of the old one).
  bool filled = false;
  for (absl::Time until = absl::Now() + absl::Seconds(60); !filled && absl::Now() < until;) {
    const v1::StatsResponse backup = Stats(cluster.addresses()[1]);
    filled = backup.replicas_size() == 1 && !backup.replicas(0).digest().empty();
    if (!filled) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(filled) << cluster.Output();
  ExpectBackupHoldsRangeZero(cluster);
}

// Server 0 paused past its lease with a push on its way to it: its backup
// (server 1) finds it silent, server 2 agrees it is out of reach, and server
// 1 takes range 0 over. Once server 0 resumes it takes the push, but its
// backup refuses it for the take-over: the push is never acknowledged,
// server 0 stops (exit 3) saying why, and the range server 1 serves never
// saw the push.
TEST(ReplicatedCluster, APrimaryPausedPastItsLeaseIsTakenOverAndAcknowledgesNothingOnceItResumes) {
  const std::string dir = MakeTempDir(), path = SynchronousJob(dir);
  ProcessCluster cluster(path, dir, 3, false, false, true);
  ASSERT_TRUE(cluster.WaitForServerLine(1, "backing server 0's ranges")) << cluster.Output();
  RawPush push(cluster, path);
  kill(cluster.ServerPid(0), SIGSTOP);
  push.Send();
  ASSERT_TRUE(cluster.WaitForServerLine(1, "took over server 0's ranges")) << cluster.Output();
  const bool early = push.answered();
  kill(cluster.ServerPid(0), SIGCONT);
  EXPECT_FALSE(early);
  EXPECT_FALSE(push.Acknowledged()) << "a push was acknowledged under the old map";
  EXPECT_TRUE(cluster.WaitForServerLine(0, "server 0 stops")) << cluster.Output();
  std::optional<int> status = cluster.WaitServer(0);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << *status;
  // Server 1's range 0, as server 0 (the segps-server header): no update.
  const v1::StatsResponse taken_over = Stats(cluster.addresses()[1], 0);
  ASSERT_EQ(taken_over.segments_size(), 1);
  EXPECT_EQ(taken_over.segments(0).updates(), 0u);
}

// Calls that name another server (the segps-server header) are served only
// for ranges taken over; every other is refused, naming why, and a peer's
// Suspect must come from a server of this job to this one.
TEST(ReplicatedCluster, CallsForAnotherServerAreRefusedUnlessItsRangesWereTakenOver) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(SynchronousJob(dir), dir, 3, false, false, true);
  auto stats_as = [&](const std::string& header) {
    auto stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(cluster.addresses()[1], grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.AddMetadata(kServerHeader, header);
    v1::StatsResponse stats;
    return stub->Stats(&context, v1::StatsRequest(), &stats);
  };
  grpc::Status status = stats_as("zero");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("segps-server must be a server index"), std::string::npos)
      << status.error_message();
  status = stats_as("7");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("names server 7; the job has 3"), std::string::npos) << status.error_message();
  status = stats_as("0");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("server 1 serves no ranges of server 0"), std::string::npos)
      << status.error_message();
  EXPECT_TRUE(stats_as("1").ok()) << "a call naming the server itself";

  const v1::JobConfig config = *LoadConfig(dir + "/sync.pbtxt");
  auto replication = v1::Replication::NewStub(
      grpc::CreateChannel(cluster.addresses()[1], grpc::InsecureChannelCredentials()));
  v1::SuspectRequest suspect;
  suspect.mutable_hello()->set_from_server(0);
  suspect.mutable_hello()->set_to_server(2);  // not the server asked
  suspect.mutable_hello()->set_shard_fingerprint(ShardMap::Create(config.model(), 3, 2)->fingerprint());
  suspect.set_server(0);
  suspect.set_take_over(true);
  v1::SuspectResponse answer;
  grpc::ClientContext context;
  status = replication->Suspect(&context, suspect, &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("Suspect: this is server 1, not server 2"), std::string::npos)
      << status.error_message();
  suspect.mutable_hello()->set_to_server(1);
  suspect.mutable_hello()->set_shard_fingerprint("another job");
  grpc::ClientContext again;
  status = replication->Suspect(&again, suspect, &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("has shard map another job"), std::string::npos) << status.error_message();
}

// The synchronous job's parameters, never interrupted.
std::string UninterruptedParameters() {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(SynchronousJob(dir), dir, 3, false, false, true);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  return cluster.Parameters("s");
}

// A server killed (-9) and started again with no disk at all takes its
// range back from its backup; the worker rejoins, and the job ends with the
// parameters of the same job never interrupted, bit for bit.
TEST(ReplicatedCluster, AServerStartedAgainOnNoDiskTakesItsRangeBackAndTheJobEndsBitForBit) {
  const std::string reference = UninterruptedParameters();
  ASSERT_GT(reference.size(), 1000u);
  for (int victim : {0, 2}) {
    SCOPED_TRACE(absl::StrCat("server ", victim, " killed at step 150"));
    const std::string dir = MakeTempDir();
    ProcessCluster cluster(SynchronousJob(dir), dir, 3, false, false, true);
    std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
    ASSERT_TRUE(worker->WaitForLine(" step 150/375 ", absl::Seconds(120)).has_value()) << worker->output();
    cluster.KillServer(victim);
    ASSERT_TRUE(cluster.StartServer(victim)) << cluster.Output();
    EXPECT_TRUE(worker->WaitForLine("rejoined at clock", absl::Seconds(120)).has_value()) << worker->output();
    std::optional<int> status = worker->Wait(absl::Seconds(120));
    ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
    EXPECT_TRUE(cluster.WaitForServerLine(victim, "took segment 0's range back from server")) << cluster.Output();
    // The push of step 150 reached the other servers, and the backup or
    // not: the worker sends it again rather than roll anything back.
    EXPECT_EQ(worker->output().find("rolling the segment back"), std::string::npos) << worker->output();
    EXPECT_NE(worker->output().find("rejoined at clock 15"), std::string::npos) << worker->output();
    EXPECT_TRUE(cluster.Parameters("s") == reference) << worker->output();
  }
}

// A server killed (-9) for good, at a step and a server drawn from a fixed
// seed, and never started again: its first backup finds it silent for a
// lease, the third server agrees it is out of reach (a majority), and the
// backup serves its ranges from its copies. The worker's calls for the lost
// server go to the backup, naming it; the job ends with the uninterrupted
// job's parameters bit for bit, which segps-eval reads from the backup.
TEST(ReplicatedCluster, AServerKilledForGoodIsTakenOverByItsBackupAndTheJobEndsBitForBit) {
  const std::string reference = UninterruptedParameters();
  ASSERT_GT(reference.size(), 1000u);
  std::mt19937 draw(20261207);
  const int step = std::uniform_int_distribution<int>(20, 350)(draw);
  const int victim = std::uniform_int_distribution<int>(0, 2)(draw);
  const int backup = (victim + 1) % 3;
  SCOPED_TRACE(absl::StrCat("server ", victim, " killed for good at step ", step));
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(SynchronousJob(dir), dir, 3, false, false, true);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  ASSERT_TRUE(worker->WaitForLine(absl::StrCat(" step ", step, "/375 "), absl::Seconds(120)).has_value())
      << worker->output();
  cluster.KillServer(victim);
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
  EXPECT_TRUE(cluster.WaitForServerLine(backup, absl::StrCat("took over server ", victim, "'s ranges")))
      << cluster.Output();
  EXPECT_NE(worker->output().find(absl::StrCat("through server ", backup)), std::string::npos) << worker->output();
  ExpectNothingComputedAgain(worker->output());
  const std::string read = cluster.Evaluate({"--dump_params", dir});
  EXPECT_NE(read.find(absl::StrCat("read from server ", backup, ", which took them over")), std::string::npos)
      << read;
  EXPECT_TRUE(ReadFile(dir + "/s.npy") == reference) << worker->output();
}

// A server killed for good and taken over, then replaced: a new server
// started at its address on no disk takes its ranges back from the backup
// that served them (which hands them back), and the backup is filled
// again from it. Then a second server, drawn from the same seed, is killed
// for good and taken over in turn. The job ends with the uninterrupted
// job's parameters bit for bit.
TEST(ReplicatedCluster, AReplacedServerTakesItsRangesBackAndASecondServerLostIsTakenOverToo) {
  const std::string reference_dir = MakeTempDir();
  std::string reference;
  {
    ProcessCluster cluster(LongerJob(reference_dir, 40), reference_dir, 3, false, false, true);
    std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
    std::optional<int> status = worker->Wait(absl::Seconds(120));
    ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
    reference = cluster.Parameters("s");
  }
  std::mt19937 draw(7122026);
  const int step = std::uniform_int_distribution<int>(50, 400)(draw);
  const int first = std::uniform_int_distribution<int>(0, 2)(draw);
  const int second = (first + std::uniform_int_distribution<int>(1, 2)(draw)) % 3;
  const int backup = (first + 1) % 3;
  SCOPED_TRACE(absl::StrCat("server ", first, " lost at step ", step, ", then server ", second));
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(LongerJob(dir, 40), dir, 3, false, false, true);
  ASSERT_TRUE(cluster.WaitForServerLine(backup, absl::StrCat("backing server ", first, "'s ranges")));
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  ASSERT_TRUE(worker->WaitForLine(absl::StrCat(" step ", step, "/5000 "), absl::Seconds(120)).has_value());
  cluster.KillServer(first);
  ASSERT_TRUE(cluster.WaitForServerLine(backup, absl::StrCat("took over server ", first, "'s ranges")))
      << cluster.Output();
  ASSERT_TRUE(cluster.StartServer(first)) << cluster.Output();
  EXPECT_TRUE(cluster.WaitForServerLine(backup, absl::StrCat("server ", first, " is back"))) << cluster.Output();
  EXPECT_TRUE(cluster.WaitForServerLine(first, absl::StrCat("took segment 0's range back from server ", backup)))
      << cluster.Output();
  // Filled again: the backup takes the new server's stream, and the second
  // server's backup holds its range.
  EXPECT_TRUE(cluster.WaitForServerLine(backup, absl::StrCat("backing server ", first, "'s ranges")))
      << cluster.Output();
  if ((second + 1) % 3 == first) {
    EXPECT_TRUE(cluster.WaitForServerLine(first, absl::StrCat("backing server ", second, "'s ranges")))
        << cluster.Output();
  }
  ASSERT_FALSE(worker->Wait(absl::ZeroDuration()).has_value()) << "the job ended before the second loss";
  cluster.KillServer(second);
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
  EXPECT_TRUE(cluster.WaitForServerLine((second + 1) % 3, absl::StrCat("took over server ", second, "'s ranges")))
      << cluster.Output();
  EXPECT_EQ(worker->output().find("rolling the segment back"), std::string::npos) << worker->output();
  EXPECT_TRUE(cluster.Parameters("s") == reference) << worker->output();
}

// Server 0's records to its backup held back 50 ms each
// (--fault_replica_delay_ms), so that pushes it applied have not reached
// the backup when it is killed (-9); started again on no disk, it takes its
// range back from the backup, steps behind the other servers. The worker
// holds those pushes (staleness 2: up to three in flight) and sends them again
// as they were: no rollback, no step computed again, and every server
// applies each of the rank's steps once (the worker's Leave checks it).
TEST(ReplicatedCluster, AServerBehindByThePushesInFlightIsSentThemAgainWithNoRollback) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(BoundedJob(dir), dir, 3, false, false, true);
  cluster.KillServer(0);
  ASSERT_TRUE(cluster.StartServer(0, {"--fault_replica_delay_ms", "50"})) << cluster.Output();
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  ASSERT_TRUE(worker->WaitForLine(" step 100/375 ", absl::Seconds(120)).has_value()) << worker->output();
  // A push applied by server 0 and waiting for its backup, which lacks it.
  // The worker's pushes queued behind it go on to the other servers while
  // server 0, started again, refuses them (it knows no registration yet):
  // it comes back a few steps behind the others.
  ASSERT_TRUE(PushWaits(cluster)) << cluster.Output();
  cluster.KillServer(0);
  ASSERT_TRUE(cluster.StartServer(0)) << cluster.Output();
  EXPECT_TRUE(worker->WaitForLine("are sent again as they were", absl::Seconds(120)).has_value())
      << worker->output();
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output() << cluster.Output();
  EXPECT_TRUE(cluster.WaitForServerLine(0, "took segment 0's range back from server 1")) << cluster.Output();
  EXPECT_NE(worker->output().find("only on which of its steps"), std::string::npos) << worker->output();
  ExpectNothingComputedAgain(worker->output());
}

}  // namespace
}  // namespace segps
