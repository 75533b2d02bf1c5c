// The same-host transport (cluster.shared_memory) against real segps-server
// processes: training through the region equals training over TCP bit for
// bit; each fallback; the hand-over refuses strangers (another user, a
// wrong secret, no descriptor, an unsealed one) and bad offsets in the
// region are refused like bad bytes on the wire, changing nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/shared_region.h"
#include "common/tensor_wire.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "tests/support/process_cluster.h"
#include "tests/support/subprocess.h"
#include "worker/client/ps_client.h"
#include "worker/client/region_arena.h"

namespace segps {
namespace {

// Why this machine cannot share memory between processes (no memfd, no
// /proc to say which host this is), or empty where it can.
std::string NoRegionsHere() {
  if (SameHostIdentity().empty()) return "no host identity (/proc/sys/kernel/random/boot_id, /proc/self/ns/net)";
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(4096);
  return region.ok() ? "" : std::string(region.status().message());
}
#define SKIP_WITHOUT_REGIONS()                                                          \
  if (const std::string why = NoRegionsHere(); !why.empty()) GTEST_SKIP() << "skipped: " << why

// 2 servers, segment "s" (50 -> 16 -> 10), Adam, one worker, staleness 0.
std::string Job(const std::string& dir, bool shared_memory) {
  const std::string path = dir + "/job.pbtxt";
  WriteFile(path, absl::StrFormat(R"pb(
    cluster { num_servers: 2 shared_memory: %s }
    model {
      input_width: 50
      num_classes: 10
      segments { name: "s" layers { units: 16 activation: RELU } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { kind: ADAM }
    training { batch_size: 32 epochs: 2 staleness: 0 log_interval_s: 0.000001 }
    data { source: SYNTHETIC_TEACHER test_samples: 200 train_samples: 2000 }
  )pb", shared_memory ? "true" : "false"));
  return path;
}

// Bytes the servers' stats count as moved through shared regions.
uint64_t RegionBytes(const v1::JobConfig& config, const std::vector<std::string>& addresses) {
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ConnectGrpc(config, addresses);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return 0;
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = (*client)->Stats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  uint64_t bytes = 0;
  if (stats.ok()) {
    for (const v1::StatsResponse& s : *stats) bytes += s.segments(0).region_bytes();
  }
  return bytes;
}

struct Trained {
  std::string parameters, worker_output;
  uint64_t region_bytes = 0;
};

Trained Train(bool shared_memory) {
  const std::string dir = MakeTempDir();
  const std::string path = Job(dir, shared_memory);
  ProcessCluster cluster(path, dir, 2, /*checkpoints=*/false);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  Trained trained;
  trained.worker_output = worker->output();
  absl::StatusOr<v1::JobConfig> config = LoadConfig(path);
  EXPECT_TRUE(config.ok()) << config.status();
  if (config.ok()) trained.region_bytes = RegionBytes(*config, cluster.addresses());
  trained.parameters = cluster.Parameters("s");
  return trained;
}

TEST(SharedMemory, TrainingThroughTheRegionEqualsTrainingOverTcp) {
  SKIP_WITHOUT_REGIONS();
  const Trained shared = Train(true);
  const Trained tcp = Train(false);
  EXPECT_NE(shared.worker_output.find("tensors through shared memory"), std::string::npos) << shared.worker_output;
  EXPECT_EQ(tcp.worker_output.find("tensors through shared memory"), std::string::npos) << tcp.worker_output;
  // 2 epochs of 63 steps, each pushing and pulling the segment's 986
  // parameters (float32) through the region.
  std::cout << "bytes through the shared regions: " << shared.region_bytes << " (TCP run: " << tcp.region_bytes
            << "); parameters " << shared.parameters.size() << " bytes, equal: " << (shared.parameters == tcp.parameters)
            << std::endl;
  EXPECT_GE(shared.region_bytes, 2u * 2 * 63 * 986 * 4);
  EXPECT_EQ(tcp.region_bytes, 0u);
  ASSERT_FALSE(shared.parameters.empty());
  EXPECT_TRUE(shared.parameters == tcp.parameters) << "the parameters differ";
}

// A server killed and started again three times: each recovery leaves the
// worker's blocks of the requests it sent again out of use, so the
// registration after one starts on a fresh region (a large segment's
// region would otherwise fill after two recoveries), and the last server
// still gets its tensors through shared memory.
TEST(SharedMemory, AServerKilledAgainAndAgainStillTakesTheTensorsThroughARegion) {
  SKIP_WITHOUT_REGIONS();
  const std::string dir = MakeTempDir();
  std::string job = ReadFile(Job(dir, true));
  job.replace(job.find("epochs: 2"), 9, "epochs: 6");
  job += "checkpoint { every_clocks: 10 }\n";
  WriteFile(dir + "/job.pbtxt", job);
  ProcessCluster cluster(dir + "/job.pbtxt", dir, 2);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  for (int kill = 0; kill < 3; ++kill) {
    const std::string step = absl::StrCat(" step ", 60 + 80 * kill, "/378 ");
    ASSERT_TRUE(worker->WaitForLine(step, absl::Seconds(120)).has_value()) << step << worker->output();
    ASSERT_TRUE(cluster.WaitForFirstCheckpoint(1)) << cluster.Output();
    cluster.KillServer(1);
    ASSERT_TRUE(cluster.StartServer(1)) << cluster.Output();
    ASSERT_TRUE(worker->WaitForLine("rejoined at clock", absl::Seconds(120)).has_value()) << worker->output();
  }
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  EXPECT_NE(worker->output().find("a fresh shared region replaces"), std::string::npos) << worker->output();
  absl::StatusOr<v1::JobConfig> config = LoadConfig(dir + "/job.pbtxt");
  ASSERT_TRUE(config.ok());
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ConnectGrpc(*config, cluster.addresses());
  ASSERT_TRUE(client.ok());
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  // Server 1 as last started: its share of the steps after the last kill.
  EXPECT_GT((*stats)[1].segments(0).region_bytes(), 0u) << worker->output();
}

// One server of a 1-server job with segment "s" (4 -> 3, SGD at rate 1;
// 3 ranks, of which the tests register what they need), driven by hand
// over gRPC.
class RegionHandOver : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_REGIONS();
    dir_ = MakeTempDir();
    WriteFile(dir_ + "/job.pbtxt", R"pb(
      cluster { num_servers: 1 }
      model { input_width: 4 num_classes: 3 segments { name: "s" layers { units: 3 activation: SOFTMAX } } }
      optimizer { kind: SGD learning_rate: 1 }
      training { staleness: 0 workers_per_segment: 3 }
      data { source: SYNTHETIC_SEED train_samples: 8 test_samples: 8 }
    )pb");
    absl::StatusOr<v1::JobConfig> config = LoadConfig(dir_ + "/job.pbtxt");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    servers_ = StartServers(dir_ + "/job.pbtxt", 1);
    ASSERT_TRUE(servers_.ok()) << servers_.Output();
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(servers_.addresses[0], grpc::InsecureChannelCredentials()));
  }

  // Registers `rank` from `host`.
  v1::RegisterResponse Register(const std::string& host, uint32_t rank = 0) {
    absl::StatusOr<ShardMap> map = ShardMap::Create(config_.model(), 1);
    v1::RegisterRequest request;
    request.set_rank(rank);
    request.set_model_fingerprint(ModelFingerprint(config_));
    request.set_shard_fingerprint(map->fingerprint());
    request.set_host(host);
    v1::RegisterResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->Register(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }
  // The segment's 15 values, read as an observer.
  std::vector<float> Values() {
    v1::PullRequest request;
    request.set_reader(true);
    v1::PullResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->Pull(&context, request, &response).ok());
    std::vector<float> values(response.values().count());
    DecodeFloat32(response.values(), absl::MakeSpan(values));
    return values;
  }
  // A push of the whole segment by `r`, its gradient at `region_offset`.
  grpc::Status PushFromRegion(const v1::RegisterResponse& r, uint64_t region_offset,
                              std::optional<uint64_t> reply_offset, v1::PushResponse* response) {
    v1::PushRequest request;
    request.set_worker_id(r.worker_id());
    request.set_registration_secret(r.registration_secret());
    request.set_clock(r.start_clock());
    request.mutable_gradient()->set_count(15);
    request.mutable_gradient()->set_dtype(v1::FLOAT32);
    request.mutable_gradient()->set_region_offset(region_offset);
    if (reply_offset.has_value()) {
      request.set_pull(true);
      request.set_reply_region_offset(*reply_offset);
    }
    grpc::ClientContext context;
    return stub_->Push(&context, request, response);
  }

  std::string dir_;
  v1::JobConfig config_;
  ServerProcesses servers_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

TEST_F(RegionHandOver, TheServerReadsTheGradientAndWritesTheValuesWhereAsked) {
  const v1::RegisterResponse r = Register(SameHostIdentity());
  ASSERT_FALSE(r.region_socket().empty());
  std::shared_ptr<RegionArena> arena = RegionArena::Create(1 << 20);
  ASSERT_NE(arena, nullptr);
  ASSERT_TRUE(arena->Offer(r.region_socket(), r.worker_id(), r.registration_secret(), absl::Seconds(5)).ok());
  const std::vector<float> before = Values();
  std::shared_ptr<char> gradient = arena->Allocate(15 * 4), reply = arena->Allocate(15 * 4);
  std::vector<float> g(15);
  for (int i = 0; i < 15; ++i) g[i] = 0.5f * static_cast<float>(i % 3) - 0.5f;
  std::memcpy(gradient.get(), g.data(), 15 * 4);
  v1::PushResponse response;
  const grpc::Status pushed = PushFromRegion(r, *arena->OffsetOf(gradient.get()), *arena->OffsetOf(reply.get()),
                                             &response);
  ASSERT_TRUE(pushed.ok()) << pushed.error_message();
  EXPECT_TRUE(response.applied());
  EXPECT_TRUE(response.values().data().empty());
  EXPECT_EQ(response.values().region_offset(), *arena->OffsetOf(reply.get()));
  std::vector<float> landed(15), expected(15);
  std::memcpy(landed.data(), reply.get(), 15 * 4);
  for (int i = 0; i < 15; ++i) expected[i] = before[i] - g[i];  // SGD, rate 1
  EXPECT_EQ(landed, expected);
  EXPECT_EQ(Values(), expected);
}

TEST_F(RegionHandOver, BadOffsetsAreRefusedAndChangeNothing) {
  const v1::RegisterResponse r = Register(SameHostIdentity());
  std::shared_ptr<RegionArena> arena = RegionArena::Create(1 << 20);
  ASSERT_NE(arena, nullptr);
  // Before the hand-over: no region to read from.
  v1::PushResponse response;
  grpc::Status refused = PushFromRegion(r, 0, std::nullopt, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("handed over no shared region"), std::string::npos)
      << refused.error_message();
  ASSERT_TRUE(arena->Offer(r.region_socket(), r.worker_id(), r.registration_secret(), absl::Seconds(5)).ok());
  const std::vector<float> before = Values();
  // The gradient's last bytes beyond the region's end.
  refused = PushFromRegion(r, arena->size() - 4, std::nullopt, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("do not lie within the shared region"), std::string::npos)
      << refused.error_message();
  // The reply's place beyond it, and an offset past 2^64 - 60 that wraps.
  refused = PushFromRegion(r, 0, arena->size() - 8, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  refused = PushFromRegion(r, UINT64_MAX - 7, std::nullopt, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  v1::PullRequest pull;
  pull.set_worker_id(r.worker_id());
  pull.set_registration_secret(r.registration_secret());
  pull.set_reply_region_offset(arena->size());
  v1::PullResponse pulled;
  grpc::ClientContext context;
  EXPECT_EQ(stub_->Pull(&context, pull, &pulled).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Values(), before);
  // The registration still pushes at its first clock.
  EXPECT_TRUE(PushFromRegion(r, 0, std::nullopt, &response).ok());
  EXPECT_TRUE(response.applied());
}

// Offers `fd` (not taken) for `worker_id` and `secret` on the socket; the reply.
v1::RegionReply OfferRaw(const std::string& socket, uint64_t worker_id, const std::string& secret, int fd) {
  v1::RegionReply reply;
  absl::StatusOr<int> connection = ConnectAbstract(socket, absl::Seconds(5));
  EXPECT_TRUE(connection.ok()) << connection.status();
  if (!connection.ok()) return reply;
  v1::RegionOffer offer;
  offer.set_worker_id(worker_id);
  offer.set_registration_secret(secret);
  EXPECT_TRUE(SendFrame(*connection, offer.SerializeAsString(), fd).ok());
  std::string bytes;
  int none = -1;
  EXPECT_TRUE(ReceiveFrame(*connection, &bytes, &none).ok());
  close(*connection);
  EXPECT_TRUE(reply.ParseFromString(bytes));
  return reply;
}

TEST_F(RegionHandOver, StrangersAreRefused) {
  const v1::RegisterResponse r = Register(SameHostIdentity());
  ASSERT_FALSE(r.region_socket().empty());
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(1 << 16);
  ASSERT_TRUE(region.ok());
  v1::RegionReply reply = OfferRaw(r.region_socket(), r.worker_id(), "not the secret", (*region)->fd());
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find("no registration of worker"), std::string::npos) << reply.error();
  reply = OfferRaw(r.region_socket(), r.worker_id(), r.registration_secret(), -1);
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find("no region's descriptor"), std::string::npos) << reply.error();
  // A memfd without seals: its maker could shrink it under the server.
  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 1 << 16), 0);
  reply = OfferRaw(r.region_socket(), r.worker_id(), r.registration_secret(), unsealed);
  close(unsealed);
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find("not a memfd sealed"), std::string::npos) << reply.error();
  // Larger than the model's regions.
  absl::StatusOr<std::unique_ptr<SharedRegion>> huge = SharedRegion::Create(64 << 20);
  ASSERT_TRUE(huge.ok());
  reply = OfferRaw(r.region_socket(), r.worker_id(), r.registration_secret(), (*huge)->fd());
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find("more than the"), std::string::npos) << reply.error();
  // None of these gave the registration a region.
  v1::PushResponse response;
  EXPECT_EQ(PushFromRegion(r, 0, std::nullopt, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RegionHandOver, AnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "skipped: needs root to act as another user";
  const v1::RegisterResponse r = Register(SameHostIdentity());
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(1 << 16);
  ASSERT_TRUE(region.ok());
  // The frame, made before the fork: the child only makes system calls.
  v1::RegionOffer offer;
  offer.set_worker_id(r.worker_id());
  offer.set_registration_secret(r.registration_secret());
  std::string frame(4, '\0');
  const uint32_t length = static_cast<uint32_t>(offer.ByteSizeLong());
  std::memcpy(frame.data(), &length, 4);
  frame += offer.SerializeAsString();
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, r.region_socket().data(), r.region_socket().size());
  const socklen_t address_length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + r.region_socket().size());
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const int fd = (*region)->fd();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(out[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    const int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || connect(s, reinterpret_cast<const sockaddr*>(&address), address_length) != 0) _exit(4);
    if (!SendFramed(s, frame, fd).ok()) _exit(5);
    char answer[512];
    ssize_t got = 0;
    while ((got = read(s, answer, sizeof(answer))) > 0) {
      if (write(out[1], answer, static_cast<size_t>(got)) != got) _exit(6);
    }
    _exit(0);
  }
  close(out[1]);
  std::string answer;
  char buffer[512];
  ssize_t got = 0;
  while ((got = read(out[0], buffer, sizeof(buffer))) > 0) answer.append(buffer, static_cast<size_t>(got));
  close(out[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_GE(answer.size(), 4u);
  v1::RegionReply reply;
  ASSERT_TRUE(reply.ParseFromString(answer.substr(4)));
  EXPECT_FALSE(reply.accepted());
  EXPECT_NE(reply.error().find("runs as user 65534"), std::string::npos) << reply.error();
  v1::PushResponse response;
  EXPECT_EQ(PushFromRegion(r, 0, std::nullopt, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RegionHandOver, AnotherHostIsOfferedNoRegion) {
  // Another kernel boot, or another network namespace on this one (a container).
  EXPECT_TRUE(Register("00000000-0000-0000-0000-000000000000 net:[1]", 0).region_socket().empty());
  EXPECT_TRUE(Register("", 1).region_socket().empty());
  EXPECT_FALSE(Register(SameHostIdentity(), 2).region_socket().empty());
}

TEST(SharedMemoryOff, TheServerOffersNoRegion) {
  const std::string dir = MakeTempDir();
  ServerProcesses servers = StartServers(Job(dir, false), 2);
  ASSERT_TRUE(servers.ok()) << servers.Output();
  absl::StatusOr<v1::JobConfig> config = LoadConfig(dir + "/job.pbtxt");
  ASSERT_TRUE(config.ok());
  absl::StatusOr<ShardMap> map = ShardMap::Create(config->model(), 2);
  auto stub = v1::ParameterServer::NewStub(grpc::CreateChannel(servers.addresses[0], grpc::InsecureChannelCredentials()));
  v1::RegisterRequest request;
  request.set_model_fingerprint(ModelFingerprint(*config));
  request.set_shard_fingerprint(map->fingerprint());
  request.set_host(SameHostIdentity());
  v1::RegisterResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Register(&context, request, &response).ok());
  EXPECT_TRUE(response.region_socket().empty());
}

}  // namespace
}  // namespace segps
