// A token per job on one host: segps-local runs every process on loopback
// with a token it makes for the job (deploy/local/job_security.h), and a
// server or stage link takes tokens without TLS from loopback peers only
// (common/security.h). A stranger on the host gets UNAUTHENTICATED on every
// call, and the job trains to its bar meanwhile.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "segps/v1/pipeline.grpc.pb.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return context;
}

std::unique_ptr<v1::ParameterServer::Stub> Plaintext(const std::string& address) {
  return v1::ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<v1::ParameterServer::Stub> WithToken(const std::string& address, Role role, const std::string& token) {
  Security security;
  security.tokens.push_back({role, token});
  return v1::ParameterServer::NewStub(grpc::CreateChannel(address, *ChannelCredentials(security)));
}

v1::RegisterRequest Registration(const v1::JobConfig& config, uint32_t segment) {
  v1::RegisterRequest reg;
  reg.set_segment(segment);
  reg.set_model_fingerprint(ModelFingerprint(config));
  reg.set_shard_fingerprint(ShardMap::Create(config.model(), config.cluster().num_servers())->fingerprint());
  return reg;
}

// A server given a token file and no certificate: on loopback it takes the
// tokens (a worker's registers, a reader's reads, no token nothing); it
// refuses to take them on an address other hosts reach.
TEST(JobToken, TokensWithoutTlsAreTakenOnLoopbackOnly) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/tokens", "worker 0123456789abcdef0123456789abcdef\nreader fedcba9876543210fedcba9876543210\n");
  const std::string config_path = dir + "/teacher.pbtxt";
  WriteFile(config_path, ReadFile(std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/teacher.pbtxt") +
                             "security { token_file: \"" + dir + "/tokens\" }\n");
  const v1::JobConfig config = *LoadConfig(config_path);
  ServerProcesses started = StartServers(config_path, 2);
  ASSERT_TRUE(started.ok()) << started.Output();
  const std::string address = started.addresses[0];
  v1::StatsResponse stats;
  v1::RegisterResponse registered;
  const grpc::Status stranger = Plaintext(address)->Register(Context().get(), Registration(config, 0), &registered);
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::UNAUTHENTICATED) << stranger.error_message();
  EXPECT_EQ(Plaintext(address)->Stats(Context().get(), v1::StatsRequest(), &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  auto reader = WithToken(address, Role::kReader, "fedcba9876543210fedcba9876543210");
  EXPECT_TRUE(reader->Stats(Context().get(), v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(reader->Register(Context().get(), Registration(config, 0), &registered).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  auto worker = WithToken(address, Role::kWorker, "0123456789abcdef0123456789abcdef");
  const grpc::Status ok = worker->Register(Context().get(), Registration(config, 0), &registered);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(WithToken(address, Role::kWorker, "0123456789abcdef0123456789abcdee")
                ->Stats(Context().get(), v1::StatsRequest(), &stats)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  std::unique_ptr<Subprocess> open = Subprocess::Start(
      {BinaryPath("segps-server"), "--config", config_path, "--index", "0", "--listen", "0.0.0.0:0", "--insecure"});
  const std::optional<int> status = open->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_FALSE(ExitedOk(*status));
  EXPECT_NE(open->output().find("refusing to take tokens on 0.0.0.0:0 without TLS"), std::string::npos)
      << open->output();
}

// segps-local by default: a token for the job in files only its user may
// read; a plaintext stranger is refused by the servers and by a stage's
// link, and the chain trains to its bar.
TEST(JobToken, LocalLauncherMakesATokenPerJobThatStrangersLack) {
  const std::string dir = MakeTempDir();
  const std::string config_path = std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/teacher_chain.pbtxt";
  const v1::JobConfig config = *LoadConfig(config_path);
  std::unique_ptr<Subprocess> job =
      Subprocess::Start({BinaryPath("segps-local"), "--config", config_path, "--report", dir + "/report.json",
                         "--verbose"});  // the stages' link addresses
  const std::optional<std::string> banner = job->WaitForLine("with a token for this job (", absl::Minutes(1));
  ASSERT_TRUE(banner.has_value()) << job->output();
  std::smatch where;
  ASSERT_TRUE(std::regex_search(*banner, where, std::regex("\\((/tmp/segps-token\\.[A-Za-z0-9]+),"))) << *banner;
  for (const std::string file : {"tokens", "worker.token", "reader.token"}) {
    struct stat s {};
    ASSERT_EQ(stat((where[1].str() + "/" + file).c_str(), &s), 0) << file;
    EXPECT_EQ(s.st_mode & 0777, 0600u) << file;
  }
  const std::optional<std::string> servers = job->WaitForLine("segps-local: 2 servers at ", absl::Minutes(1));
  ASSERT_TRUE(servers.has_value()) << job->output();
  const std::string first = std::vector<std::string>(
      absl::StrSplit(servers->substr(servers->find(" at ") + 4), absl::ByAnyChar(", \n")))[0];
  v1::RegisterResponse registered;
  const grpc::Status refused = Plaintext(first)->Register(Context().get(), Registration(config, 0), &registered);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();

  // The stages' links listen before the servers start.
  std::smatch link;
  const std::string output = job->output();
  ASSERT_TRUE(std::regex_search(output, link, std::regex("stage link listening on (127\\.0\\.0\\.1:[0-9]+)")))
      << output;
  auto stage = v1::PipelineStage::NewStub(grpc::CreateChannel(link[1].str(), grpc::InsecureChannelCredentials()));
  auto context = Context();
  auto stream = stage->Exchange(context.get());
  v1::Activations done;
  done.set_model_fingerprint(ModelFingerprint(config));
  done.set_done(true);
  stream->Write(done);
  stream->WritesDone();
  const grpc::Status taken = stream->Finish();
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::UNAUTHENTICATED) << taken.error_message();

  const std::optional<int> status = job->Wait(absl::Minutes(3));
  ASSERT_TRUE(status.has_value()) << job->output();
  EXPECT_TRUE(ExitedOk(*status)) << *status << job->output();
  EXPECT_GT(EnsembleAccuracy(ReadFile(dir + "/report.json")), 0.90) << job->output();
}

}  // namespace
}  // namespace segps
