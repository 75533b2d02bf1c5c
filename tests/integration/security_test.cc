// TLS, mutual TLS and bearer tokens between real processes on loopback,
// with certificates and tokens made by deploy/make-certs.sh (openssl): a
// teacher job trains over them to its bar, and every kind of wrong caller
// gets its status while the server keeps serving.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <iostream>
#include <regex>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "common/sync.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "common/shared_region.h"
#include "tests/support/subprocess.h"
#include "worker/client/ps_client.h"
#include "worker/train/pipeline_link.h"

namespace segps {
namespace {

// Runs `argv` to its end; its exit status and output.
std::pair<int, std::string> RunToEnd(const std::vector<std::string>& argv, absl::Duration timeout) {
  std::unique_ptr<Subprocess> p = Subprocess::Start(argv);
  const int status = p->Wait(timeout).value_or(-1);
  return {status, p->output()};
}

std::string MakeCerts(const std::string& dir) {
  auto [status, output] =
      RunToEnd({"/bin/bash", std::string(SEGPS_SOURCE_DIR) + "/deploy/make-certs.sh", dir}, absl::Minutes(1));
  EXPECT_TRUE(ExitedOk(status)) << output;
  return dir;
}

// The teacher config with a security block naming `certs`' files.
std::string SecureTeacher(const std::string& dir, const std::string& certs, const std::string& extra_training) {
  std::string text = ReadFile(std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/teacher.pbtxt");
  if (!extra_training.empty()) {
    text = std::regex_replace(text, std::regex("training \\{ [^}]*\\}"), "training { " + extra_training + " }");
  }
  text += absl::StrCat("security { ca_cert: \"", certs, "/ca.pem\" cert: \"", certs, "/server.pem\" key: \"", certs,
                       "/server.key\" require_client_cert: true token_file: \"", certs, "/tokens\" }\n");
  const std::string path = dir + "/teacher_tls.pbtxt";
  WriteFile(path, text);
  return path;
}

TEST(Security, TeacherJobOverMutualTlsWithTokensReachesItsBar) {
  const std::string dir = MakeTempDir();
  const std::string config = SecureTeacher(dir, MakeCerts(dir + "/certs"), "");
  auto [status, output] = RunToEnd({BinaryPath("segps-local"), "--config", config, "--report", dir + "/report.json"},
                              absl::Minutes(5));
  ASSERT_TRUE(ExitedOk(status)) << output;
  std::smatch m;
  const std::string report = ReadFile(dir + "/report.json");
  ASSERT_TRUE(std::regex_search(report, m, std::regex("\"ensemble\": \\{\"name\": \"ensemble\", \"accuracy\": ([0-9.]+)")));
  EXPECT_GT(std::stod(m[1]), 0.90) << report;
}

class SecurityMatrix : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    certs_ = MakeCerts(dir_ + "/certs");
    other_ = MakeCerts(dir_ + "/other");  // another CA, other tokens
    config_path_ = SecureTeacher(dir_, certs_, "epochs: 1000 staleness: 1 workers_per_segment: 2");
    config_ = *LoadConfig(config_path_);
    ServerProcesses started = StartServers(config_path_, 2);
    ASSERT_TRUE(started.ok()) << started.Output();
    servers_ = std::move(started.processes);
    address_ = started.addresses[0];
    addresses_ = started.addresses;
    // A training job meanwhile: both workers of segment relu64, over mutual TLS with the worker token.
    for (int rank = 0; rank < 2; ++rank) {
      workers_.push_back(Subprocess::Start(
          {BinaryPath("segps-worker"), "--config", config_path_, "--segment", "relu64", "--rank",
           std::to_string(rank), "--servers", started.Joined(), "--tls_cert", certs_ + "/client.pem", "--tls_key",
           certs_ + "/client.key", "--token_file", certs_ + "/worker.token"}));
    }
  }

  // Segment relu64's clock on server 0, as the worker token reads it.
  uint64_t TrainingClock() {
    v1::StatsResponse stats;
    grpc::Status status = Stub(certs_ + "/ca.pem", certs_, certs_ + "/worker.token")
                              ->Stats(Context().get(), v1::StatsRequest(), &stats);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return stats.segments_size() > 0 ? stats.segments(0).clock() : 0;
  }
  // Waits until relu64's clock passes `clock`; false if it does not within a minute.
  bool TrainsPast(uint64_t clock) {
    for (const absl::Time give_up = absl::Now() + absl::Minutes(1); absl::Now() < give_up;) {
      if (TrainingClock() > clock) return true;
      for (auto& worker : workers_) worker->Wait(absl::Milliseconds(50));  // reads their output meanwhile
    }
    return false;
  }

