// Two segps-server processes on free loopback ports, driven over real gRPC
// by a test client: register, pull, push, staleness, bad input, shutdown.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <cstdlib>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/shard_map.h"
#include "common/sync.h"
#include "common/tensor_wire_grpc.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

const char kConfig[] = R"pb(
# max_waiting_calls: one registration parks 300 pulls below (a worker parks a few).
cluster {
  num_servers: 2 lease_ms: 60000 max_message_bytes: 1048576 max_waiting_calls: 1000
  max_streams_per_connection: 4 rpc_deadline_ms: 2000
}
model {
  input_width: 50
  num_classes: 10
  segments { name: "s" layers { units: 64 activation: RELU } layers { units: 10 activation: SOFTMAX } }
}
optimizer { kind: SGD learning_rate: 1 }
training { staleness: 0 workers_per_segment: 2 }
data { source: SYNTHETIC_SEED }
)pb";

class ServerProcessTest : public ::testing::Test {
 protected:
  virtual std::string Config() const { return kConfig; }
  // The fixture's config with `from` replaced by `to`.
  static std::string ConfigWith(const std::string& from, const std::string& to) {
    std::string config = kConfig;
    config.replace(config.find(from), from.size(), to);
    return config;
  }
  void SetUp() override {
    dir_ = MakeTempDir();
    config_path_ = dir_ + "/job.pbtxt";
    WriteFile(config_path_, Config());
    config_ = *LoadConfig(config_path_);
    map_ = std::make_unique<ShardMap>(*ShardMap::Create(config_.model(), 2));
    ServerProcesses started = StartServers(config_path_, 2);
    ASSERT_TRUE(started.ok()) << started.Output();
    servers_ = std::move(started.processes);
    servers_addresses_ = started.addresses;
    for (const std::string& address : started.addresses) {
      grpc::ChannelArguments args;
      args.SetMaxSendMessageSize(64 << 20);
      auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
      stubs_.push_back(v1::ParameterServer::NewStub(channel));
      raw_stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
    }
  }

  grpc::Status Call(int server, const v1::RegisterRequest& req, v1::RegisterResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stubs_[server]->Register(&ctx, req, resp);
  }
  grpc::Status Call(int server, const v1::PushRequest& req, v1::PushResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stubs_[server]->Push(&ctx, req, resp);
  }
  grpc::Status Call(int server, const v1::PullRequest& req, v1::PullResponse* resp,
                    std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    return stubs_[server]->Pull(&ctx, req, resp);
  }

  uint64_t Register(int server, uint32_t rank) {
    v1::RegisterRequest req;
    req.set_segment(0);
    req.set_rank(rank);
    req.set_model_fingerprint(ModelFingerprint(config_));
    req.set_shard_fingerprint(map_->fingerprint());
    v1::RegisterResponse resp;
    grpc::Status status = Call(server, req, &resp);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(resp.offset(), map_->range(0, server).offset);
    secrets_[{server, resp.worker_id()}] = resp.registration_secret();
    // A worker pulls before its first step: at staleness 0, peers' pushes
    // of its start clock wait for that (they must not be in its step).
    v1::PullRequest pull;
    pull.set_segment(0);
    pull.set_worker_id(resp.worker_id());
    pull.set_registration_secret(resp.registration_secret());
    pull.set_clock(resp.start_clock());
    v1::PullResponse pulled;
    status = Call(server, pull, &pulled);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return resp.worker_id();
  }

  v1::PushRequest Push(int server, uint64_t worker, uint64_t clock, float value) {
    const Range r = map_->range(0, server);
    v1::PushRequest req;
    req.set_segment(0);
    req.set_worker_id(worker);
    req.set_registration_secret(Secret(server, worker));
    req.set_clock(clock);
    EncodeFloat32(std::vector<float>(r.count, value), r.offset, req.mutable_gradient());
    return req;
  }

  std::vector<float> Read(int server) {
    v1::PullRequest req;
    req.set_segment(0);
    req.set_reader(true);
    v1::PullResponse resp;
    EXPECT_TRUE(Call(server, req, &resp).ok());
    std::vector<float> v(resp.values().count());
    DecodeFloat32(resp.values(), absl::MakeSpan(v));
    return v;
  }

