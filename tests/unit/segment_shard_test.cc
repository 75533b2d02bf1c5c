// SegmentShard: the staleness bound, parked calls, pushes in order, leases,
// chunks and split updates.
#include "tests/unit/segment_shard_fixture.h"

namespace segps {
namespace testing_shard {

TEST_F(SegmentShardTest, SynchronousPullWaitsForEveryWorkerHoldingNoThread) {
  auto shard = MakeShard(0);
  EXPECT_EQ(Reg(*shard, 1, 0).start_clock, 0u);
  EXPECT_EQ(Reg(*shard, 2, 1).start_clock, 0u);
  ASSERT_TRUE(Done(Pull(*shard, 1, 0, Now())).ok());  // clock 0 needs nothing
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  absl::StatusOr<PullResult> refused = Done(Pull(*shard, 1, 1, Now()));  // no time to wait
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_NE(std::string(refused.status().message()).find("waiting for worker 2 (rank 1)"), std::string::npos);

  // A pull that may wait is parked, and completes when the missing push lands.
  Call<PullResult> waiting = Pull(*shard, 1, 1, Soon());
  EXPECT_FALSE(waiting->done);
  EXPECT_EQ(shard->Waiting(), 1u);
  clock_.Advance(absl::Milliseconds(7));
  shard->Tick();
  EXPECT_FALSE(waiting->done);
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  absl::StatusOr<PullResult> waited = Done(waiting);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->clock, 1u);
  EXPECT_EQ(waited->blocked, absl::Milliseconds(7));
  EXPECT_EQ(waiting->Reflected(), 2);
  EXPECT_EQ(shard->Waiting(), 0u);
}

TEST_F(SegmentShardTest, WaitingPullFailsAtItsDeadlineNamingTheLaggard) {
  auto shard = MakeShard(0);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  Call<PullResult> waiting = Pull(*shard, 1, 1, Now() + absl::Seconds(2));
  clock_.Advance(absl::Milliseconds(1999));
  shard->Tick();
  EXPECT_FALSE(waiting->done);
  clock_.Advance(absl::Milliseconds(1));
  shard->Tick();
  absl::StatusOr<PullResult> r = Done(waiting);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("waiting for worker 2 (rank 1)"), std::string::npos);
  EXPECT_TRUE(waiting->values.empty());
  EXPECT_EQ(shard->Waiting(), 0u);
}

// Random interleavings of pushes and non-waiting pulls by three workers: a
// pull succeeds exactly when the bound allows it, and then reflects every
// update it must include.
class BoundTest : public SegmentShardTest {
 protected:
  void Check(int32_t s, uint32_t seed) {
    auto shard = MakeShard(s);
    const int workers = 3;
    std::vector<uint64_t> pushed(workers, 0), pulled(workers, 0);
    for (int w = 0; w < workers; ++w) Reg(*shard, w + 1, w);
    std::mt19937 rng(seed);
    for (int action = 0; action < 400; ++action) {
      const int w = static_cast<int>(rng() % workers);
      if (rng() % 2 == 0 && pushed[w] < pulled[w] + 1) {
        ASSERT_TRUE(Done(Push(*shard, w + 1, pushed[w], Soon())).ok());
        ++pushed[w];
        continue;
      }
      const uint64_t clock = pushed[w];  // the step this worker computes next
      Call<PullResult> call = Pull(*shard, w + 1, clock, Now());
      const uint64_t needed = clock > static_cast<uint64_t>(s) ? clock - s : 0;
      const uint64_t min_pushed = *std::min_element(pushed.begin(), pushed.end());
      if (min_pushed >= needed) {
        ASSERT_TRUE(Done(call).ok()) << "refused although every worker had pushed " << min_pushed << " >= " << needed;
        int must_include = 0;
        for (uint64_t p : pushed) must_include += static_cast<int>(std::min(p, needed));
        EXPECT_GE(call->Reflected(), must_include);
        pulled[w] = clock;
      } else {
        ASSERT_EQ(Done(call).status().code(), absl::StatusCode::kUnavailable) << "returned values missing updates";
      }
    }
  }
};

