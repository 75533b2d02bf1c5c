// Recovery driven in process and on a fake clock: workers whose Membership
// talks to ParameterServers through InProcessStubs, servers restarted from
// their checkpoints or without, paused past the lease, pushes that reach
// some servers only, registrations that fail. Each case trains to the end
// and checks every server's clock and update count and the parameters bit
// for bit against the same job never interrupted: no (worker, clock) is
// applied twice or lost.
#include "worker/client/membership.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "common/tensor_wire.h"
#include "server/parameter_server.h"
#include "server/state_seal.h"
#include "tests/support/inprocess_membership.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

constexpr char kConfig[] = R"pb(
cluster { num_servers: 2 lease_ms: 1000 }
checkpoint { every_clocks: 4 keep: 3 }
model {
  input_width: 6
  num_classes: 3
  segments { name: "solo" workers: 1 layers { units: 5 activation: TANH } layers { units: 3 activation: SOFTMAX } }
  segments { name: "pair" workers: 2 layers { units: 3 activation: SOFTMAX } }
}
optimizer { kind: ADAM }
training { staleness: 0 }
data { source: SYNTHETIC_SEED }
)pb";

constexpr uint64_t kClocks = 20;
constexpr char kKey[] = "00112233445566778899aabbccddeeff";  // the servers' `server` line  // every case trains its segment through this many clocks

// Servers in this process on one fake clock, each with a checkpoint
// directory of its own (or none), restartable.
class Cluster {
 public:
  // `state_key`: the servers' key for sealed states (their token file's
  // `server` line); `authenticated`: calls carry tokens, so a Rollback
  // must show states sealed with it.
  explicit Cluster(bool checkpoints, std::string state_key = "", bool authenticated = false)
      : config_(*ParseConfig(kConfig, "membership_test")),
        state_key_(std::move(state_key)),
        authenticated_(authenticated) {
    for (size_t i = 0; i < 2; ++i) {
      dirs_.push_back(checkpoints ? MakeTempDir() : "");
      servers_.emplace_back();
    }
    for (size_t i = 0; i < 2; ++i) {
      Start(i);
      stubs_.push_back(std::make_unique<InProcessStub>(&servers_[i], i));
    }
  }

  void Start(size_t i) {
    ServerOptions options;
    options.clock = &clock_;
    options.tick = absl::ZeroDuration();  // time moves only when the test moves it
    options.checkpoint_dir = dirs_[i];
    options.state_key = state_key_;
    options.authenticated = authenticated_;
    servers_[i] = *ParameterServer::Create(config_, static_cast<uint32_t>(i), options);
  }
  // Kills server i (its written checkpoints stay on disk) and starts it again.
  void Restart(size_t i) {
    servers_[i]->FlushCheckpoints();
    servers_[i].reset();
    Start(i);
  }
  // Waits for the checkpoints cut so far to be on disk: recovery takes
  // longer than a write, so a rejoining worker finds them listed.
  void FlushAll() {
    for (auto& server : servers_) server->FlushCheckpoints();
  }
  // Moves time on by `d` on every server that is not paused.
  void Advance(absl::Duration d, int paused = -1) {
    clock_.Advance(d);
    for (size_t i = 0; i < servers_.size(); ++i) {
      if (static_cast<int>(i) != paused) servers_[i]->Tick();
    }
  }

  Membership NewMembership() {
    return Membership({stubs_[0].get(), stubs_[1].get()}, ModelFingerprint(config_),
                      servers_[0]->shard_map().fingerprint());
  }
  v1::SegmentStats Stats(size_t i, int segment) {
    v1::StatsResponse stats;
    servers_[i]->Stats(&stats);
    return stats.segments(segment);
  }
  std::vector<float> Values(size_t i, int segment) { return servers_[i]->shard(segment).Snapshot(); }

  const v1::JobConfig& config() const { return config_; }
  ParameterServer& server(size_t i) { return *servers_[i]; }
  InProcessStub& stub(size_t i) { return *stubs_[i]; }
  FakeClock& clock() { return clock_; }

