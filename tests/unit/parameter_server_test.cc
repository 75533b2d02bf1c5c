#include "server/parameter_server.h"
#include "tests/support/registration.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/tensor_wire.h"

namespace segps {
namespace {

const char kConfig[] = R"pb(
cluster { num_servers: 2 }
model {
  input_width: 5
  num_classes: 3
  segments { name: "a" layers { units: 4 activation: TANH } layers { units: 3 activation: SOFTMAX } }
  segments { name: "b" layers { units: 3 activation: SOFTMAX } }
}
optimizer { kind: ADAM }
training { staleness: 0 workers_per_segment: 1 }
data { source: SYNTHETIC_SEED }
)pb";

class ParameterServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = *ParseConfig(kConfig, "test");
    // Time moves when a test moves it: a parked call fails when the test
    // steps the clock past its deadline, not when a real ticker happens to.
    ServerOptions options;
    options.clock = &clock_;
    options.tick = absl::ZeroDuration();
    server_ = *ParameterServer::Create(config_, 1, options);
    v1::RegisterRequest reg = Registration(0, 0);
    v1::RegisterResponse response;
    ASSERT_TRUE(server_->Register(reg, &response).ok());
    worker_ = response.worker_id();
    secret_ = response.registration_secret();
    range_ = server_->shard_map().range(0, 1);
  }

  v1::RegisterRequest Registration(uint32_t segment, uint32_t rank) {
    v1::RegisterRequest r = RegistrationFor(config_, *server_);
    r.set_segment(segment);
    r.set_rank(rank);
    return r;
  }

  v1::PushRequest GoodPush(uint64_t clock = 0) {
    v1::PushRequest p;
    p.set_segment(0);
    p.set_worker_id(worker_);
    p.set_registration_secret(secret_);
    p.set_clock(clock);
    std::vector<float> g(range_.count, 0.5f);
    EncodeFloat32(g, range_.offset, p.mutable_gradient());
    return p;
  }

  // Another server of the same shard with worker (segment 0, rank 0) registered; its id in `worker`.
  std::unique_ptr<ParameterServer> Twin(uint64_t* worker) {
    std::unique_ptr<ParameterServer> twin = *ParameterServer::Create(config_, 1);
    v1::RegisterResponse registered;
    EXPECT_TRUE(twin->Register(Registration(0, 0), &registered).ok());
    *worker = registered.worker_id();
    twin_secret_ = registered.registration_secret();
    return twin;
  }

  // Everything a rejected call must leave alone.
  std::string State() {
    v1::StatsResponse stats;
    server_->Stats(&stats);
    for (auto& s : *stats.mutable_segments()) s.clear_rejected();
    std::string state = stats.SerializeAsString();
    for (int k = 0; k < 2; ++k) {
      std::vector<float> v = server_->shard(k).Snapshot();
      state.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    }
    return state;
  }

  // A push refused at once, or parked (ahead of its predecessor) and failed
  // once the clock passes its deadline: either way with `code` and `words`,
  // changing nothing.
  void ExpectRejected(const v1::PushRequest& push, absl::StatusCode code, const std::string& words) {
    const std::string before = State();
    v1::PushResponse response;
    absl::Status status;
    std::atomic<bool> done{false};
    std::thread call([&] {
      status = server_->Push(push, clock_.Now() + absl::Milliseconds(50), &response);
      done = true;
    });
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done && server_->Waiting() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    if (!done && server_->Waiting() > 0) {
      clock_.Advance(absl::Milliseconds(51));
      server_->Tick();  // fails the parked push: its deadline has passed
    }
    while (!done && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    if (!done) {
      ADD_FAILURE() << "the push neither finished nor failed at its deadline";
      server_->Drain();
    }
    call.join();
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_NE(std::string(status.message()).find(words), std::string::npos) << status.message();
    EXPECT_EQ(before, State()) << "a rejected push changed the server";
  }

  v1::JobConfig config_;
  FakeClock clock_;
  std::unique_ptr<ParameterServer> server_;
  uint64_t worker_ = 0;
  std::string secret_, twin_secret_;  // the registrations' secrets
  Range range_;
};