TEST_F(BoundTest, BoundHoldsForStaleness0) { Check(0, 1); }
TEST_F(BoundTest, BoundHoldsForStaleness1) { Check(1, 2); }
TEST_F(BoundTest, BoundHoldsForStaleness3) { Check(3, 3); }

TEST_F(SegmentShardTest, UnboundedNeverWaits) {
  auto shard = MakeShard(-1);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  for (uint64_t c = 0; c < 4; ++c) {
    ASSERT_TRUE(Done(Pull(*shard, 1, c, Now())).ok());
    ASSERT_TRUE(Done(Push(*shard, 1, c, Soon())).ok());
  }
}

// Staleness 1 lets a worker compute clock c + 1 before its peers finish c,
// but not c + 2.
TEST_F(SegmentShardTest, StalenessOneWaitsOnlyForTheClockBeforeLast) {
  auto shard = MakeShard(1);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Pull(*shard, 1, 1, Now())).ok());  // needs clock 0 of all: not yet, but s = 1
  ASSERT_TRUE(Done(Push(*shard, 1, 1, Soon())).ok());
  Call<PullResult> waiting = Pull(*shard, 1, 2, Soon());
  EXPECT_FALSE(waiting->done);
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  ASSERT_TRUE(Done(waiting).ok());
  EXPECT_EQ(waiting->Reflected(), 3);
}

// Momentum 0.5, lr 1, two workers at staleness 1: after both push ones at
// clock 0 the velocity is -1.5 and the values -2.5.
class LookaheadTest : public SegmentShardTest {
 protected:
  std::unique_ptr<SegmentShard> MakeMomentumShard(bool lookahead) {
    v1::OptimizerConfig momentum;
    momentum.set_kind(v1::MOMENTUM);
    momentum.set_learning_rate(1.0f);
    momentum.set_momentum(0.5f);
    ShardOptions options;
    options.range = {0, kSize};
    options.staleness = 1;
    options.max_clock_ahead = 4;
    options.momentum_lookahead = lookahead;
    options.clock = &clock_;
    auto shard = std::make_unique<SegmentShard>(options, std::vector<float>(kSize, 0.0f),
                                                *CreateOptimizer(momentum, kSize));
    Reg(*shard, 1, 0);
    Reg(*shard, 2, 1);
    EXPECT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
    EXPECT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
    return shard;
  }
  float PulledValue(SegmentShard& shard, uint64_t id, uint64_t clock) {
    Call<PullResult> call = Pull(shard, id, clock, Now());
    EXPECT_TRUE(Done(call).ok());
    return call->values.at(kSize - 1);
  }
};

TEST_F(LookaheadTest, LookaheadMovesWorkerPullsByTheUpdatesTheyWillMiss) {
  auto shard = MakeMomentumShard(true);
  // Clock 1 follows the worker's last push: its gradient misses nothing.
  EXPECT_EQ(PulledValue(*shard, 1, 1), -2.5f);
  // Clock 2 misses its own step 1 and, at the same pace, its peer's: two
  // updates of velocity decaying by 0.5: -2.5 + (0.5 + 0.25) * -1.5.
  EXPECT_EQ(PulledValue(*shard, 1, 2), -3.625f);
  // Readers get the true values, which the lookahead did not change.
  EXPECT_EQ(PulledValue(*shard, 0, 0), -2.5f);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -2.5f));
}

TEST_F(LookaheadTest, WithoutLookaheadWorkerPullsAreTheValues) {
  auto shard = MakeMomentumShard(false);
  EXPECT_EQ(PulledValue(*shard, 1, 2), -2.5f);
}