 private:
  v1::JobConfig config_;
  const std::string state_key_;
  const bool authenticated_;
  FakeClock clock_;
  std::vector<std::string> dirs_;
  std::vector<std::unique_ptr<ParameterServer>> servers_;
  std::vector<std::unique_ptr<InProcessStub>> stubs_;
};

// A worker of `segment` as the engine drives one: it registers through its
// Membership, pulls its start clock, and pushes one gradient a clock to
// every server (or only some), a fixed function of (rank, clock).
class Worker {
 public:
  Worker(Cluster* cluster, int segment, uint32_t rank)
      : cluster_(cluster), segment_(segment), rank_(rank), membership_(cluster->NewMembership()) {}

  // Registers (again), pulls the start clock; the clock to push next.
  absl::Status Join() {
    absl::StatusOr<Registration> joined = membership_.Register(segment_, rank_);
    if (!joined.ok()) return joined.status();
    next_ = joined->start_clock;
    for (size_t i = 0; i < 2; ++i) {
      v1::PullRequest pull;
      pull.set_segment(segment_);
      pull.set_worker_id(membership_.worker_id(i));
      pull.set_registration_secret(membership_.secret(i));
      pull.set_clock(next_);
      v1::PullResponse values;
      absl::Status pulled = cluster_->server(i).Pull(pull, Deadline(), &values);
      if (!pulled.ok()) return pulled;
    }
    return absl::OkStatus();
  }
  // Rejoins after a failure, as the engine does: backoff on the fake clock.
  absl::Status Rejoin() {
    cluster_->FlushAll();
    absl::StatusOr<Registration> again =
        segps::Rejoin([&] { return membership_.Register(segment_, rank_); }, absl::Seconds(30), &cluster_->clock(),
                      "test");
    if (!again.ok()) return again.status();
    return Join();
  }

  // Pushes clock next() to the servers in `to` (default: every server);
  // moves on when every server took it.
  absl::Status Push(std::vector<size_t> to = {0, 1}) {
    for (size_t i : to) {
      const Range range = cluster_->server(i).shard_map().range(segment_, static_cast<uint32_t>(i));
      std::vector<float> grad(range.count);
      for (size_t e = 0; e < grad.size(); ++e) {
        grad[e] = 0.01f * static_cast<float>((rank_ * 7 + next_ * 3 + e) % 11) - 0.05f;
      }
      v1::PushRequest push;
      push.set_segment(segment_);
      push.set_worker_id(membership_.worker_id(i));
      push.set_registration_secret(membership_.secret(i));
      push.set_clock(next_);
      EncodeFloat32(grad, range.offset, push.mutable_gradient());
      v1::PushResponse response;
      absl::Status pushed = cluster_->server(i).Push(push, Deadline(), &response);
      if (!pushed.ok()) return pushed;
    }
    if (to.size() == 2) ++next_;
    return absl::OkStatus();
  }
  // Pushes clock next() to server i only and moves on, as a worker with
  // pushes in flight does before their answers come.
  absl::Status PushAhead(size_t i) {
    SEGPS_RETURN_IF_ERROR(Push({i}));
    ++next_;
    return absl::OkStatus();
  }
  uint64_t next() const { return next_; }
  Membership& membership() { return membership_; }

 private:
  absl::Time Deadline() { return cluster_->clock().Now() + absl::Seconds(5); }

  Cluster* const cluster_;
  const int segment_;
  const uint32_t rank_;
  Membership membership_;
  uint64_t next_ = 0;
};

// Trains `workers` in lockstep until every one has pushed kClocks clocks,
// rejoining a worker whose push failed (a server restarted or dropped it).
void TrainToEnd(std::vector<Worker*> workers) {
  for (int guard = 0; guard < 1000; ++guard) {
    bool done = true;
    for (Worker* w : workers) {
      if (w->next() >= kClocks) continue;
      done = false;
      if (!w->Push().ok()) {
        ASSERT_TRUE(w->Rejoin().ok());
      }
    }
    if (done) return;
  }
  FAIL() << "training did not end";
}