TEST_F(ParameterServerTest, GoodPushIsAppliedAndPullable) {
  v1::PullRequest pull;
  pull.set_segment(0);
  pull.set_reader(true);
  v1::PullResponse before, after;
  ASSERT_TRUE(server_->Pull(pull, absl::Now(), &before).ok());
  v1::PushResponse response;
  ASSERT_TRUE(server_->Push(GoodPush(), absl::Now() + absl::Seconds(5), &response).ok());
  EXPECT_TRUE(response.applied());
  ASSERT_TRUE(server_->Pull(pull, absl::Now(), &after).ok());
  EXPECT_EQ(after.values().offset(), range_.offset);
  EXPECT_EQ(after.values().count(), range_.count);
  EXPECT_NE(before.values().data(), after.values().data());
  EXPECT_EQ(after.updates(), 1u);
}

TEST_F(ParameterServerTest, RejectsUnknownSegment) {
  v1::PushRequest p = GoodPush();
  p.set_segment(7);
  ExpectRejected(p, absl::StatusCode::kNotFound, "unknown segment 7");
}

TEST_F(ParameterServerTest, RejectsWrongRange) {
  v1::PushRequest p = GoodPush();
  p.mutable_gradient()->set_offset(range_.offset + 1);
  ExpectRejected(p, absl::StatusCode::kInvalidArgument, "is not within this server's shard");
}

TEST_F(ParameterServerTest, RejectsWrongByteLength) {
  v1::PushRequest p = GoodPush();
  p.mutable_gradient()->mutable_data()->pop_back();
  ExpectRejected(p, absl::StatusCode::kInvalidArgument, "bytes for");
}

TEST_F(ParameterServerTest, RejectsUnknownAndUnsupportedDtypes) {
  v1::PushRequest p = GoodPush();
  p.mutable_gradient()->set_dtype(static_cast<v1::DType>(42));
  ExpectRejected(p, absl::StatusCode::kInvalidArgument, "unknown dtype 42");
}

TEST_F(ParameterServerTest, RejectsBadSparsePushes) {
  v1::PushRequest p = GoodPush();
  const uint32_t indices[] = {2, 1};
  p.mutable_gradient()->set_indices(std::string(reinterpret_cast<const char*>(indices), sizeof(indices)));
  p.mutable_gradient()->mutable_data()->resize(2 * sizeof(float));
  ExpectRejected(p, absl::StatusCode::kInvalidArgument, "indices must ascend strictly");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const uint32_t ascending[] = {1, 2};
  p.mutable_gradient()->set_indices(std::string(reinterpret_cast<const char*>(ascending), sizeof(ascending)));
  std::memcpy(p.mutable_gradient()->mutable_data()->data(), &nan, sizeof(nan));
  ExpectRejected(p, absl::StatusCode::kInvalidArgument,
                 absl::StrCat("element ", range_.offset + 1, " of segment 0 is nan"));  // the entry's position
}

// A sparse push is the dense push with zeros elsewhere, whole or in chunks.
TEST_F(ParameterServerTest, SparsePushesEqualDensePushesWithZeros) {
  ASSERT_GE(range_.count, 4u);
  uint64_t twin_worker = 0;
  std::unique_ptr<ParameterServer> sparse = Twin(&twin_worker);
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  v1::PushResponse response;
  for (uint64_t clock = 0; clock < 2; ++clock) {  // Adam: zeros still move the moments
    std::vector<float> dense(range_.count, 0.0f);
    const std::vector<uint32_t> at = {0, static_cast<uint32_t>(range_.count / 2), static_cast<uint32_t>(range_.count - 1)};
    std::vector<float> values;
    for (uint32_t i : at) values.push_back(dense[i] = 0.25f * (i + 1) * (clock + 1));
    v1::PushRequest whole = GoodPush(clock);
    EncodeFloat32(dense, range_.offset, whole.mutable_gradient());
    ASSERT_TRUE(server_->Push(whole, soon, &response).ok());

    // The same gradient, sparse, as two chunks split after the middle entry.
    const uint64_t split = at[1] + 1;
    v1::PushRequest first = GoodPush(clock), second = GoodPush(clock);
    for (v1::PushRequest* p : {&first, &second}) {
      p->set_worker_id(twin_worker);
      p->set_registration_secret(twin_secret_);
    }
    const uint32_t first_at[] = {at[0], at[1]}, second_at[] = {static_cast<uint32_t>(at[2] - split)};
    EncodeFloat32({values[0], values[1]}, range_.offset, first.mutable_gradient());
    first.mutable_gradient()->set_count(split);
    first.mutable_gradient()->set_indices(std::string(reinterpret_cast<const char*>(first_at), sizeof(first_at)));
    EncodeFloat32({values[2]}, range_.offset + split, second.mutable_gradient());
    second.mutable_gradient()->set_count(range_.count - split);
    second.mutable_gradient()->set_indices(std::string(reinterpret_cast<const char*>(second_at), sizeof(second_at)));
    ASSERT_TRUE(sparse->Push(first, soon, &response).ok());
    EXPECT_EQ(response.next_clock(), clock);
    ASSERT_TRUE(sparse->Push(second, soon, &response).ok());
    EXPECT_EQ(response.next_clock(), clock + 1);
  }
  EXPECT_EQ(server_->shard(0).Snapshot(), sparse->shard(0).Snapshot());
}