  // A stub for server 0: TLS against `ca` (none: plaintext), a client
  // certificate from `client_dir` (empty: none), the token of `token_file`.
  std::unique_ptr<v1::ParameterServer::Stub> Stub(const std::string& ca, const std::string& client_dir,
                                                  const std::string& token_file, int server = 0) {
    v1::SecurityConfig security;
    security.set_ca_cert(ca);
    if (!client_dir.empty()) {
      security.set_cert(client_dir + "/client.pem");
      security.set_key(client_dir + "/client.key");
    }
    security.set_token_file(token_file);
    absl::StatusOr<Security> loaded = LoadSecurity(security);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = ChannelCredentials(*loaded);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return v1::ParameterServer::NewStub(grpc::CreateChannel(addresses_[server], *credentials));
  }
  std::unique_ptr<v1::ParameterServer::Stub> PlaintextStub() {
    return v1::ParameterServer::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return context;
  }
  // Each method's status for this stub: Stats, a reader pull, Register, a worker Pull.
  struct Outcome {
    grpc::StatusCode stats, read, reg, pull;
  };
  Outcome Try(v1::ParameterServer::Stub& stub) {
    Outcome o;
    v1::StatsResponse stats;
    o.stats = stub.Stats(Context().get(), v1::StatsRequest(), &stats).error_code();
    v1::PullRequest read;
    read.set_reader(true);
    v1::PullResponse pulled;
    o.read = stub.Pull(Context().get(), read, &pulled).error_code();
    v1::RegisterRequest reg;
    reg.set_segment(1);
    reg.set_rank(1);
    reg.set_model_fingerprint(ModelFingerprint(config_));
    reg.set_shard_fingerprint(ShardMap::Create(config_.model(), 2)->fingerprint());
    v1::RegisterResponse registered;
    o.reg = stub.Register(Context().get(), reg, &registered).error_code();
    v1::PullRequest pull;
    pull.set_worker_id(registered.worker_id() == 0 ? 1 : registered.worker_id());
    pull.set_registration_secret(registered.registration_secret());
    pull.set_segment(1);
    pull.set_clock(registered.start_clock());
    o.pull = stub.Pull(Context().get(), pull, &pulled).error_code();
    return o;
  }