// The parameters of `segment` trained by its workers without interruption.
std::vector<std::vector<float>> Reference(int segment) {
  Cluster reference(/*checkpoints=*/false);
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<Worker*> all;
  for (uint32_t r = 0; r < static_cast<uint32_t>(reference.config().model().segments(segment).workers()); ++r) {
    workers.push_back(std::make_unique<Worker>(&reference, segment, r));
  }
  for (auto& w : workers) EXPECT_TRUE(w->Join().ok());
  for (auto& w : workers) all.push_back(w.get());
  TrainToEnd(all);
  return {reference.Values(0, segment), reference.Values(1, segment)};
}

// Every server at clock kClocks with exactly workers x kClocks updates, and
// the uninterrupted job's parameters.
void ExpectExactlyOnce(Cluster& cluster, int segment) {
  const uint64_t ranks = cluster.config().model().segments(segment).workers();
  const std::vector<std::vector<float>> reference = Reference(segment);
  for (size_t i = 0; i < 2; ++i) {
    const v1::SegmentStats stats = cluster.Stats(i, segment);
    EXPECT_EQ(stats.clock(), kClocks) << "server " << i;
    EXPECT_EQ(stats.updates(), ranks * kClocks) << "server " << i;
    EXPECT_EQ(cluster.Values(i, segment), reference[i]) << "server " << i << ": parameters differ from the "
                                                        << "uninterrupted job's";
  }
}

// Workers a and b join and push `clocks` clocks in lockstep.
void TrainBoth(Worker& a, Worker& b, int clocks) {
  ASSERT_TRUE(a.Join().ok());
  ASSERT_TRUE(b.Join().ok());
  for (int c = 0; c < clocks; ++c) {
    ASSERT_TRUE(a.Push().ok());
    ASSERT_TRUE(b.Push().ok());
  }
}

// With calls authenticated or not: where they are, the rollback shows the
// servers' sealed states.
TEST(Membership, ServerRestartedFromACheckpointRollsBackAndLosesNothing) {
  for (const bool sealed : {false, true}) {
    SCOPED_TRACE(sealed ? "sealed states" : "unauthenticated");
    Cluster cluster(/*checkpoints=*/true, sealed ? kKey : "", sealed);
    Worker w(&cluster, 0, 0);
    ASSERT_TRUE(w.Join().ok());
    for (int c = 0; c < 10; ++c) ASSERT_TRUE(w.Push().ok());
    cluster.Restart(1);  // back at its checkpoint of clock 8; server 0 is at 10
    EXPECT_FALSE(w.Push().ok());
    ASSERT_TRUE(w.Rejoin().ok());
    EXPECT_EQ(w.next(), 8u) << "the servers agree on their newest common checkpoint";
    EXPECT_EQ(cluster.Stats(0, 0).generation(), 2u) << "server 0 was rolled back";
    TrainToEnd({&w});
    ExpectExactlyOnce(cluster, 0);
  }
}

// Registration ids and secrets, one a server.
using Held = std::vector<std::pair<uint64_t, std::string>>;

// The registrations of worker `w`'s membership.
Held HeldBy(Worker& w) {
  return {{w.membership().worker_id(0), w.membership().secret(0)},
          {w.membership().worker_id(1), w.membership().secret(1)}};
}

// Registers segment 0 rank 0 with both servers as its worker would, taking
// over `held` (its registrations there, updated); the servers' answers
// (sealed states, registrations).
std::vector<v1::RegisterResponse> RegisterBoth(Cluster& cluster, Held* held) {
  v1::RegisterRequest request;
  request.set_segment(0);
  request.set_model_fingerprint(ModelFingerprint(cluster.config()));
  request.set_shard_fingerprint(cluster.server(0).shard_map().fingerprint());
  std::vector<v1::RegisterResponse> responses(2);
  for (size_t i = 0; i < 2; ++i) {
    request.set_replaces_worker_id((*held)[i].first);
    request.set_replaces_secret((*held)[i].second);
    const absl::Status status = cluster.server(i).Register(request, &responses[i]);
    EXPECT_TRUE(status.ok()) << status;
    (*held)[i] = {responses[i].worker_id(), responses[i].registration_secret()};
  }
  return responses;
}

