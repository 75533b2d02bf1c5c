// The same-host transport (cluster.shared_memory) against real segps-server
// processes: training through the region equals training over TCP bit for
// bit; each fallback; the hand-over refuses strangers (another user, a
// wrong secret, no descriptor, an unsealed one) and bad offsets in the
// region are refused like bad bytes on the wire, changing nothing.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <cmath>
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

// 2 servers, segment "s" (50 -> 16 -> 10), Adam, one worker, staleness 0;
// with `tables`, "s" has two embedding tables (SYNTHETIC_CTR, AdaGrad).
std::string Job(const std::string& dir, bool shared_memory, bool tables = false) {
  const std::string path = dir + "/job.pbtxt";
  const char* dense = R"pb(
    model {
      input_width: 50
      num_classes: 10
      segments { name: "s" layers { units: 16 activation: RELU } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { kind: ADAM }
    data { source: SYNTHETIC_TEACHER test_samples: 200 train_samples: 2000 }
  )pb";
  const char* with_tables = R"pb(
    model {
      input_width: 8
      num_classes: 2
      categorical_fields: 2
      segments {
        name: "s"
        embeddings { name: "user" vocab: 100000 dim: 64 field: 0 }
        embeddings { name: "item" vocab: 5000 dim: 32 field: 1 }
        layers { units: 2 activation: SOFTMAX }
      }
    }
    optimizer { kind: ADAGRAD learning_rate: 0.1 }
    data { source: SYNTHETIC_CTR test_samples: 200 train_samples: 2000 }
  )pb";
  WriteFile(path, absl::StrFormat(R"pb(
    cluster { num_servers: 2 shared_memory: %s }
    training { batch_size: 32 epochs: 2 staleness: 0 log_interval_s: 0.000001 }
    %s
  )pb", shared_memory ? "true" : "false", tables ? with_tables : dense));
  return path;
}

struct Trained {
  std::string parameters, worker_output;
  // Bytes the servers' stats count as moved through shared regions, and
  // as pushed and pulled in all.
  uint64_t region_bytes = 0, moved_bytes = 0;
};

// The servers' byte counts of segment 0 into `trained`.
void CountBytes(const v1::JobConfig& config, const std::vector<std::string>& addresses, Trained* trained) {
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ConnectGrpc(config, addresses);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const v1::StatsResponse& s : *stats) {
    trained->region_bytes += s.segments(0).region_bytes();
    trained->moved_bytes += s.segments(0).push_bytes() + s.segments(0).pull_bytes();
  }
}