  std::string dir_, certs_, other_, config_path_, address_;  // address_: server 0's
  std::vector<std::string> addresses_;
  v1::JobConfig config_;
  std::vector<std::unique_ptr<Subprocess>> servers_, workers_;
};

TEST_F(SecurityMatrix, EveryWrongCallerGetsItsStatusAndTheServerKeepsServing) {
  const std::string ca = certs_ + "/ca.pem";
  ASSERT_TRUE(TrainsPast(10)) << workers_[0]->output() << workers_[1]->output();
  // Not TLS, or a TLS client the server does not accept: no connection.
  for (auto* stub : {PlaintextStub().release(), Stub(ca, "", certs_ + "/worker.token").release(),
                     Stub(ca, other_, certs_ + "/worker.token").release()}) {
    std::unique_ptr<v1::ParameterServer::Stub> owned(stub);
    const Outcome o = Try(*owned);
    EXPECT_EQ(o.stats, grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(o.reg, grpc::StatusCode::UNAVAILABLE);
  }
  // A server this client does not trust (its CA is another): no connection either.
  EXPECT_EQ(Try(*Stub(other_ + "/ca.pem", other_, other_ + "/worker.token")).stats, grpc::StatusCode::UNAVAILABLE);
  // Accepted certificate, no token or a wrong one: UNAUTHENTICATED on every method.
  for (const std::string& token : {std::string(), other_ + "/worker.token"}) {
    const Outcome o = Try(*Stub(ca, certs_, token));
    EXPECT_EQ(o.stats, grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_EQ(o.read, grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_EQ(o.reg, grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_EQ(o.pull, grpc::StatusCode::UNAUTHENTICATED) << token;
  }
  // A reader token reads, and may do nothing else.
  const Outcome reader = Try(*Stub(ca, certs_, certs_ + "/reader.token"));
  EXPECT_EQ(reader.stats, grpc::StatusCode::OK);
  EXPECT_EQ(reader.read, grpc::StatusCode::OK);
  EXPECT_EQ(reader.reg, grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(reader.pull, grpc::StatusCode::PERMISSION_DENIED);
  // The worker token may do all.
  const Outcome worker = Try(*Stub(ca, certs_, certs_ + "/worker.token"));
  EXPECT_EQ(worker.stats, grpc::StatusCode::OK);
  EXPECT_EQ(worker.read, grpc::StatusCode::OK);
  EXPECT_EQ(worker.reg, grpc::StatusCode::OK);
  EXPECT_EQ(worker.pull, grpc::StatusCode::OK);
  // The health service asks for a token too, and a reader's will do.
  auto health = [&](const std::string& token) {
    return RunToEnd({BinaryPath("segps-health"), "--address", address_, "--tls_ca", ca, "--tls_cert",
                certs_ + "/client.pem", "--tls_key", certs_ + "/client.key", "--token_file", token},
               absl::Seconds(30));
  };
  auto [served, said] = health(certs_ + "/reader.token");
  EXPECT_TRUE(ExitedOk(served)) << said;
  EXPECT_FALSE(ExitedOk(health(other_ + "/reader.token").first));
  // The job trained on through all of it.
  const uint64_t after = TrainingClock();
  EXPECT_TRUE(TrainsPast(after + 10)) << workers_[0]->output() << workers_[1]->output();
  for (auto& worker : workers_) {
    EXPECT_FALSE(worker->Wait(absl::Milliseconds(100)).has_value()) << "a worker exited:\n" << worker->output();
  }
}

// Calls on one connection with different tokens: each call's own token
// decides its role, whichever token the connection's earlier calls carried
// (a role read from the connection let a reader register and roll back
// after a worker's call).
// The workers registered over mutual TLS with their token, so the servers
// (on their host) took their shared regions: their tensors go through them.
// A caller without the channel (above) never registers, so it never learns
// where to hand a region over, and a region comes only with a secret that
// Register gave (shared_memory_test: RegionHandOver).
TEST_F(SecurityMatrix, WorkersOverMutualTlsMoveTheirTensorsThroughSharedMemory) {
  if (SameHostIdentity().empty() || !SharedRegion::Create(4096).ok()) {
    GTEST_SKIP() << "skipped: this machine cannot share memory between processes (memfd, /proc)";
  }
  ASSERT_TRUE(TrainsPast(10)) << workers_[0]->output() << workers_[1]->output();
  v1::StatsResponse stats;
  const grpc::Status status =
      Stub(certs_ + "/ca.pem", certs_, certs_ + "/worker.token")->Stats(Context().get(), v1::StatsRequest(), &stats);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_GT(stats.segments_size(), 0);
  EXPECT_GT(stats.segments(0).region_bytes(), 0u);
}

TEST_F(SecurityMatrix, TheTokenOnEachCallDecidesItsRoleWhateverTheConnectionCarriedBefore) {
  auto token = [&](const char* file) {
    std::string line = ReadFile(certs_ + "/" + file);
    return "Bearer " + line.substr(line.find(' ') + 1, line.find('\n') - line.find(' ') - 1);
  };
  const std::string worker = token("worker.token"), reader = token("reader.token");
  auto as = [](const std::string& bearer) {
    std::unique_ptr<grpc::ClientContext> context = Context();
    context->AddMetadata("authorization", bearer);
    return context;
  };
  for (bool reader_first : {false, true}) {
    SCOPED_TRACE(reader_first ? "the reader's call first" : "the worker's call first");
    // One channel, so one connection: TLS with the client certificate and no token of its own.
    std::unique_ptr<v1::ParameterServer::Stub> stub = Stub(certs_ + "/ca.pem", certs_, "");
    v1::StatsResponse stats;
    if (reader_first) {
      ASSERT_TRUE(stub->Stats(as(reader).get(), v1::StatsRequest(), &stats).ok());
    }
    v1::RegisterRequest reg;
    reg.set_segment(1);
    reg.set_rank(reader_first ? 0 : 1);
    reg.set_model_fingerprint(ModelFingerprint(config_));
    reg.set_shard_fingerprint(ShardMap::Create(config_.model(), 2)->fingerprint());
    v1::RegisterResponse registered;
    ASSERT_TRUE(stub->Register(as(worker).get(), reg, &registered).ok());
    // The reader token, after the worker's call on the same connection: reads only.
    v1::RegisterResponse again;
    EXPECT_EQ(stub->Register(as(reader).get(), reg, &again).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    v1::HeartbeatRequest beat;
    beat.set_worker_id(registered.worker_id());
    beat.set_registration_secret(registered.registration_secret());
    v1::HeartbeatResponse alive;
    EXPECT_EQ(stub->Heartbeat(as(reader).get(), beat, &alive).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    v1::RollbackRequest back;
    back.set_segment(1);
    back.set_worker_id(registered.worker_id());
    back.set_registration_secret(registered.registration_secret());
    v1::RollbackResponse rolled;
    EXPECT_EQ(stub->Rollback(as(reader).get(), back, &rolled).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_TRUE(stub->Stats(as(reader).get(), v1::StatsRequest(), &stats).ok());
    // And the worker's token on the same connection still acts as a worker.
    EXPECT_TRUE(stub->Heartbeat(as(worker).get(), beat, &alive).ok());
  }
}

// A worker token cannot move a live rank far ahead: the registration is
// refused, the rank's worker keeps its registration, and training goes on.
TEST_F(SecurityMatrix, AJoinClockBeyondEveryRankIsRefusedAndTrainingGoesOn) {
  ASSERT_TRUE(TrainsPast(5)) << workers_[0]->output() << workers_[1]->output();
  v1::RegisterRequest reg;
  reg.set_segment(0);
  reg.set_rank(0);
  reg.set_join_clock(uint64_t{1} << 40);
  reg.set_model_fingerprint(ModelFingerprint(config_));
  reg.set_shard_fingerprint(ShardMap::Create(config_.model(), 2)->fingerprint());
  v1::RegisterResponse registered;
  const grpc::Status refused =
      Stub(certs_ + "/ca.pem", certs_, certs_ + "/worker.token")->Register(Context().get(), reg, &registered);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_NE(refused.error_message().find("join_clock 1099511627776 is beyond every rank"), std::string::npos)
      << refused.error_message();
  const uint64_t after = TrainingClock();
  EXPECT_TRUE(TrainsPast(after + 10)) << workers_[0]->output() << workers_[1]->output();
  EXPECT_LT(TrainingClock(), after + 1000) << "the segment jumped ahead";
  for (auto& worker : workers_) {
    EXPECT_FALSE(worker->Wait(absl::Milliseconds(100)).has_value()) << "a worker exited:\n" << worker->output();
  }
}

// A worker token registering a rank its live worker holds, 20 times a
// second for 2 s (each registration used to replace the worker, which then
// rejoined, and rolled the segment back where servers disagreed): each
// attempt is refused naming the holder, which trains on without rejoining.
TEST_F(SecurityMatrix, RegisteringALiveRankAgainAndAgainTakesNothingFromItsWorker) {
  ASSERT_TRUE(TrainsPast(5)) << workers_[0]->output() << workers_[1]->output();
  v1::RegisterRequest reg;
  reg.set_segment(0);
  reg.set_rank(0);
  reg.set_model_fingerprint(ModelFingerprint(config_));
  reg.set_shard_fingerprint(ShardMap::Create(config_.model(), 2)->fingerprint());
  std::unique_ptr<v1::ParameterServer::Stub> stub = Stub(certs_ + "/ca.pem", certs_, certs_ + "/worker.token");
  const uint64_t before = TrainingClock();
  for (int i = 0; i < 40; ++i) {
    v1::RegisterResponse registered;
    const grpc::Status refused = stub->Register(Context().get(), reg, &registered);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
    EXPECT_NE(refused.error_message().find("rank 0 of segment 0 is held by worker"), std::string::npos)
        << refused.error_message();
    workers_[0]->Wait(absl::Milliseconds(50));  // paces the attempts, reading the worker's output meanwhile
  }
  EXPECT_TRUE(TrainsPast(before + 10)) << workers_[0]->output() << workers_[1]->output();
  for (auto& worker : workers_) {
    EXPECT_FALSE(worker->Wait(absl::Milliseconds(100)).has_value()) << "a worker exited:\n" << worker->output();
    EXPECT_EQ(worker->output().find("rejoined"), std::string::npos) << worker->output();
  }
}

// A worker token with a registration (segment tanh128's ranks are free)
// asks server 0 to roll the segment back: without the servers' states,
// with their real sealed states (which agree), and with those states
// altered to disagree. Each is refused naming why; the segment stays at
// its generation, and training of relu64 goes on untouched.
TEST_F(SecurityMatrix, ARollbackIsRefusedUnlessTheServersSealedStatesDisagree) {
  ASSERT_TRUE(TrainsPast(5)) << workers_[0]->output() << workers_[1]->output();
  v1::RegisterRequest reg;
  reg.set_segment(1);
  reg.set_model_fingerprint(ModelFingerprint(config_));
  reg.set_shard_fingerprint(ShardMap::Create(config_.model(), 2)->fingerprint());
  std::vector<v1::RegisterResponse> registered(2);
  for (int i = 0; i < 2; ++i) {
    const grpc::Status status =
        Stub(certs_ + "/ca.pem", certs_, certs_ + "/worker.token", i)->Register(Context().get(), reg, &registered[i]);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_FALSE(registered[i].sealed().seal().empty()) << "make-certs.sh gave the servers a `server` line";
  }
  v1::RollbackRequest back;
  back.set_segment(1);
  back.set_worker_id(registered[0].worker_id());
  back.set_registration_secret(registered[0].registration_secret());
  back.set_generation(registered[0].generation());
  v1::RollbackRequest agreeing = back, forged = back;
  for (const v1::RegisterResponse& r : registered) *agreeing.add_states() = r.sealed();
  forged.mutable_states()->CopyFrom(agreeing.states());
  forged.mutable_states(1)->set_rank_clock(5);  // server 1 "at 5", under its seal for "none"
  std::unique_ptr<v1::ParameterServer::Stub> stub = Stub(certs_ + "/ca.pem", certs_, certs_ + "/worker.token");
  for (const auto& [request, code, says] : std::vector<std::tuple<v1::RollbackRequest, grpc::StatusCode, std::string>>{
           {back, grpc::StatusCode::INVALID_ARGUMENT, "states must hold the sealed state of each of the 2 servers"},
           {agreeing, grpc::StatusCode::FAILED_PRECONDITION, "the servers agree on segment 1 rank 0"},
           {forged, grpc::StatusCode::PERMISSION_DENIED, "states[1] is not sealed by a server of this job"}}) {
    v1::RollbackResponse rolled;
    const grpc::Status refused = stub->Rollback(Context().get(), request, &rolled);
    EXPECT_EQ(refused.error_code(), code) << refused.error_message();
    EXPECT_NE(refused.error_message().find(says), std::string::npos) << refused.error_message();
  }
  v1::StatsResponse stats;
  ASSERT_TRUE(stub->Stats(Context().get(), v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.segments(1).generation(), registered[0].generation()) << "a refused rollback changed the segment";
  const uint64_t after = TrainingClock();
  EXPECT_TRUE(TrainsPast(after + 10)) << workers_[0]->output() << workers_[1]->output();
  for (auto& worker : workers_) {
    EXPECT_EQ(worker->output().find("rejoined"), std::string::npos) << worker->output();
  }
}

TEST(SecurityConfig, TokenFileErrorsNameTheFileAndLine) {
  EXPECT_TRUE(ParseTokens("# comment\nworker 0123456789abcdef0123\n\nreader 0123456789abcdef9999\n", "t").ok());
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"worker\n", "t line 1: expected `ROLE TOKEN`"},
           {"# x\nadmin 0123456789abcdef0123\n", "t line 2: role must be worker, reader or server"},
           {"worker short\n", "t line 1: the token is 5 characters"},
           {"worker 0123456789abcdef0123\nserver 0123456789abcdef0124\nserver 0123456789abcdef0125\n",
            "t line 3: a second `server` line"},
           {"server 0123456789abcdef0123\n", "t: no `worker TOKEN` or `reader TOKEN` line"},
           {"# nothing\n", "t: no `worker TOKEN` or `reader TOKEN` line"}}) {
    absl::StatusOr<std::vector<Token>> parsed = ParseTokens(text, "t");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_NE(std::string(parsed.status().message()).find(says), std::string::npos) << parsed.status();
  }
  Security no_tls;
  no_tls.require_client_cert = true;
  EXPECT_FALSE(ServerCredentials(no_tls).ok());  // a client certificate needs TLS
}

// segps-local --tls makes a CA, certificates and tokens for the job and runs
// every process over mutual TLS: no server serves plaintext.
TEST(Security, LocalLauncherRunsTheWholeJobOverMutualTls) {
  const std::string dir = MakeTempDir();
  auto [status, output] =
      RunToEnd({BinaryPath("segps-local"), "--config", std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/seed.pbtxt",
                "--tls", "--report", dir + "/report.json"},
               absl::Minutes(3));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("segps-local: mutual TLS with bearer tokens"), std::string::npos) << output;
  EXPECT_EQ(output.find("plaintext"), std::string::npos) << output;
  EXPECT_NE(output.find("ENSEMBLE"), std::string::npos) << output;
}


// tests/support's 2-stage chain with `security` (a security block or
// nothing); a stage waits `patience_ms` for its neighbour.
std::string SmallChain(const std::string& dir, const std::string& security, int patience_ms = 10000) {
  ChainJob job(2, 2);
  job.cluster = absl::StrCat("recovery_timeout_ms: ", patience_ms);
  job.more = security;
  return WriteChainJob(dir, "chain", job);
}

// A stage link's listening end as segps-worker sets it up with TLS: the
// server certificate, mutual TLS, the worker token. The previous stage,
// with its worker certificate and token, gets through; a plaintext client,
// one without a certificate, one of another CA and one with the reader
// token do not, and the link sees none of their messages.
TEST(Security, AStageLinkTakesOnlyAWorkerOverMutualTlsWithItsToken) {
  const std::string dir = MakeTempDir();
  const std::string certs = MakeCerts(dir + "/certs"), other = MakeCerts(dir + "/other");
  auto security = [](const std::string& c, const std::string& cert, const std::string& token, bool require) {
    return absl::StrCat("security { ca_cert: \"", c, "/ca.pem\" cert: \"", c, "/", cert, ".pem\" key: \"", c, "/",
                        cert, ".key\" token_file: \"", c, "/", token, ".token\"",
                        require ? " require_client_cert: true" : "", " }");
  };
  // A refused connection costs the sender its patience (1 s) in Connect.
  auto chain = [&](const std::string& security) { return *LoadConfig(SmallChain(dir, security, 1000)); };
  const v1::JobConfig link = chain(security(certs, "server", "worker", true));
  absl::StatusOr<std::unique_ptr<Upstream>> upstream = Upstream::Listen(link, 1, 0, "127.0.0.1:0");
  ASSERT_TRUE(upstream.ok()) << upstream.status();

  // Sends one micro-batch as stage 0 with `config`'s credentials; whether it was taken.
  auto send = [&](const v1::JobConfig& config) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Downstream>> downstream = Downstream::Connect(config, 0, 0, (*upstream)->address());
    if (!downstream.ok()) return downstream.status();
    const std::vector<float> values(32, 0.5f);  // stage 0's output: 32 wide
    const std::vector<int32_t> labels = {3};
    absl::Status sent = (*downstream)->Send(0, 0, 0, 1, values, labels);
    if (!sent.ok()) return sent;
    return (*downstream)->Finish();
  };
  const absl::Status plaintext = send(chain(""));
  EXPECT_FALSE(plaintext.ok()) << "plaintext";
  const absl::Status no_certificate = send(
      chain(absl::StrCat("security { ca_cert: \"", certs, "/ca.pem\" token_file: \"", certs, "/worker.token\" }")));
  EXPECT_FALSE(no_certificate.ok()) << "no client certificate";
  const absl::Status other_ca = send(chain(security(other, "client", "worker", false)));
  EXPECT_FALSE(other_ca.ok()) << "another CA";
  const absl::Status reader = send(chain(security(certs, "client", "reader", false)));
  EXPECT_FALSE(reader.ok()) << "the reader token";
  std::cout << "refused: " << plaintext << "; " << no_certificate << "; " << other_ca << "; " << reader << "\n";
  absl::StatusOr<MicroBatch> nothing = (*upstream)->Receive(absl::Milliseconds(200));
  EXPECT_EQ(nothing.status().code(), absl::StatusCode::kDeadlineExceeded) << nothing.status();

  const absl::Status worker = send(chain(security(certs, "client", "worker", false)));
  ASSERT_TRUE(worker.ok()) << worker;
  absl::StatusOr<MicroBatch> got = (*upstream)->Receive(absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->labels, std::vector<int32_t>{3});
}

// segps-local --tls runs a chain's stage links over mutual TLS too.
TEST(Security, LocalLauncherRunsAChainOverMutualTls) {
  const std::string dir = MakeTempDir();
  auto [status, output] = RunToEnd(
      {BinaryPath("segps-local"), "--config", SmallChain(dir, ""), "--tls", "--report", dir + "/report.json"},
      absl::Minutes(3));
  ASSERT_TRUE(ExitedOk(status)) << output;
  EXPECT_NE(output.find("segps-local: mutual TLS with bearer tokens"), std::string::npos) << output;
  EXPECT_NE(output.find("ENSEMBLE (one network: a chain of 2 stages)"), std::string::npos) << output;
}


// A TCP relay on loopback that holds every chunk it forwards for `delay`,
// each way: a link with a long round trip.
class SlowLink {
 public:
  SlowLink(const std::string& target, absl::Duration delay) : delay_(delay) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    socklen_t len = sizeof(addr);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "SlowLink: cannot listen";
      return;
    }
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    to.sin_port = htons(static_cast<uint16_t>(std::stoi(target.substr(target.rfind(':') + 1))));
    acceptor_ = std::thread([this, to] {
      for (;;) {
        const int client = accept(listen_fd_, nullptr, nullptr);
        if (client < 0) return;
        const int server = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(server, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
          close(client);
          close(server);
          continue;
        }
        MutexLock lock(&mu_);
        fds_.insert(fds_.end(), {client, server});
        pumps_.emplace_back([this, client, server] { Pump(client, server); });
        pumps_.emplace_back([this, client, server] { Pump(server, client); });
      }
    });
  }
  // The acceptor first, after which no connection is added; then every
  // connection's pumps, woken by shutting their sockets down.
  ~SlowLink() {
    shutdown(listen_fd_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    MutexLock lock(&mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    for (std::thread& pump : pumps_) pump.join();
    for (int fd : fds_) close(fd);
    close(listen_fd_);
  }
  const std::string& address() const { return address_; }

 private:
  void Pump(int from, int to) {
    char buf[65536];
    ssize_t n;
    while ((n = read(from, buf, sizeof(buf))) > 0) {
      absl::SleepFor(delay_);
      for (ssize_t sent = 0; sent < n;) {
        const ssize_t w = send(to, buf + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
        if (w <= 0) return;
        sent += w;
      }
    }
    shutdown(to, SHUT_WR);
  }

  const absl::Duration delay_;
  int listen_fd_ = -1;
  std::string address_;
  std::thread acceptor_;
  Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

// A worker reaches a server over mutual TLS through a link that holds each
// chunk 1.2 s: the handshake takes several seconds, more than the client
// waits between attempts to reconnect, and it connects all the same.
TEST(Security, AClientOverASlowLinkCompletesItsTlsHandshake) {
  const std::string dir = MakeTempDir();
  const std::string certs = MakeCerts(dir + "/certs");
  const std::string config_path = SecureTeacher(dir, certs, "");
  ServerProcesses servers = StartServers(config_path, 2);
  ASSERT_TRUE(servers.ok()) << servers.Output();
  SlowLink link0(servers.addresses[0], absl::Milliseconds(1200));
  v1::JobConfig client_config = *LoadConfig(config_path);
  v1::SecurityConfig* security = client_config.mutable_security();
  security->set_cert(certs + "/client.pem");
  security->set_key(certs + "/client.key");
  security->set_token_file(certs + "/reader.token");
  security->set_require_client_cert(false);
  absl::StatusOr<std::unique_ptr<ParameterClient>> client =
      ConnectGrpc(client_config, {link0.address(), servers.addresses[1]});
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = (*client)->Stats();
  while (!stats.ok() && absl::Now() - start < absl::Seconds(60)) stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status() << " after " << absl::Now() - start;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(2400));  // two round trips at least: the link did hold it
  std::cout << "Stats through the slow link after " << absl::Now() - start << "\n";
}

}  // namespace
}  // namespace segps