TEST_F(SegmentShardTest, RetriedPushIsAppliedOnce) {
  auto shard = MakeShard(0);
  Reg(*shard, 1, 0);
  absl::StatusOr<PushResult> first = Done(Push(*shard, 1, 0, Soon()));
  absl::StatusOr<PushResult> again = Done(Push(*shard, 1, 0, Soon()));
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_TRUE(first->applied);
  EXPECT_FALSE(again->applied);
  EXPECT_EQ(again->next_clock, 1u);
  EXPECT_EQ(shard->Snapshot()[0], -1.0f);
}

TEST_F(SegmentShardTest, PushesThatOvertakeEachOtherApplyInOrder) {
  auto shard = MakeShard(-1);
  Reg(*shard, 1, 0);
  Call<PushResult> early = Push(*shard, 1, 1, Soon());
  EXPECT_FALSE(early->done);
  EXPECT_EQ(shard->Waiting(), 1u);
  EXPECT_EQ(shard->Snapshot()[0], 0.0f);  // not applied ahead of its predecessor
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  absl::StatusOr<PushResult> later = Done(early);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->next_clock, 2u);
  EXPECT_EQ(shard->Snapshot()[0], -2.0f);
}

TEST_F(SegmentShardTest, PushWhosePredecessorNeverArrivesFailsAtItsDeadlineAndChangesNothing) {
  auto shard = MakeShard(-1);
  Reg(*shard, 1, 0);
  Call<PushResult> early = Push(*shard, 1, 1, Now() + absl::Seconds(1));
  clock_.Advance(absl::Milliseconds(999));
  shard->Tick();
  EXPECT_FALSE(early->done);
  clock_.Advance(absl::Milliseconds(1));
  shard->Tick();
  absl::StatusOr<PushResult> r = Done(early);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("never arrived"), std::string::npos);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, 0.0f));
}

TEST_F(SegmentShardTest, SkippedClockIsRejectedAndChangesNothing) {
  auto shard = MakeShard(0);
  Reg(*shard, 1, 0);
  EXPECT_EQ(Done(Push(*shard, 1, 1, Now())).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<PushResult> far = Done(Push(*shard, 1, 9, Soon()));
  EXPECT_EQ(far.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(far.status().message()).find("skips ahead"), std::string::npos);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, 0.0f));
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());  // the right clock still works
}

TEST_F(SegmentShardTest, PullClockGoingBackwardsIsRejected) {
  auto shard = MakeShard(-1);
  Reg(*shard, 1, 0);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Pull(*shard, 1, 1, Now())).ok());
  EXPECT_EQ(Done(Pull(*shard, 1, 0, Now())).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SegmentShardTest, ExpiredLeaseStopsHoldingOthersBackAndRejoinCatchesUp) {
  auto shard = MakeShard(0, absl::Milliseconds(200));
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  // Worker 2 never pushes: the pull completes when its lease runs out, not at the deadline.
  Call<PullResult> waiting = Pull(*shard, 1, 1, Soon());
  clock_.Advance(absl::Milliseconds(199));
  shard->Tick();
  EXPECT_FALSE(waiting->done);
  clock_.Advance(absl::Milliseconds(1));
  shard->Tick();
  absl::StatusOr<PullResult> r = Done(waiting);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->blocked, absl::Milliseconds(200));
  absl::StatusOr<PushResult> late = Done(Push(*shard, 2, 0, Soon()));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(late.status().message()).find("register again"), std::string::npos);
  EXPECT_EQ(shard->Snapshot()[0], -1.0f);
  // Rejoining, it is proposed its live peer's clock but stays at its own
  // until the servers agree (the registration with join_clock)...
  const Registered proposed = Reg(*shard, 3, 1);
  EXPECT_EQ(proposed.start_clock, 1u);
  EXPECT_EQ(proposed.rank_clock, std::optional<uint64_t>(0));
  EXPECT_TRUE(Done(Push(*shard, 3, 0, Soon())).ok()) << "its own clock 0 is still open";
  // ... then catches up with its peer.
  EXPECT_EQ(Reg(*shard, 4, 1, 1, /*replaces=*/3).start_clock, 1u);
  ASSERT_TRUE(Done(Push(*shard, 4, 1, Soon())).ok());
}