TEST_F(ParameterServerTest, RejectsNonFiniteGradients) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    v1::PushRequest p = GoodPush();
    std::vector<float> g(range_.count, 0.5f);
    g[3] = bad;
    EncodeFloat32(g, range_.offset, p.mutable_gradient());
    ExpectRejected(p, absl::StatusCode::kInvalidArgument, "gradients must be finite");
  }
}

TEST_F(ParameterServerTest, NamesFloat16Overflow) {
  v1::PushRequest p = GoodPush();
  std::vector<float> g(range_.count, 0.5f);
  g[2] = 1e5f;  // beyond binary16's largest finite value: infinity on the wire
  std::vector<uint16_t> halves(g.size());
  ToFloat16(g, halves.data());
  p.mutable_gradient()->set_dtype(v1::FLOAT16);
  p.mutable_gradient()->set_data(std::string(reinterpret_cast<const char*>(halves.data()), halves.size() * 2));
  ExpectRejected(p, absl::StatusCode::kInvalidArgument,
                 absl::StrCat("element ", range_.offset + 2, " of segment 0 is inf (beyond float16's 65504"));
}

TEST_F(ParameterServerTest, RejectsClockThatSkips) {
  ExpectRejected(GoodPush(1), absl::StatusCode::kFailedPrecondition, "skips");
}

TEST_F(ParameterServerTest, RejectsUnregisteredWorker) {
  v1::PushRequest p = GoodPush();
  p.set_worker_id(999);
  ExpectRejected(p, absl::StatusCode::kNotFound, "no registration of worker 999");
}

// A registration is named by its secret: calls that name a live worker's id
// without it are NOT_FOUND and leave the worker and the parameters alone.
TEST_F(ParameterServerTest, ForgedCallsOnALiveRegistrationChangeNothing) {
  for (const std::string& forged : {std::string(), std::string(16, 'x'), secret_.substr(0, 15)}) {
    v1::PushRequest push = GoodPush();
    push.set_registration_secret(forged);
    ExpectRejected(push, absl::StatusCode::kNotFound, "no registration of worker");
    v1::PullRequest pull;
    pull.set_worker_id(worker_);
    pull.set_registration_secret(forged);
    v1::PullResponse pulled;
    EXPECT_EQ(server_->Pull(pull, absl::Now(), &pulled).code(), absl::StatusCode::kNotFound);
    v1::HeartbeatRequest beat;
    beat.set_worker_id(worker_);
    beat.set_registration_secret(forged);
    v1::HeartbeatResponse beaten;
    EXPECT_EQ(server_->Heartbeat(beat, &beaten).code(), absl::StatusCode::kNotFound);
    v1::LeaveRequest leave;
    leave.set_worker_id(worker_);
    leave.set_registration_secret(forged);
    EXPECT_EQ(server_->Leave(leave).code(), absl::StatusCode::kNotFound);
  }
  // The worker is still registered and live: its own push lands.
  v1::PushResponse response;
  ASSERT_TRUE(server_->Push(GoodPush(), absl::Now() + absl::Seconds(5), &response).ok());
  EXPECT_TRUE(response.applied());
}