// A Rollback of server 0 by the registration `responses[0]` names, to its
// checkpoint at clock 8, showing `states`.
absl::Status RollBack(Cluster& cluster, const std::vector<v1::RegisterResponse>& responses,
                      std::vector<v1::SealedRankState> states) {
  v1::RollbackRequest request;
  request.set_segment(0);
  request.set_worker_id(responses[0].worker_id());
  request.set_registration_secret(responses[0].registration_secret());
  request.set_clock(8);
  request.set_generation(responses[0].generation());
  for (v1::SealedRankState& state : states) *request.add_states() = std::move(state);
  v1::RollbackResponse response;
  return cluster.server(0).Rollback(request, &response);
}

// Where calls are authenticated, a caller with a registration rolls a
// segment back only by showing every server's state sealed with the
// servers' key, current, and disagreeing: states left out, altered, sealed
// with another key, stale or agreeing are refused, naming why, and change
// nothing; the servers' own states, shown within the lease, are taken.
TEST(Membership, ARollbackIsTakenOnlyOnSealedStatesShowingTheServersDisagree) {
  Cluster cluster(/*checkpoints=*/true, kKey, /*authenticated=*/true);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 10; ++c) ASSERT_TRUE(w.Push().ok());
  cluster.Restart(1);  // back at its checkpoint of clock 8; server 0 is at 10
  cluster.FlushAll();
  Held held = HeldBy(w);
  std::vector<v1::RegisterResponse> registered = RegisterBoth(cluster, &held);
  const std::vector<v1::SealedRankState> shown = {registered[0].sealed(), registered[1].sealed()};
  ASSERT_EQ(shown[0].rank_clock(), 10u);
  ASSERT_EQ(shown[1].rank_clock(), 8u);
  std::vector<v1::SealedRankState> altered = shown, foreign = shown;
  altered[0].set_rank_clock(8);  // would say they agree, under the old seal
  for (v1::SealedRankState& state : foreign) SealState("another job's servers' key", &state);
  for (const auto& [states, code, says] : std::vector<std::tuple<std::vector<v1::SealedRankState>,
                                                                 absl::StatusCode, std::string>>{
           {{}, absl::StatusCode::kInvalidArgument, "states must hold the sealed state of each of the 2 servers"},
           {{shown[1], shown[0]}, absl::StatusCode::kInvalidArgument, "states[0] is server 1's"},
           {altered, absl::StatusCode::kPermissionDenied, "states[0] is not sealed by a server of this job"},
           {foreign, absl::StatusCode::kPermissionDenied, "states[0] is not sealed by a server of this job"}}) {
    const absl::Status refused = RollBack(cluster, registered, states);
    EXPECT_EQ(refused.code(), code) << refused;
    EXPECT_NE(refused.message().find(says), std::string::npos) << refused;
  }
  cluster.clock().Advance(absl::Milliseconds(1001));  // a lease (1 s) after they were sealed
  const absl::Status stale = RollBack(cluster, registered, shown);
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted) << stale;
  EXPECT_NE(stale.message().find("sealed more than a lease (1s) from now"), std::string::npos) << stale;
  EXPECT_EQ(cluster.Stats(0, 0).generation(), 1u) << "a refused rollback changed server 0";
  EXPECT_EQ(cluster.Stats(0, 0).clock(), 10u);

  registered = RegisterBoth(cluster, &held);
  ASSERT_TRUE(RollBack(cluster, registered, {registered[0].sealed(), registered[1].sealed()}).ok());
  EXPECT_EQ(cluster.Stats(0, 0).generation(), 2u);
  EXPECT_EQ(cluster.Stats(0, 0).clock(), 8u);
  cluster.clock().Advance(absl::Seconds(1));  // past the rate limit: only the states refuse the next
  registered = RegisterBoth(cluster, &held);
  const absl::Status agree = RollBack(cluster, registered, {registered[0].sealed(), registered[1].sealed()});
  EXPECT_EQ(agree.code(), absl::StatusCode::kFailedPrecondition) << agree;
  EXPECT_NE(agree.message().find("the servers agree on segment 0 rank 0 (server 0 at 8, server 1 at 8)"),
            std::string::npos)
      << agree;
  EXPECT_EQ(cluster.Stats(0, 0).generation(), 2u);
}