// A worker waiting on its peers makes no call, yet it is alive.
TEST_F(SegmentShardTest, WaitingWorkerKeepsItsLease) {
  auto shard = MakeShard(0, absl::Milliseconds(200));
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  Call<PullResult> waiting = Pull(*shard, 1, 1, Soon());
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Milliseconds(100));
    ASSERT_TRUE(shard->Renew(2));  // worker 2 is alive but slow
    shard->Tick();
  }
  EXPECT_FALSE(waiting->done);
  EXPECT_TRUE(shard->Renew(1));
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  EXPECT_TRUE(Done(waiting).ok());
}

// Drained (its listener going away), a shard answers instead of parking;
// reopened (the same server on a new listener), it parks again.
TEST_F(SegmentShardTest, ADrainedShardParksCallsAgainOnceReopened) {
  auto shard = MakeShard(0);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  shard->Drain("listener restarting");
  absl::StatusOr<PullResult> refused = Done(Pull(*shard, 1, 1, Soon()));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  shard->Reopen();
  Call<PullResult> waiting = Pull(*shard, 1, 1, Soon());
  EXPECT_FALSE(waiting->done);
  EXPECT_EQ(shard->Waiting(), 1u);
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  EXPECT_TRUE(Done(waiting).ok()) << Done(waiting).status();
}

TEST_F(SegmentShardTest, LeavingWorkerReleasesWaiters) {
  auto shard = MakeShard(0);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  Call<PullResult> waiting = Pull(*shard, 1, 1, Soon());
  EXPECT_FALSE(waiting->done);
  ASSERT_TRUE(shard->Leave(2));
  EXPECT_TRUE(Done(waiting).ok()) << Done(waiting).status();
}

TEST_F(SegmentShardTest, ReplacedWorkersWaitFailsAndChangesNothing) {
  auto shard = MakeShard(-1);
  Reg(*shard, 1, 0);
  Call<PushResult> early = Push(*shard, 1, 1, Soon());
  EXPECT_FALSE(early->done);
  Reg(*shard, 5, 0, std::nullopt, /*replaces=*/1);  // the worker registers again
  absl::StatusOr<PushResult> r = Done(early);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("replaced or left"), std::string::npos);
  EXPECT_EQ(shard->Waiting(), 0u);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, 0.0f));
}

TEST_F(SegmentShardTest, DrainAnswersWaitingCallsAndParksNoMore) {
  auto shard = MakeShard(0);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  Call<PullResult> waiting = Pull(*shard, 1, 1, Soon());
  shard->Drain("shutting down");
  EXPECT_EQ(Done(waiting).status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<PullResult> again = Done(Pull(*shard, 1, 1, Soon()));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(again.status().message()).find("shutting down"), std::string::npos);
}

// Push with pull is one operation: the push lands at once, its pull waits
// for the bound and answers with the values of both workers' steps.
TEST_F(SegmentShardTest, PushWithPullAppliesThenWaitsForTheNextClock) {
  auto shard = MakeShard(0);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  Call<PushResult> round = Push(*shard, 1, 0, Soon(), /*and_pull=*/true);
  EXPECT_FALSE(round->done);
  EXPECT_EQ(shard->Waiting(), 1u);
  EXPECT_EQ(shard->Snapshot()[0], -1.0f);  // applied already
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  absl::StatusOr<PushResult> r = Done(round);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->applied);
  ASSERT_TRUE(r->pulled.has_value());
  EXPECT_EQ(r->pulled->clock, 1u);
  EXPECT_EQ(round->Reflected(), 2);
  // A worker pulling for clock 1 again is not going backwards.
  EXPECT_TRUE(Done(Pull(*shard, 1, 1, Now())).ok());
}