Trained Train(bool shared_memory, bool tables = false) {
  const std::string dir = MakeTempDir();
  const std::string path = Job(dir, shared_memory, tables);
  ProcessCluster cluster(path, dir, 2, /*checkpoints=*/false);
  std::unique_ptr<Subprocess> worker = cluster.StartWorker("s", 0);
  std::optional<int> status = worker->Wait(absl::Seconds(120));
  EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  Trained trained;
  trained.worker_output = worker->output();
  absl::StatusOr<v1::JobConfig> config = LoadConfig(path);
  EXPECT_TRUE(config.ok()) << config.status();
  if (config.ok()) CountBytes(*config, cluster.addresses(), &trained);
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

// A segment with embedding tables: each step's rows are pulled into the
// region and their gradients pushed from it, and the job trains as over
// TCP bit for bit. Per step the dense gradient and values take 2 x 840
// bytes, the rows' values (dims 64 and 32, some 28 ids each) about 2 x 10
// KB, their ids (in the messages) under 1 KB: with the rows in the region
// it holds over 90% of the bytes moved, without them under 10%.
TEST(SharedMemory, EmbeddingRowsThroughTheRegionTrainAsOverTcp) {
  SKIP_WITHOUT_REGIONS();
  const Trained shared = Train(true, true);
  const Trained tcp = Train(false, true);
  std::cout << "bytes through the shared regions: " << shared.region_bytes << " of " << shared.moved_bytes
            << " moved (TCP run: " << tcp.region_bytes << " of " << tcp.moved_bytes << ")" << std::endl;
  EXPECT_EQ(shared.moved_bytes, tcp.moved_bytes);
  EXPECT_GT(shared.region_bytes, shared.moved_bytes * 9 / 10);
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
    worker->Signal(SIGSTOP);  // held while the server goes, so that it cannot run past the next kill
    ASSERT_TRUE(cluster.WaitForFirstCheckpoint(1)) << cluster.Output();
    cluster.KillServer(1);
    worker->Signal(SIGCONT);
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
  virtual std::string Config() const {
    return R"pb(
      cluster { num_servers: 1 }
      model { input_width: 4 num_classes: 3 segments { name: "s" layers { units: 3 activation: SOFTMAX } } }
      optimizer { kind: SGD learning_rate: 1 }
      training { staleness: 0 workers_per_segment: 3 }
      data { source: SYNTHETIC_SEED train_samples: 8 test_samples: 8 }
    )pb";
  }
  void SetUp() override {
    SKIP_WITHOUT_REGIONS();
    dir_ = MakeTempDir();
    WriteFile(dir_ + "/job.pbtxt", Config());
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

// The fixture's server with an embedding table "t" (100 rows of 4) before
// segment "s"'s layer (4 + 4 -> 2: 18 values), driven by hand.
class RowsHandOver : public RegionHandOver {
 protected:
  static constexpr int kDim = 4, kDense = 18;
  std::string Config() const override {
    return R"pb(
      cluster { num_servers: 1 }
      model {
        input_width: 4
        num_classes: 2
        categorical_fields: 1
        segments { name: "s" embeddings { name: "t" vocab: 100 dim: 4 field: 0 } layers { units: 2 activation: SOFTMAX } }
      }
      optimizer { kind: SGD learning_rate: 1 }
      training { staleness: 0 workers_per_segment: 3 }
      data { source: SYNTHETIC_CTR train_samples: 8 test_samples: 8 }
    )pb";
  }
  static v1::Rows RowsOf(const std::vector<uint64_t>& ids) {
    v1::Rows rows;
    rows.set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint64_t)));
    return rows;
  }
  // A rows-only pull of `rows` by `r` at its first clock.
  grpc::Status PullRows(const v1::RegisterResponse& r, const v1::Rows& rows, v1::PullResponse* response) {
    v1::PullRequest request;
    request.set_worker_id(r.worker_id());
    request.set_registration_secret(r.registration_secret());
    request.set_clock(r.start_clock());
    request.set_rows_only(true);
    *request.add_rows() = rows;
    grpc::ClientContext context;
    return stub_->Pull(&context, request, response);
  }
  // `r`'s push of its first clock: a zero dense gradient and `rows`.
  grpc::Status PushRows(const v1::RegisterResponse& r, const v1::Rows& rows) {
    v1::PushRequest request;
    request.set_worker_id(r.worker_id());
    request.set_registration_secret(r.registration_secret());
    request.set_clock(r.start_clock());
    EncodeFloat32(std::vector<float>(kDense, 0.0f), 0, request.mutable_gradient());
    *request.add_rows() = rows;
    v1::PushResponse response;
    grpc::ClientContext context;
    return stub_->Push(&context, request, &response);
  }
  // Rows 3 and 7 as the server holds them, read over TCP.
  std::string Rows37(const v1::RegisterResponse& r) {
    v1::PullResponse response;
    const grpc::Status pulled = PullRows(r, RowsOf({3, 7}), &response);
    EXPECT_TRUE(pulled.ok()) << pulled.error_message();
    return response.rows_size() == 1 ? response.rows(0).values() : "";
  }
};