// Servers that take tokens but were given no `server` line cannot check
// the states, and refuse every rollback naming the line.
TEST(Membership, AnAuthenticatedServerWithoutTheServersKeyRefusesRollbacks) {
  Cluster cluster(/*checkpoints=*/true, /*state_key=*/"", /*authenticated=*/true);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 10; ++c) ASSERT_TRUE(w.Push().ok());
  cluster.Restart(1);
  cluster.FlushAll();
  Held held = HeldBy(w);
  const std::vector<v1::RegisterResponse> registered = RegisterBoth(cluster, &held);
  EXPECT_TRUE(registered[0].sealed().seal().empty());
  const absl::Status refused = RollBack(cluster, registered, {registered[0].sealed(), registered[1].sealed()});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("no `server` line in its token file"), std::string::npos) << refused;
  EXPECT_EQ(cluster.Stats(0, 0).generation(), 1u);
}

// A server rolls a segment back at most once a second: another Rollback
// within that (a caller with a registration undoing training again and
// again) is refused and changes nothing; a second later one is taken.
TEST(Membership, ASegmentIsRolledBackAtMostOnceASecond) {
  Cluster cluster(/*checkpoints=*/true);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 10; ++c) ASSERT_TRUE(w.Push().ok());
  cluster.Restart(1);
  EXPECT_FALSE(w.Push().ok());
  ASSERT_TRUE(w.Rejoin().ok());  // server 0 rolled back to clock 8
  ASSERT_EQ(cluster.Stats(0, 0).generation(), 2u);
  ASSERT_TRUE(w.Push().ok());  // no longer at its checkpoint (where a rollback changes nothing)
  v1::RollbackRequest again;
  again.set_segment(0);
  again.set_worker_id(w.membership().worker_id(0));
  again.set_registration_secret(w.membership().secret(0));
  again.set_clock(8);
  again.set_generation(2);
  // States that disagree (unauthenticated servers take them unsealed).
  for (uint32_t i = 0; i < 2; ++i) {
    v1::SealedRankState* state = again.add_states();
    state->set_server_index(i);
    state->set_incarnation(cluster.server(i).incarnation());
    state->set_generation(cluster.Stats(i, 0).generation());
    if (i == 0) state->set_rank_clock(8);
    state->set_sealed_at_ms(absl::ToUnixMillis(cluster.clock().Now()));
  }
  v1::RollbackResponse response;
  const absl::Status refused = cluster.server(0).Rollback(again, &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("at most one rollback a segment every 1s"), std::string::npos) << refused;
  EXPECT_EQ(cluster.Stats(0, 0).generation(), 2u);
  cluster.clock().Advance(absl::Seconds(1));
  ASSERT_TRUE(cluster.server(0).Rollback(again, &response).ok());
  EXPECT_TRUE(response.rolled_back());
  EXPECT_EQ(cluster.Stats(0, 0).generation(), 3u);
}

TEST(Membership, ServerRestartedWithoutCheckpointsIsRefusedNamingIt) {
  Cluster cluster(/*checkpoints=*/false);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 6; ++c) ASSERT_TRUE(w.Push().ok());
  cluster.Restart(1);  // its parameters start over
  EXPECT_FALSE(w.Push().ok()) << "clock 6 reaches server 0, not server 1";
  const std::vector<float> kept = cluster.Values(0, 0);
  const absl::Status refused = w.Rejoin();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("server 1 (in process) restarted with no checkpoint"), std::string::npos)
      << refused;
  EXPECT_EQ(cluster.Stats(0, 0).updates(), 7u) << "the refusal changed server 0";
  EXPECT_EQ(cluster.Values(0, 0), kept);
}