// A chunk of the range is ready as soon as the chunks covering it have landed.
TEST_F(SegmentShardTest, ChunkIsReadyOnceItsChunksLanded) {
  auto shard = MakeShard(0);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon(), false, 0, kSize / 2)).ok());  // first half of step 0
  EXPECT_TRUE(Done(Pull(*shard, 1, 1, Now(), 0, kSize / 2)).ok());
  Call<PullResult> second_half = Pull(*shard, 1, 1, Soon(), kSize / 2, kSize / 2);
  EXPECT_FALSE(second_half->done);
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon(), false, kSize / 2, kSize / 2)).ok());
  ASSERT_TRUE(Done(second_half).ok());
  EXPECT_EQ(second_half->Reflected(), 2);
}

// A thousand synchronous workers: each round parks every worker's pull but
// the last one's, whose push releases them all, each exactly once.
TEST_F(SegmentShardTest, AThousandParkedRoundsReleaseTogether) {
  constexpr uint64_t kWorkers = 1000;
  auto shard = MakeShard(0);
  for (uint64_t w = 1; w <= kWorkers; ++w) Reg(*shard, w, static_cast<uint32_t>(w - 1));
  for (uint64_t clock = 0; clock < 3; ++clock) {
    std::vector<Call<PushResult>> rounds;
    for (uint64_t w = 1; w <= kWorkers; ++w) {
      rounds.push_back(Push(*shard, w, clock, Soon(), /*and_pull=*/true));
      if (w < kWorkers) {
        ASSERT_FALSE(rounds.back()->done);
      }
    }
    EXPECT_EQ(shard->Waiting(), 0u);
    for (const auto& round : rounds) {
      ASSERT_TRUE(Done(round).ok());
      EXPECT_EQ(round->Reflected(), static_cast<int>(kWorkers * (clock + 1)));
    }
  }
}

// An update split over threads lands exactly as one applied on the handler's
// thread alone: Adam, a range several parts long, float16 gradients.
TEST_F(SegmentShardTest, UpdateSplitOverThreadsMatchesOneThread) {
  constexpr size_t n = 300001;
  v1::OptimizerConfig adam;
  adam.set_kind(v1::ADAM);
  adam.set_learning_rate(0.01f);
  adam.set_beta1(0.9f);
  adam.set_beta2(0.999f);
  adam.set_epsilon(1e-7f);
  std::vector<float> initial(n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : initial) v = uniform(rng);
  ApplyPool pool(3);
  std::vector<std::unique_ptr<SegmentShard>> shards;
  for (ApplyPool* p : {static_cast<ApplyPool*>(nullptr), &pool}) {
    ShardOptions options;
    options.range = {0, n};
    options.apply_pool = p;
    options.clock = &clock_;
    shards.push_back(std::make_unique<SegmentShard>(options, initial, *CreateOptimizer(adam, n)));
    Reg(*shards.back(), 1, 0);
  }
  for (uint64_t clock = 0; clock < 3; ++clock) {
    std::vector<float> grad(n);
    for (float& g : grad) g = uniform(rng);
    std::vector<uint16_t> halves(n);
    ToFloat16(grad, halves.data());
    v1::TensorSlice slice;
    slice.set_count(n);
    slice.set_dtype(v1::FLOAT16);
    const Payload data =
        Payload::Borrow(absl::string_view(reinterpret_cast<const char*>(halves.data()), n * sizeof(uint16_t)));
    const DenseView view(slice, data);
    for (auto& shard : shards) ASSERT_TRUE(Done(PushView(*shard, 1, clock, 0, view, Soon())).ok());
  }
  const std::vector<float> alone = shards[0]->Snapshot(), split = shards[1]->Snapshot();
  ASSERT_NE(alone, initial);
  EXPECT_EQ(alone, split);
}

// A checkpoint at clock 2 holds exactly the updates of clocks 0 and 1 of
// every worker: the fast worker's push of clock 2 waits for the cut.
}  // namespace testing_shard
}  // namespace segps