// A registration is bound to the caller that made it: another caller (a
// different token or client certificate), even with the id and the secret,
// gets NOT_FOUND and changes nothing.
TEST_F(ParameterServerTest, ARegistrationAnswersOnlyTheCallerThatMadeIt) {
  v1::RegisterResponse registered;
  v1::LeaveRequest done;  // the fixture's worker gives rank 0 up
  done.set_worker_id(worker_);
  done.set_registration_secret(secret_);
  ASSERT_TRUE(server_->Leave(done).ok());
  ASSERT_TRUE(server_->Register(Registration(0, 0), &registered, "token 0 cert worker-a").ok());
  const std::string before = State();
  v1::PushRequest push = GoodPush();
  push.set_worker_id(registered.worker_id());
  push.set_registration_secret(registered.registration_secret());
  v1::PushResponse pushed;
  for (const std::string& other : {std::string(), std::string("token 1"), std::string("token 0 cert worker-b")}) {
    EXPECT_EQ(server_->Push(push, absl::Now() + absl::Seconds(5), &pushed, other).code(), absl::StatusCode::kNotFound);
    v1::HeartbeatRequest beat;
    beat.set_worker_id(registered.worker_id());
    beat.set_registration_secret(registered.registration_secret());
    v1::HeartbeatResponse beaten;
    EXPECT_EQ(server_->Heartbeat(beat, &beaten, other).code(), absl::StatusCode::kNotFound);
    v1::LeaveRequest leave;
    leave.set_worker_id(registered.worker_id());
    leave.set_registration_secret(registered.registration_secret());
    EXPECT_EQ(server_->Leave(leave, other).code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(before, State());
  ASSERT_TRUE(server_->Push(push, absl::Now() + absl::Seconds(5), &pushed, "token 0 cert worker-a").ok());
  EXPECT_TRUE(pushed.applied());
}

TEST_F(ParameterServerTest, RejectsMismatchedFingerprints) {
  const std::string before = State();
  v1::RegisterRequest r = Registration(0, 1);
  r.set_model_fingerprint("0123456789abcdef");
  v1::RegisterResponse response;
  absl::Status status = server_->Register(r, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(status.message()).find("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(std::string(status.message()).find(ModelFingerprint(config_)), std::string::npos)
      << "the server's own fingerprint is not the caller's to read: " << status;
  EXPECT_NE(std::string(status.message()).find("(model, optimizer, seed or balance)"), std::string::npos) << status;
  // A worker that sends the parts learns which differ.
  v1::JobConfig other = config_;
  other.mutable_optimizer()->set_learning_rate(other.optimizer().learning_rate() * 2);
  r.set_model_fingerprint(ModelFingerprint(other));
  for (const auto& [name, part] : ModelFingerprintParts(other)) (*r.mutable_fingerprint_parts())[name] = part;
  status = server_->Register(r, &response);
  EXPECT_NE(std::string(status.message()).find("different configs (optimizer differs)"), std::string::npos) << status;
  r = Registration(0, 1);
  r.set_shard_fingerprint("feedfeedfeedfeed");
  EXPECT_EQ(server_->Register(r, &response).code(), absl::StatusCode::kFailedPrecondition);
  r = Registration(0, 2);
  EXPECT_EQ(server_->Register(r, &response).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(before, State());
}

// A join_clock moves a rank on only as far as some rank got (plus what a
// push may run ahead): beyond, the worker would skip steps nobody computed
// and still finish "done" (2^40 once turned 4,700 steps into 3,706).
TEST_F(ParameterServerTest, AJoinClockBeyondEveryRankIsRefusedAndChangesNothing) {
  v1::PushResponse pushed;
  for (uint64_t clock = 0; clock < 3; ++clock) ASSERT_TRUE(server_->Push(GoodPush(clock), clock_.Now(), &pushed).ok());
  const std::string before = State();
  v1::RegisterRequest far = Registration(0, 0);
  far.set_join_clock(uint64_t{1} << 40);
  v1::RegisterResponse response;
  absl::Status refused = server_->Register(far, &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("join_clock 1099511627776 is beyond every rank of segment 0 on this server (at most 5)"),
            std::string::npos) << refused.message();
  EXPECT_EQ(before, State());
  // The old registration still works; a join within reach is taken.
  ASSERT_TRUE(server_->Push(GoodPush(3), clock_.Now(), &pushed).ok());
  v1::RegisterRequest near = Registration(0, 0);
  near.set_join_clock(4);
  near.set_replaces_worker_id(worker_);
  near.set_replaces_secret(secret_);
  ASSERT_TRUE(server_->Register(near, &response).ok());
  EXPECT_EQ(response.start_clock(), 4u);
}

// Registering a rank a live worker holds again and again stalls nothing:
// the newcomer waits (UNAVAILABLE) until that worker's streams all end,
// its lease lapses or it leaves; only the worker itself, naming its own
// registration and secret, takes it over at once.
TEST_F(ParameterServerTest, ARankHeldByALiveConnectedWorkerIsNotTakenFromIt) {
  ASSERT_TRUE(server_->StreamOpened(0, worker_, secret_, ""));
  EXPECT_FALSE(server_->StreamOpened(0, worker_, std::string(16, 'x'), "")) << "a stream must carry the secret";
  const std::string before = State();
  v1::RegisterRequest newcomer = Registration(0, 0);
  v1::RegisterResponse response;
  for (const std::string& forged : {std::string(), std::string(16, 'x')}) {
    newcomer.set_replaces_worker_id(worker_);
    newcomer.set_replaces_secret(forged);
    absl::Status refused = server_->Register(newcomer, &response);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_NE(refused.message().find("rank 0 of segment 0 is held by worker " + std::to_string(worker_) + ", live"),
              std::string::npos) << refused.message();
  }
  EXPECT_EQ(before, State());
  v1::PushResponse pushed;
  ASSERT_TRUE(server_->Push(GoodPush(0), clock_.Now(), &pushed).ok()) << "the holder trains on";
  // Its stream ends (its process died): the rank is free at once.
  server_->StreamClosed(0, worker_);
  newcomer.clear_replaces_worker_id();
  ASSERT_TRUE(server_->Register(newcomer, &response).ok());
  const uint64_t second = response.worker_id();
  // A registration that never streamed is held for its lease...
  EXPECT_EQ(server_->Register(Registration(0, 0), &response).code(), absl::StatusCode::kUnavailable);
  clock_.Advance(absl::Milliseconds(config_.cluster().lease_ms() + 1));
  // ... and free once it lapsed.
  ASSERT_TRUE(server_->Register(Registration(0, 0), &response).ok());
  EXPECT_NE(response.worker_id(), second);
}

TEST_F(ParameterServerTest, RejectsMalformedPulls) {
  const std::string before = State();
  v1::PullRequest pull;
  pull.set_segment(0);
  pull.set_worker_id(worker_);
  pull.set_registration_secret(secret_);
  pull.set_reader(true);  // a reader must not claim a worker id
  v1::PullResponse response;
  EXPECT_EQ(server_->Pull(pull, absl::Now(), &response).code(), absl::StatusCode::kInvalidArgument);
  pull.set_reader(false);
  pull.set_clock(100);
  EXPECT_EQ(server_->Pull(pull, absl::Now(), &response).code(), absl::StatusCode::kInvalidArgument);
  pull.set_segment(2);
  EXPECT_EQ(server_->Pull(pull, absl::Now(), &response).code(), absl::StatusCode::kNotFound);
  pull.set_segment(0);
  pull.set_clock(0);
  pull.set_dtype(static_cast<v1::DType>(42));
  absl::Status status = server_->Pull(pull, absl::Now(), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("dtype 42"), std::string::npos) << status;
  EXPECT_NE(std::string(status.message()).find("ask for FLOAT32, BFLOAT16 or FLOAT16"), std::string::npos) << status;
  EXPECT_EQ(before, State());
}

TEST_F(ParameterServerTest, CountsRejections) {
  v1::PushRequest p = GoodPush();
  p.mutable_gradient()->set_dtype(v1::BFLOAT16);
  v1::PushResponse response;
  EXPECT_FALSE(server_->Push(p, absl::Now(), &response).ok());
  v1::StatsResponse stats;
  server_->Stats(&stats);
  EXPECT_EQ(stats.segments(0).rejected(), 1u);
  EXPECT_EQ(stats.server_index(), 1u);
}

// `push` cut to elements [first, first + count) of its gradient.
v1::PushRequest Chunk(const v1::PushRequest& push, uint64_t first, uint64_t count) {
  v1::PushRequest chunk = push;
  v1::TensorSlice* g = chunk.mutable_gradient();
  g->set_offset(push.gradient().offset() + first);
  g->set_count(count);
  g->set_data(push.gradient().data().substr(first * sizeof(float), count * sizeof(float)));
  return chunk;
}

TEST_F(ParameterServerTest, ChunkedPushesEqualWholePushes) {
  ASSERT_GE(range_.count, 3u);
  uint64_t twin_worker = 0;
  std::unique_ptr<ParameterServer> chunked = Twin(&twin_worker);
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  v1::PushResponse response;
  for (uint64_t clock = 0; clock < 2; ++clock) {  // Adam: the second step depends on the first's state
    v1::PushRequest whole = GoodPush(clock);
    for (size_t i = 0; i < range_.count; ++i) {
      reinterpret_cast<float*>(whole.mutable_gradient()->mutable_data()->data())[i] = 0.1f * (i + 1) * (clock + 1);
    }
    ASSERT_TRUE(server_->Push(whole, soon, &response).ok());
    whole.set_worker_id(twin_worker);
    whole.set_registration_secret(twin_secret_);
    ASSERT_TRUE(chunked->Push(Chunk(whole, 0, 1), soon, &response).ok());
    EXPECT_TRUE(response.applied());
    EXPECT_EQ(response.next_clock(), clock);  // the step is not complete yet
    ASSERT_TRUE(chunked->Push(Chunk(whole, 0, 1), soon, &response).ok());  // a retried chunk
    EXPECT_FALSE(response.applied());
    EXPECT_EQ(chunked->Push(Chunk(whole, 0, 2), soon, &response).code(), absl::StatusCode::kInvalidArgument)
        << "a chunk overlapping an applied one";
    ASSERT_TRUE(chunked->Push(Chunk(whole, 1, range_.count - 1), soon, &response).ok());
    EXPECT_TRUE(response.applied());
    EXPECT_EQ(response.next_clock(), clock + 1);
  }
  EXPECT_EQ(server_->shard(0).Snapshot(), chunked->shard(0).Snapshot());

  // Chunked pulls read the same values as a whole pull.
  v1::PullRequest pull;
  pull.set_segment(0);
  pull.set_reader(true);
  v1::PullResponse whole, part;
  ASSERT_TRUE(chunked->Pull(pull, absl::Now(), &whole).ok());
  pull.set_offset(range_.offset + 1);
  pull.set_count(2);
  ASSERT_TRUE(chunked->Pull(pull, absl::Now(), &part).ok());
  EXPECT_EQ(part.values().offset(), range_.offset + 1);
  EXPECT_EQ(part.values().data(), whole.values().data().substr(4, 8));
  pull.set_count(range_.count);  // runs past the shard
  EXPECT_EQ(chunked->Pull(pull, absl::Now(), &part).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ParameterServerTest, PushWithPullRepliesWithTheNextClocksValues) {
  const absl::Time soon = absl::Now() + absl::Seconds(5);
  v1::PushRequest push = GoodPush(0);
  push.set_pull(true);
  v1::PushResponse pushed;
  ASSERT_TRUE(server_->Push(push, soon, &pushed).ok());
  EXPECT_TRUE(pushed.applied());
  EXPECT_EQ(pushed.clock(), 1u);
  EXPECT_EQ(pushed.updates(), 1u);
  v1::PullRequest pull;
  pull.set_segment(0);
  pull.set_reader(true);
  v1::PullResponse pulled;
  ASSERT_TRUE(server_->Pull(pull, absl::Now(), &pulled).ok());
  EXPECT_EQ(pushed.values().SerializeAsString(), pulled.values().SerializeAsString());

  // A retry is acknowledged, not applied again, and still brings the values.
  ASSERT_TRUE(server_->Push(push, soon, &pushed).ok());
  EXPECT_FALSE(pushed.applied());
  EXPECT_EQ(pushed.values().data(), pulled.values().data());

  // A chunk's values are ready once the chunks of the step covering them
  // landed, before the step is complete.
  v1::PushRequest chunk = Chunk(GoodPush(1), 0, 1);
  chunk.set_pull(true);
  ASSERT_TRUE(server_->Push(chunk, absl::Now() + absl::Milliseconds(50), &pushed).ok());
  EXPECT_EQ(pushed.values().offset(), range_.offset);
  EXPECT_EQ(pushed.values().count(), 1u);
  EXPECT_EQ(pushed.values().data().size(), sizeof(float));
  EXPECT_EQ(pushed.clock(), 2u);  // these elements reflect step 1, though the step is not complete
  v1::PullResponse whole;
  ASSERT_TRUE(server_->Pull(pull, absl::Now(), &whole).ok());
  EXPECT_EQ(whole.clock(), 1u);  // the whole range does not yet
}

TEST_F(ParameterServerTest, PushClaimingMoreSamplesThanAClockHasIsRejected) {
  v1::PushRequest p = GoodPush();
  p.set_samples(33);  // batch_size 32 x 1 worker
  ExpectRejected(p, absl::StatusCode::kInvalidArgument, "Push samples: 33 is more than a clock's batch_size x workers (32)");
}

TEST_F(ParameterServerTest, ChunkAheadOfItsPredecessorWaitsThenFails) {
  ExpectRejected(Chunk(GoodPush(), 1, range_.count - 1), absl::StatusCode::kFailedPrecondition, "never arrived");
  ExpectRejected(Chunk(GoodPush(), 0, 0), absl::StatusCode::kInvalidArgument, "empty chunk");
}

// The config's momentum_lookahead reaches the shards: at staleness 1 a pull
// for the clock after next is moved on by Adam's drift over one update, and
// a reader's is not.
TEST(ParameterServer, LookaheadFromTheConfigMovesWorkerPulls) {
  std::string text = kConfig;
  text.replace(text.find("kind: ADAM"), 10, "kind: ADAM momentum_lookahead: true");
  text.replace(text.find("staleness: 0 workers_per_segment: 1"), 35, "staleness: 1 workers_per_segment: 1");
  const v1::JobConfig config = *ParseConfig(text, "test");
  std::unique_ptr<ParameterServer> server = *ParameterServer::Create(config, 0);
  const v1::PushRequest push = RegisteredPush(config, server.get(), 0.5f);
  const Range range = server->shard_map().range(0, 0);
  v1::PushResponse pushed;
  ASSERT_TRUE(server->Push(push, absl::Now() + absl::Seconds(5), &pushed).ok());

  auto pull = [&](uint64_t worker, uint64_t clock) {
    v1::PullRequest request;
    request.set_worker_id(worker);
    if (worker != 0) request.set_registration_secret(push.registration_secret());
    request.set_reader(worker == 0);
    request.set_clock(clock);
    v1::PullResponse response;
    EXPECT_TRUE(server->Pull(request, absl::Now(), &response).ok());
    std::vector<float> values(range.count);
    DecodeFloat32(response.values(), absl::MakeSpan(values));
    return values;
  };
  const std::vector<float> stored = pull(0, 0);
  EXPECT_EQ(pull(push.worker_id(), 1), stored);  // misses no update
  const std::vector<float> ahead = pull(push.worker_id(), 2);
  // After one Adam step with g = 0.5: m = 0.05, v = 2.5e-4; the next step
  // moves by alpha_2 * b1 * m / (sqrt(v) + eps).
  const double alpha2 = 0.001 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9);
  const double drift = alpha2 * 0.9 * 0.05 / (std::sqrt(2.5e-4) + 1e-7);
  for (size_t i = 0; i < range.count; ++i) EXPECT_NEAR(stored[i] - ahead[i], drift, 1e-6) << "element " << i;
  EXPECT_EQ(pull(0, 0), stored);
}

TEST(ParameterServer, IndexOutOfRangeIsAnError) {
  v1::JobConfig config = *ParseConfig(kConfig, "test");
  EXPECT_FALSE(ParameterServer::Create(config, 2).ok());
}

}  // namespace
}  // namespace segps