TEST(Membership, ServerPausedPastTheLeaseDropsTheWorkerWhichContinuesWhereItWas) {
  Cluster cluster(/*checkpoints=*/true);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 5; ++c) ASSERT_TRUE(w.Push().ok());
  // Server 1 sees no call for two leases (the worker was paused, or it was).
  cluster.Advance(absl::Seconds(2));
  EXPECT_FALSE(w.Push().ok()) << "the lease ran out";
  ASSERT_TRUE(w.Rejoin().ok());
  EXPECT_EQ(w.next(), 5u);
  EXPECT_EQ(cluster.Stats(1, 0).generation(), 1u) << "no rollback was needed";
  TrainToEnd({&w});
  ExpectExactlyOnce(cluster, 0);
}

TEST(Membership, APushThatReachedOneServerIsAgreedOn) {
  for (const bool checkpoints : {true, false}) {
    SCOPED_TRACE(checkpoints ? "with checkpoints" : "without checkpoints");
    Cluster cluster(checkpoints);
    Worker w(&cluster, 0, 0);
    ASSERT_TRUE(w.Join().ok());
    for (int c = 0; c < 9; ++c) ASSERT_TRUE(w.Push().ok());
    ASSERT_TRUE(w.Push({0}).ok());  // clock 9 reached server 0 only
    ASSERT_TRUE(w.Rejoin().ok());
    // With a common checkpoint (clock 8) both roll back to it; without,
    // the rank continues from server 1's clock and server 0 acknowledges
    // the repeated push without applying it again.
    EXPECT_EQ(w.next(), checkpoints ? 8u : 9u);
    TrainToEnd({&w});
    ExpectExactlyOnce(cluster, 0);
  }
}

// The pushes of two steps in flight reached server 0 only (server 1 lost
// them: it started again from a backup's copy). The worker holds them and
// the step it computed after them, so the servers differ only on those:
// it continues at server 1's clock and sends them again, with no rollback
// although the servers hold a checkpoint in common.
TEST(Membership, PushesInFlightThatReachedOneServerAreSentAgainWithNoRollback) {
  Cluster cluster(/*checkpoints=*/true);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 9; ++c) ASSERT_TRUE(w.Push().ok());
  ASSERT_TRUE(w.PushAhead(0).ok());  // clock 9
  ASSERT_TRUE(w.PushAhead(0).ok());  // clock 10
  w.membership().set_held_steps(HeldSteps{9, 11});
  ASSERT_TRUE(w.Rejoin().ok());
  EXPECT_EQ(w.next(), 9u);
  EXPECT_EQ(cluster.Stats(0, 0).generation(), 1u) << "no rollback";
  EXPECT_EQ(cluster.Stats(1, 0).generation(), 1u) << "no rollback";
  TrainToEnd({&w});
  ExpectExactlyOnce(cluster, 0);
}

// Both servers end with the same updates: every server's clock and count
// for `segment` equal, workers x kClocks.
void ExpectServersAgree(Cluster& cluster, int segment) {
  const uint64_t ranks = cluster.config().model().segments(segment).workers();
  for (size_t i = 0; i < 2; ++i) {
    const v1::SegmentStats stats = cluster.Stats(i, segment);
    EXPECT_EQ(stats.clock(), kClocks) << "server " << i;
    EXPECT_EQ(stats.updates(), ranks * kClocks) << "server " << i << " lost or repeated a (worker, clock)";
  }
}

// Server 1 paused past the lease while both workers of a segment pushed a
// clock to server 0 only; one worker rejoins and moves on alone, then the
// other rejoins behind it. Its registration with server 1 must not jump to
// its peer's clock before the servers agreed where it continues: that
// skipped, on server 1 only, steps that server 0 applied.
TEST(Membership, AWorkerRejoiningBehindAPeerThatMovedOnKeepsTheServersAgreeing) {
  Cluster cluster(/*checkpoints=*/false);
  Worker a(&cluster, 1, 0), b(&cluster, 1, 1);
  TrainBoth(a, b, 6);
  ASSERT_TRUE(a.Push({0}).ok());  // clock 6 reaches server 0 only: server 1 is paused
  ASSERT_TRUE(b.Push({0}).ok());
  cluster.Advance(absl::Seconds(2), /*paused=*/1);  // past the lease
  ASSERT_TRUE(a.Rejoin().ok());
  EXPECT_EQ(a.next(), 6u) << "server 1 never applied clock 6";
  for (int c = 0; c < 3; ++c) ASSERT_TRUE(a.Push().ok());  // alone, a moves on to clock 9
  ASSERT_TRUE(b.Rejoin().ok());
  EXPECT_EQ(b.next(), 6u) << "b continues where server 1 has it, not where its peer is";
  TrainToEnd({&a, &b});
  ExpectServersAgree(cluster, 1);
}