TEST_F(RowsHandOver, TheServerReadsRowGradientsAndWritesRowsWhereAsked) {
  const v1::RegisterResponse r = Register(SameHostIdentity());
  std::shared_ptr<RegionArena> arena = RegionArena::Create(1 << 20);
  ASSERT_NE(arena, nullptr);
  ASSERT_TRUE(arena->Offer(r.region_socket(), r.worker_id(), r.registration_secret(), absl::Seconds(5)).ok());
  const std::string before = Rows37(r);
  ASSERT_EQ(before.size(), 2u * kDim * sizeof(float));
  // Pulled into the region: the same bytes, where asked.
  std::shared_ptr<char> landed = arena->Allocate(before.size());
  v1::Rows asked = RowsOf({3, 7});
  asked.set_values_region_offset(*arena->OffsetOf(landed.get()));
  v1::PullResponse response;
  const grpc::Status pulled = PullRows(r, asked, &response);
  ASSERT_TRUE(pulled.ok()) << pulled.error_message();
  ASSERT_EQ(response.rows_size(), 1);
  EXPECT_TRUE(response.rows(0).values().empty());
  EXPECT_EQ(response.rows(0).values_region_offset(), asked.values_region_offset());
  EXPECT_EQ(std::string(landed.get(), before.size()), before);
  // Row 7's gradient from the region: SGD at rate 1 takes it off row 7 alone.
  std::shared_ptr<char> gradient = arena->Allocate(kDim * sizeof(float));
  const float g[kDim] = {0.5f, -0.25f, 1.0f, 2.0f};
  std::memcpy(gradient.get(), g, sizeof(g));
  v1::Rows pushed = RowsOf({7});
  pushed.set_values_region_offset(*arena->OffsetOf(gradient.get()));
  const grpc::Status applied = PushRows(r, pushed);
  ASSERT_TRUE(applied.ok()) << applied.error_message();
  std::vector<float> expected(2 * kDim);
  std::memcpy(expected.data(), before.data(), before.size());
  for (int i = 0; i < kDim; ++i) expected[kDim + i] -= g[i];
  EXPECT_EQ(Rows37(r), std::string(reinterpret_cast<const char*>(expected.data()), before.size()));
}

TEST_F(RowsHandOver, BadRowPlacesAreRefusedNamingTheFieldAndChangeNothing) {
  const v1::RegisterResponse r = Register(SameHostIdentity());
  std::shared_ptr<RegionArena> arena = RegionArena::Create(1 << 20);
  ASSERT_NE(arena, nullptr);
  auto refused = [&](const v1::Rows& rows, bool push, const std::string& why) {
    v1::PullResponse response;
    const grpc::Status status = push ? PushRows(r, rows) : PullRows(r, rows, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << why;
    EXPECT_NE(status.error_message().find(why), std::string::npos) << status.error_message();
    EXPECT_NE(status.error_message().find(push ? "Push rows of table \"t\"" : "Pull rows of table \"t\""),
              std::string::npos)
        << status.error_message();
  };
  v1::Rows rows = RowsOf({7});
  rows.set_values_region_offset(0);
  refused(rows, true, "values_region_offset is set, but this registration handed over no shared region");
  ASSERT_TRUE(arena->Offer(r.region_socket(), r.worker_id(), r.registration_secret(), absl::Seconds(5)).ok());
  const std::string before = Rows37(r);
  rows.set_values_region_offset(arena->size() - 8);  // 16 bytes, 8 past the end
  refused(rows, true, "do not lie within the shared region");
  refused(rows, false, "do not lie within the shared region");
  rows.set_values_region_offset(UINT64_MAX - 3);
  refused(rows, true, "do not lie within the shared region");
  rows.set_values_region_offset(2);
  refused(rows, true, "values_region_offset 2 is not a multiple of 4");
  rows.set_values_region_offset(0);
  rows.set_values(std::string(kDim * sizeof(float), '\0'));
  refused(rows, true, "both values and values_region_offset are set");
  // A gradient in the region that is not finite, copied out before it is checked.
  std::shared_ptr<char> gradient = arena->Allocate(kDim * sizeof(float));
  const float nan[kDim] = {0, std::nanf(""), 0, 0};
  std::memcpy(gradient.get(), nan, sizeof(nan));
  rows = RowsOf({7});
  rows.set_values_region_offset(*arena->OffsetOf(gradient.get()));
  refused(rows, true, "gradients must be finite");
  EXPECT_EQ(Rows37(r), before);
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