  std::string dir_, config_path_;
  v1::JobConfig config_;
  std::unique_ptr<ShardMap> map_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
  std::vector<std::string> servers_addresses_;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> raw_stubs_;
  std::map<std::pair<int, uint64_t>, std::string> secrets_;  // (server, worker id) -> registration secret
  std::string Secret(int server, uint64_t worker) {
    auto it = secrets_.find({server, worker});
    return it == secrets_.end() ? std::string() : it->second;
  }  // for bytes the generated stub cannot send
};

TEST_F(ServerProcessTest, ServesTheSameModelAsASingleProcessInitialisation) {
  std::vector<float> whole(map_->segment_size(0));
  InitializeRange(*ShardMap::Create(config_.model(), 1), 0, 0, config_.seed(), whole.data(), whole.size());
  std::vector<float> stitched = Read(0), second = Read(1);
  stitched.insert(stitched.end(), second.begin(), second.end());
  EXPECT_EQ(stitched, whole);
}

TEST_F(ServerProcessTest, StalenessPushesAndBadInput) {
  const uint64_t a0 = Register(0, 0), a1 = Register(1, 0);
  const uint64_t b0 = Register(0, 1);
  Register(1, 1);  // B on server 1 too (else its place at clock 0 holds A's push there for a lease)
  const std::vector<float> before = Read(0);
  v1::PushResponse presp;
  ASSERT_TRUE(Call(0, Push(0, a0, 0, 1.0f), &presp).ok());
  ASSERT_TRUE(Call(1, Push(1, a1, 0, 1.0f), &presp).ok());

  // Staleness 0: A's pull for clock 1 on server 0 waits for B's push of clock 0.
  v1::PullRequest pull;
  pull.set_segment(0);
  pull.set_worker_id(a0);
  pull.set_registration_secret(Secret(0, a0));
  pull.set_clock(1);
  v1::PullResponse presp_pull;
  grpc::Status blocked = Call(0, pull, &presp_pull, std::chrono::milliseconds(300));
  EXPECT_TRUE(blocked.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
              blocked.error_code() == grpc::StatusCode::UNAVAILABLE)
      << blocked.error_message();
  ASSERT_TRUE(Call(0, Push(0, b0, 0, 2.0f), &presp).ok());
  ASSERT_TRUE(Call(0, pull, &presp_pull).ok());
  EXPECT_EQ(presp_pull.clock(), 1u);
  std::vector<float> after(presp_pull.values().count());
  DecodeFloat32(presp_pull.values(), absl::MakeSpan(after));
  EXPECT_FLOAT_EQ(after[0], before[0] - 3.0f);  // both updates, SGD lr 1

  // A retried push is acknowledged, not applied again.
  ASSERT_TRUE(Call(0, Push(0, a0, 0, 1.0f), &presp).ok());
  EXPECT_FALSE(presp.applied());

  // Bad input: each rejected with its code; nothing changes; the server keeps serving.
  const std::vector<float> snapshot = Read(0);
  v1::PushRequest nan = Push(0, a0, 1, NAN);
  EXPECT_EQ(Call(0, nan, &presp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::PushRequest wrong_shape = Push(1, a0, 1, 1.0f);  // server 1's range sent to server 0
  wrong_shape.set_registration_secret(Secret(0, a0));
  EXPECT_EQ(Call(0, wrong_shape, &presp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::PushRequest unknown = Push(0, 12345, 1, 1.0f);
  EXPECT_EQ(Call(0, unknown, &presp).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::PushRequest skip = Push(0, a0, 5, 1.0f);
  EXPECT_EQ(Call(0, skip, &presp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::PushRequest huge = Push(0, a0, 1, 1.0f);
  huge.mutable_gradient()->mutable_data()->resize(2 << 20);  // over max_message_bytes
  EXPECT_EQ(Call(0, huge, &presp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  for (const std::string& bytes : {std::string("\x22\xff\xff\xff\x0f", 5), std::string("\xff", 1)}) {
    // Not a message at all: a length running past the end, a bare bad tag.
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), reply;
    grpc::ClientContext ctx;
    grpc::Status status;
    Latch done(1);
    raw_stubs_[0]->UnaryCall(&ctx, kPushMethod, {}, &request, &reply, [&](grpc::Status s) {
      status = s;
      done.CountDown();
    });
    done.Wait();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("malformed message"), std::string::npos) << status.error_message();
  }
  v1::RegisterRequest stranger;
  stranger.set_model_fingerprint("0000000000000000");
  stranger.set_shard_fingerprint(map_->fingerprint());
  v1::RegisterResponse rresp;
  grpc::Status refused = Call(0, stranger, &rresp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("model fingerprint 0000000000000000 does not match this server's"),
            std::string::npos)
      << refused.error_message();
  EXPECT_EQ(refused.error_message().find(ModelFingerprint(config_)), std::string::npos) << refused.error_message();
  EXPECT_EQ(Read(0), snapshot);
  ASSERT_TRUE(Call(0, Push(0, a0, 1, 1.0f), &presp).ok());
  EXPECT_TRUE(presp.applied());

  grpc::ClientContext ctx;
  v1::StatsResponse stats;
  ASSERT_TRUE(stubs_[0]->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.segments(0).pushes(), 3u);
  EXPECT_GE(stats.segments(0).rejected(), 5u);
}

// Threads of a process, from /proc.
int Threads(pid_t pid) {
  const std::string status = ReadFile(absl::StrCat("/proc/", pid, "/status"));
  const size_t at = status.find("Threads:");
  return at == std::string::npos ? -1 : std::atoi(status.c_str() + at + 8);
}

// A server that gives each call a minute to send its request and to wait:
// under ThreadSanitizer, reading 300 calls that arrive at once has taken a
// server over two seconds (the fixture's rpc_deadline_ms).
class ParkingServerProcessTest : public ServerProcessTest {
 protected:
  std::string Config() const override {
    return ConfigWith("rpc_deadline_ms: 2000", "rpc_deadline_ms: 60000 pull_wait_ms: 60000");
  }
};

// Pulls behind the staleness bound park in the server without a thread
// each: 300 of them wait at once while the server's threads stay within
// gRPC's own and its ticker, and the push that completes the clock
// answers every one with the values of both workers' steps.
TEST_F(ParkingServerProcessTest, WaitingPullsHoldNoThreadAndOnePushReleasesThemAll) {
  constexpr int kPulls = 300;
  const uint64_t a = Register(0, 0), b = Register(0, 1);
  v1::PushResponse pushed;
  ASSERT_TRUE(Call(0, Push(0, a, 0, 1.0f), &pushed).ok());
  const int threads_before = Threads(servers_[0]->pid());
  // The callback API: gRPC's own threads carry the calls, so none waits
  // for this thread to poll a completion queue before its request is sent.
  struct Waiting {
    grpc::ClientContext context;
    v1::PullResponse response;
    grpc::Status status;
  };
  std::vector<Waiting> pulls(kPulls);
  Latch answered(kPulls);
  v1::PullRequest pull;
  pull.set_segment(0);
  pull.set_worker_id(a);
  pull.set_registration_secret(Secret(0, a));
  pull.set_clock(1);
  for (Waiting& waiting : pulls) {
    waiting.context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stubs_[0]->async()->Pull(&waiting.context, &pull, &waiting.response, [&waiting, &answered](grpc::Status status) {
      waiting.status = std::move(status);
      answered.CountDown();
    });
  }
  // However the test ends, no call outlives what it writes to.
  absl::Cleanup all_answered = [&answered] { answered.Wait(); };
  // The server says when all of them are parked.
  v1::StatsResponse stats;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  do {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stubs_[0]->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  } while (stats.waiting_calls() < kPulls && absl::Now() < give_up);
  ASSERT_EQ(stats.waiting_calls(), static_cast<uint32_t>(kPulls)) << "the first pull: " << [&] {
    answered.Wait();  // they end at the server's wait limit
    return pulls.front().status.error_message();
  }();
  const int threads_waiting = Threads(servers_[0]->pid());
  EXPECT_LE(threads_waiting, threads_before + 4) << "threads grew with the waiting calls";
  // gRPC's pollers and executor (where each call's first-request alarm
  // runs), the handler pool and the ticker: 16 here on 2 cores, with 300
  // waiting pulls or 1000.
  EXPECT_LE(threads_waiting, 4 * static_cast<int>(std::thread::hardware_concurrency()) + 12);

  const float before = Read(0)[0];
  ASSERT_TRUE(Call(0, Push(0, b, 0, 2.0f), &pushed).ok());
  answered.Wait();
  for (const Waiting& done : pulls) {
    ASSERT_TRUE(done.status.ok()) << done.status.error_message();
    EXPECT_EQ(done.response.clock(), 1u);
    std::vector<float> values(done.response.values().count());
    DecodeFloat32(done.response.values(), absl::MakeSpan(values));
    EXPECT_FLOAT_EQ(values[0], before - 2.0f);
  }
  grpc::ClientContext ctx;
  ASSERT_TRUE(stubs_[0]->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.waiting_calls(), 0u);
}

// Bytes that are no message of the method's type are the client's mistake:
// INVALID_ARGUMENT naming the method, on every unary method, and the server
// keeps serving.
TEST_F(ServerProcessTest, UnparseableRequestsGetInvalidArgumentNamingTheMethod) {
  for (const char* method : {"Register", "Pull", "Push", "Heartbeat", "Leave", "Stats", "Rollback"}) {
    for (const std::string& bytes : {std::string("\x22\xff\xff\xff\x0f", 5), std::string("\xff", 1)}) {
      grpc::Slice slice(bytes);
      grpc::ByteBuffer request(&slice, 1), reply;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      grpc::Status status;
      Latch done(1);
      raw_stubs_[0]->UnaryCall(&ctx, absl::StrCat("/segps.v1.ParameterServer/", method), {}, &request, &reply,
                               [&](grpc::Status s) {
                                 status = s;
                                 done.CountDown();
                               });
      done.Wait();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << status.error_message();
      EXPECT_NE(status.error_message().find(method), std::string::npos) << status.error_message();
    }
  }
  // A string field that is not UTF-8 does not parse either, and leaves nothing in the server's log.
  v1::RegisterRequest reg;
  reg.set_segment(0);
  reg.set_shard_fingerprint(map_->fingerprint());
  std::string bytes = reg.SerializeAsString() + std::string("\x1a\x02\xff\xfe", 4);  // model_fingerprint
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), reply;
  grpc::ClientContext ctx;
  grpc::Status status;
  Latch done(1);
  raw_stubs_[0]->UnaryCall(&ctx, "/segps.v1.ParameterServer/Register", {}, &request, &reply, [&](grpc::Status s) {
    status = s;
    done.CountDown();
  });
  done.Wait();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_FALSE(servers_[0]->WaitForLine("UTF-8", absl::Milliseconds(300)).has_value()) << servers_[0]->output();
  EXPECT_EQ(Read(0).size(), map_->range(0, 0).count);
}

TEST_F(ServerProcessTest, PushStreamAnswersInOrderAndEndsAtTheFirstBadPush) {
  const uint64_t a0 = Register(0, 0);
  Register(0, 1);  // its peer, started (else its place at clock 0 holds a0's first push for a lease)
  const std::vector<float> before = Read(0);
  v1::PushResponse reply;
  // Writes worker a0's push of `clock` and checks its answer.
  auto push = [&](auto& stream, uint64_t clock, bool applied, uint64_t next_clock) {
    ASSERT_TRUE(stream->Write(Push(0, a0, clock, 1.0f)));
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.applied(), applied) << "clock " << clock;
    EXPECT_EQ(reply.next_clock(), next_clock) << "clock " << clock;
  };
  {
    grpc::ClientContext ctx;
    auto stream = stubs_[0]->PushStream(&ctx);
    push(stream, 0, true, 1);
    push(stream, 0, false, 1);  // a resend: acknowledged, not applied again
    EXPECT_FLOAT_EQ(Read(0)[0], before[0] - 1.0f);

    // The bad push ends the stream with its own status; the one behind it is never read.
    const std::vector<float> snapshot = Read(0);
    stream->Write(Push(0, a0, 1, NAN));
    stream->Write(Push(0, a0, 1, 1.0f));
    EXPECT_FALSE(stream->Read(&reply));
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find("gradients must be finite"), std::string::npos) << status.error_message();
    EXPECT_EQ(Read(0), snapshot);
  }
  // A new stream goes on from there.
  grpc::ClientContext ctx;
  auto stream = stubs_[0]->PushStream(&ctx);
  push(stream, 1, true, 2);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
}

// Calls that send their headers and no request: a unary Pull, a PullStream
// and a health check silent past cluster.rpc_deadline_ms (2 s here) end with
// DEADLINE_EXCEEDED, not before; a unary call closed without its request
// gets INVALID_ARGUMENT at once; calls meanwhile are answered.
TEST_F(ServerProcessTest, CallsThatSendNoRequestEndAtTheirDeadline) {
  grpc::CompletionQueue cq;
  struct Silent {
    grpc::ClientContext context;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> io;
    grpc::Status status;
  };
  Silent calls[4];
  const char* methods[4] = {"/segps.v1.ParameterServer/Pull", kPullStreamMethod, "/grpc.health.v1.Health/Check",
                            "/segps.v1.ParameterServer/Stats"};
  const absl::Time start = absl::Now();
  for (int i = 0; i < 4; ++i) {
    calls[i].io = raw_stubs_[0]->PrepareCall(&calls[i].context, methods[i], &cq);
    calls[i].io->StartCall(&methods[i]);
    if (i == 3) {  // closed without a request, once started
      void* tag = nullptr;
      bool ok = false;
      while (tag != &methods[i]) ASSERT_TRUE(cq.Next(&tag, &ok));  // the others' starts, then its own
      calls[i].io->WritesDone(&methods[i]);
    }
    calls[i].io->Finish(&calls[i].status, &calls[i]);
  }
  // The server holds the silent calls from their headers (it may take a
  // moment to see them): the stream, the Pull, the health check and each
  // Stats (the closed call until it is answered).
  v1::StatsResponse stats;
  do {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stubs_[0]->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  } while ((stats.open_streams() < 1 || stats.open_unary_calls() < 3) && absl::Now() < start + absl::Seconds(1));
  EXPECT_EQ(stats.open_streams(), 1u);
  EXPECT_GE(stats.open_unary_calls(), 3u);
  EXPECT_LE(stats.open_unary_calls(), 4u);
  absl::Time ended[4];
  for (int finished = 0; finished < 4;) {
    void* tag = nullptr;
    bool ok = false;
    ASSERT_EQ(cq.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + absl::Seconds(30))),
              grpc::CompletionQueue::GOT_EVENT);
    for (int i = 0; i < 4; ++i) {
      if (tag == &calls[i]) ended[i] = absl::Now(), ++finished;
    }
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(calls[i].status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << methods[i];
    EXPECT_THAT(calls[i].status.error_message(), testing::HasSubstr("no request within cluster.rpc_deadline_ms"));
    EXPECT_GE(ended[i] - start, absl::Seconds(2)) << methods[i] << " ended before its deadline";
  }
  EXPECT_EQ(calls[3].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(calls[3].status.error_message(), "Stats: the call ended without its request");
  EXPECT_LT(ended[3] - start, absl::Seconds(2));
}

// The standard health service answers SERVING for this server's service
// (or none named) without a token, and NOT_FOUND for any other.
TEST_F(ServerProcessTest, HealthChecksAnswerForThisServerOnly) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(servers_addresses_[0], grpc::InsecureChannelCredentials()));
  for (const std::string service : {"", "segps.v1.ParameterServer", "segps.v1.Other"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = health->Check(&ctx, request, &response);
    if (service == "segps.v1.Other") {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
    } else {
      ASSERT_TRUE(status.ok()) << service << ": " << status.error_message();
      EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
    }
  }
}

TEST_F(ServerProcessTest, StreamsBeyondAConnectionsLimitAreRefusedWithResourceExhausted) {
  v1::PullRequest read;
  read.set_segment(0);
  read.set_reader(true);
  v1::PullResponse reply;
  using Stream = std::unique_ptr<grpc::ClientReaderWriter<v1::PullRequest, v1::PullResponse>>;
  // Opens a PullStream on `stub` and reads once through it: OK, or the status that ended it.
  auto open = [&](v1::ParameterServer::Stub& stub, grpc::ClientContext* ctx, Stream* stream) {
    *stream = stub.PullStream(ctx);
    if ((*stream)->Write(read) && (*stream)->Read(&reply)) return grpc::Status::OK;
    return (*stream)->Finish();
  };
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<Stream> streams(5);
  for (int i = 0; i < 5; ++i) contexts.push_back(std::make_unique<grpc::ClientContext>());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(open(*stubs_[0], contexts[i].get(), &streams[i]).ok()) << "stream " << i;
  const grpc::Status refused = open(*stubs_[0], contexts[4].get(), &streams[4]);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("PullStream: this connection already holds 4 open streams "
                                         "(cluster.max_streams_per_connection)"),
            std::string::npos)
      << refused.error_message();
  // The limit is the connection's: another connection opens its own.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto other = v1::ParameterServer::NewStub(
      grpc::CreateCustomChannel(servers_addresses_[0], grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext other_ctx;
  Stream other_stream;
  EXPECT_TRUE(open(*other, &other_ctx, &other_stream).ok());
  // A stream that ends frees its place.
  ASSERT_TRUE(streams[0]->WritesDone());
  ASSERT_TRUE(streams[0]->Finish().ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  v1::StatsResponse stats;
  do {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stubs_[0]->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  } while (stats.open_streams() != 4 && absl::Now() < give_up);
  ASSERT_EQ(stats.open_streams(), 4u);  // three here, one on the other connection
  grpc::ClientContext again_ctx;
  Stream again;
  EXPECT_TRUE(open(*stubs_[0], &again_ctx, &again).ok());
  for (auto* ctx : {contexts[1].get(), contexts[2].get(), contexts[3].get(), &other_ctx, &again_ctx}) ctx->TryCancel();
  for (Stream* stream : {&streams[1], &streams[2], &streams[3], &other_stream, &again}) (*stream)->Finish();
}

TEST_F(ServerProcessTest, PullStreamAnswersEachRequestAndNamesAMalformedOne) {
  v1::PullRequest request;
  request.set_segment(0);
  request.set_reader(true);
  {
    grpc::ClientContext ctx;
    auto stream = stubs_[1]->PullStream(&ctx);
    for (int round = 0; round < 2; ++round) {
      ASSERT_TRUE(stream->Write(request));
      v1::PullResponse reply;
      ASSERT_TRUE(stream->Read(&reply));
      std::vector<float> values(reply.values().count());
      DecodeFloat32(reply.values(), absl::MakeSpan(values));
      EXPECT_EQ(values, Read(1)) << "round " << round;
    }
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_TRUE(stream->Finish().ok());
  }
  // Bytes that are no PullRequest end the stream with a status naming them.
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> raw = raw_stubs_[1]->PrepareCall(&ctx, kPullStreamMethod, &cq);
  auto next = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  raw->StartCall(nullptr);
  ASSERT_TRUE(next());
  grpc::Slice bytes(std::string("\xff", 1));
  raw->Write(grpc::ByteBuffer(&bytes, 1), nullptr);
  next();
  grpc::ByteBuffer reply;
  raw->Read(&reply, nullptr);
  EXPECT_FALSE(next());
  grpc::Status status;
  raw->Finish(&status, nullptr);
  next();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("does not parse as segps.v1.PullRequest"), std::string::npos) << status.error_message();
}

TEST_F(ServerProcessTest, ShutsDownCleanlyOnSigtermAndSigint) {
  servers_[0]->Signal(SIGTERM);
  servers_[1]->Signal(SIGINT);
  for (auto& s : servers_) {
    std::optional<int> status = s->Wait(absl::Seconds(30));
    ASSERT_TRUE(status.has_value()) << "server did not stop";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << s->output();
  }
}

// The same servers applying Adam.
class AdamServerProcessTest : public ServerProcessTest {
 protected:
  std::string Config() const override {
    return ConfigWith("optimizer { kind: SGD learning_rate: 1 }", "optimizer { kind: ADAM }");
  }
};

// 1e20 is finite, but its square is not a float32: applied, it would make
// Adam's second moment infinite and the next ordinary push would turn the
// whole segment into NaN. Refused, naming why, and nothing changes; the
// worker's ordinary pushes go on.
TEST_F(AdamServerProcessTest, AFiniteGradientThatWouldOverflowTheStateIsRefusedAndChangesNothing) {
  const uint64_t a = Register(0, 0), b = Register(0, 1);
  const std::vector<float> before = Read(0);
  v1::PushResponse response;
  const grpc::Status refused = Call(0, Push(0, a, 0, 1e20f), &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("its largest element, 1e+20, could take the squared gradient to 1e+40, "
                                         "beyond float32's range; refused, nothing was applied"),
            std::string::npos)
      << refused.error_message();
  EXPECT_EQ(Read(0), before);
  for (const uint64_t clock : {0, 1}) {
    ASSERT_TRUE(Call(0, Push(0, a, clock, 0.5f), &response).ok()) << "clock " << clock;
    ASSERT_TRUE(Call(0, Push(0, b, clock, 0.5f), &response).ok()) << "clock " << clock;
  }
  const std::vector<float> after = Read(0);
  EXPECT_NE(after, before);
  for (float x : after) ASSERT_TRUE(std::isfinite(x));
}

TEST(ServerFlags, WrongFlagsGetClearErrors) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/job.pbtxt", kConfig);
  WriteFile(dir + "/tokens", "worker 0123456789abcdef0123456789abcdef\n");
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  } cases[] = {
      {{"--config", dir + "/job.pbtxt", "--index", "2"}, "--index must be in [0, 2)"},
      {{"--index", "0"}, "--config is required"},
      {{"--config", dir + "/missing.pbtxt", "--index", "0"}, "cannot be opened"},
      {{"--config", dir + "/job.pbtxt", "--index", "0", "--bogus"}, "Unknown command line flag 'bogus'"},
      {{"--config", dir + "/job.pbtxt", "--index", "0", "--listen", "256.1.1.1:1", "--insecure"}, "cannot listen on"},
      {{"--config", dir + "/job.pbtxt", "--index", "0", "--listen", "0.0.0.0:0"},
       "refusing to serve 0.0.0.0:0 in plaintext"},
      {{"--config", dir + "/job.pbtxt", "--index", "0", "--token_file", dir + "/tokens", "--require_client_cert"},
       "client certificates need TLS"},
      {{"--config", dir + "/job.pbtxt", "--index", "0", "--token_file", dir + "/tokens", "--listen", "0.0.0.0:0",
        "--insecure"},
       "refusing to take tokens on 0.0.0.0:0 without TLS"},
      {{"--config", dir + "/job.pbtxt", "--index", "0", "--tls_cert", dir + "/missing.pem", "--tls_key", dir + "/tokens"},
       "security.cert: " + dir + "/missing.pem: cannot be opened"},
      {{"--config", dir + "/job.pbtxt", "--index", "0", "--apply_threads", "0"}, "--apply_threads must be in [1, 256], got 0"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {BinaryPath("segps-server")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::unique_ptr<Subprocess> p = Subprocess::Start(argv);
    std::optional<int> status = p->Wait(absl::Seconds(30));
    ASSERT_TRUE(status.has_value());
    EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    EXPECT_NE(p->output().find(c.expect), std::string::npos) << p->output();
  }
}

}  // namespace
}  // namespace segps