// A server restarted between the registration that answered where the
// rank is and the one that tells it where to continue: the agreement was
// made on a state that is gone, so the worker agrees again, and refuses a
// server that lost its parameters instead of training on them.
TEST(Membership, AServerRestartedBetweenTheTwoRegistrationsIsNoticed) {
  Cluster cluster(/*checkpoints=*/false);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 9; ++c) ASSERT_TRUE(w.Push().ok());
  ASSERT_TRUE(w.Push({0}).ok());  // clock 9 reached server 0 only: it must be told to continue at 9
  bool restarted = false;
  cluster.stub(0).BeforeRegister(1, [&] {
    cluster.Restart(0);
    restarted = true;
  });
  const absl::Status refused = w.Rejoin();
  EXPECT_TRUE(restarted);
  // The restarted server refuses to move the rank to clock 9 on its fresh
  // parameters (it knows no rank beyond 0), and says why it may be so.
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("Register to server 0 (in process): Register: join_clock 9 is beyond every rank"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("restarted without a checkpoint"), std::string::npos) << refused;
}

TEST(Membership, TwoWorkersRecoveringAtOnceAgree) {
  Cluster cluster(/*checkpoints=*/true);
  Worker a(&cluster, 1, 0), b(&cluster, 1, 1);
  TrainBoth(a, b, 6);
  cluster.Restart(0);  // back at clock 4
  absl::Status joined_a, joined_b;
  std::thread other([&] { joined_b = b.Rejoin(); });
  joined_a = a.Rejoin();
  other.join();
  // At once, one's rollback may drop the other's registrations: a call of
  // the one dropped gets NOT_FOUND, never a wrong clock. Each then registers
  // again, as its engine would, and both agree without another rollback.
  for (const absl::Status& joined : {joined_a, joined_b}) {
    EXPECT_TRUE(joined.ok() || Recoverable(joined)) << joined;
  }
  const uint64_t generation = cluster.Stats(0, 1).generation();
  joined_a = a.Rejoin();
  joined_b = b.Rejoin();
  EXPECT_EQ(cluster.Stats(0, 1).generation(), generation) << "the servers still disagreed";
  ASSERT_TRUE(joined_a.ok()) << joined_a;
  ASSERT_TRUE(joined_b.ok()) << joined_b;
  EXPECT_EQ(a.next(), 4u);
  EXPECT_EQ(b.next(), 4u);
  TrainToEnd({&a, &b});
  ExpectExactlyOnce(cluster, 1);
}

// Worker b registers with server 0 before a's rollback and with server 1
// after it: its rollback finds server 0 rolled back by another and stops
// there, instead of rolling server 1 back again (dropping a's registration
// and costing the segment a second recovery).
TEST(Membership, AWorkerThatFindsTheSegmentRolledBackByAnotherRollsNoFurtherServer) {
  Cluster cluster(/*checkpoints=*/true);
  Worker a(&cluster, 1, 0), b(&cluster, 1, 1);
  TrainBoth(a, b, 6);
  cluster.Restart(1);  // back at clock 4; server 0 at 6
  uint64_t after_a = 0;
  cluster.stub(1).BeforeRegister(0, [&] {
    ASSERT_TRUE(a.Rejoin().ok());
    // A second past a's rollback, no rate limit stands in the way of
    // another; a renews its lapsed lease as its heartbeat would.
    cluster.clock().Advance(absl::Seconds(1));
    ASSERT_TRUE(a.Rejoin().ok());
    after_a = cluster.Stats(1, 1).generation();
  });
  ASSERT_TRUE(b.Rejoin().ok());
  ASSERT_NE(after_a, 0u) << "a did not rejoin between b's registrations";
  EXPECT_EQ(cluster.Stats(1, 1).generation(), after_a) << "server 1 was rolled back twice";
  EXPECT_EQ(a.next(), 4u);
  EXPECT_EQ(b.next(), 4u);
  TrainToEnd({&a, &b});
  ExpectExactlyOnce(cluster, 1);
}

// The server restarted from the checkpoint the segment goes back to is
// there already: the rollback leaves it, and its registrations, alone.
TEST(Membership, ARollbackLeavesAServerAlreadyAtTheCheckpoint) {
  Cluster cluster(/*checkpoints=*/true);
  Worker a(&cluster, 1, 0), b(&cluster, 1, 1);
  TrainBoth(a, b, 6);
  cluster.Restart(1);  // back at clock 4; server 0 at 6
  const uint64_t restarted = cluster.Stats(1, 1).generation(), ahead = cluster.Stats(0, 1).generation();
  ASSERT_TRUE(a.Rejoin().ok());
  EXPECT_EQ(a.next(), 4u);
  EXPECT_EQ(cluster.Stats(0, 1).generation(), ahead + 1) << "server 0 went back to clock 4";
  EXPECT_EQ(cluster.Stats(1, 1).generation(), restarted) << "server 1 was at clock 4 already";
  ASSERT_TRUE(b.Rejoin().ok());
  EXPECT_EQ(b.next(), 4u);
  EXPECT_EQ(cluster.Stats(1, 1).generation(), restarted) << "b's rejoin rolled server 1 back";
  TrainToEnd({&a, &b});
  ExpectExactlyOnce(cluster, 1);
}

TEST(Membership, AFailureDuringRecoveryIsRetriedWithBackoffOnTheClock) {
  Cluster cluster(/*checkpoints=*/true);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 6; ++c) ASSERT_TRUE(w.Push().ok());
  cluster.Restart(1);
  EXPECT_FALSE(w.Push().ok());
  cluster.stub(1).FailNext(3);  // still coming up: three refusals
  const absl::Time before = cluster.clock().Now();
  ASSERT_TRUE(w.Rejoin().ok());
  EXPECT_EQ(cluster.clock().Now() - before, absl::Milliseconds(50 + 100 + 200)) << "three backoffs waited";
  TrainToEnd({&w});
  ExpectExactlyOnce(cluster, 0);
}

TEST(Membership, RecoveryGivesUpAfterItsBudgetNamingTheServer) {
  Cluster cluster(/*checkpoints=*/true);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  cluster.stub(1).FailNext(1000);  // never comes back
  const absl::Time before = cluster.clock().Now();
  const absl::Status given_up = w.Rejoin();
  EXPECT_EQ(given_up.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(given_up.message().find("could not rejoin the servers within 30s"), std::string::npos) << given_up;
  EXPECT_NE(given_up.message().find("server 1 is down"), std::string::npos) << given_up;
  EXPECT_LE(cluster.clock().Now() - before, absl::Seconds(30));
  EXPECT_GE(cluster.clock().Now() - before, absl::Seconds(28));
}

TEST(Membership, ABurstOfTenRestartsLosesNothing) {
  Cluster cluster(/*checkpoints=*/true);
  Worker w(&cluster, 0, 0);
  ASSERT_TRUE(w.Join().ok());
  for (int c = 0; c < 5; ++c) ASSERT_TRUE(w.Push().ok());  // past the first checkpoint (clock 4)
  std::mt19937 random(7);
  for (int restart = 0; restart < 10; ++restart) {
    for (int c = 0; c < 1 + static_cast<int>(random() % 3) && w.next() < kClocks; ++c) {
      if (!w.Push().ok()) {
        ASSERT_TRUE(w.Rejoin().ok());
      }
    }
    cluster.Restart(random() % 2);
    if (!w.Push().ok()) {
      ASSERT_TRUE(w.Rejoin().ok());
    }
  }
  TrainToEnd({&w});
  ExpectExactlyOnce(cluster, 0);
}

}  // namespace
}  // namespace segps
