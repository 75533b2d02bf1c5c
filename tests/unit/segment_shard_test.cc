#include "server/segment_shard.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "common/clock.h"
#include "common/tensor_wire.h"

namespace segps {
namespace {

constexpr size_t kSize = 8;
const std::vector<float> kOnes(kSize, 1.0f);

absl::string_view Bytes(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A call's outcome, filled when it completes.
template <typename Result>
struct Outcome {
  bool done = false;
  absl::StatusOr<Result> result = absl::UnknownError("not completed");
  std::vector<float> values;  // what a pull read
  // The pulled values reflect this many updates of SGD (lr 1) on ones.
  int Reflected() const { return static_cast<int>(-values.at(0)); }
};
template <typename Result>
using Call = std::shared_ptr<Outcome<Result>>;

// The result of a completed call (a failure if it has not completed).
template <typename Result>
absl::StatusOr<Result> Done(const Call<Result>& call) {
  if (!call->done) return absl::DeadlineExceededError("the call is still waiting");
  return call->result;
}

// Every wait here runs on a FakeClock: a test moves time and ticks the
// shard, and asserts that a call waits (it has not completed and the shard
// counts it) before the event that should release it.
class SegmentShardTest : public ::testing::Test {
 protected:
  // SGD with lr 1 and gradients of ones: every applied update lowers every
  // value by exactly 1, so a pulled value tells how many updates it reflects.
  std::unique_ptr<SegmentShard> MakeShard(int32_t staleness, absl::Duration lease = absl::Seconds(60),
                                          uint32_t checkpoint_every = 0, uint32_t max_waiting = 64,
                                          uint32_t ranks = 0, bool hold_for_joiners = false,
                                          uint32_t batch_size = 0) {
    v1::OptimizerConfig sgd;
    sgd.set_kind(v1::SGD);
    sgd.set_learning_rate(1.0f);
    ShardOptions options;
    options.range = {0, kSize};
    options.staleness = staleness;
    options.max_clock_ahead = 4;
    options.lease = lease;
    options.clock = &clock_;
    options.checkpoint_every = checkpoint_every;
    options.max_waiting_per_worker = max_waiting;
    options.ranks = ranks;
    options.hold_for_joiners = hold_for_joiners;
    options.batch_size = batch_size;
    options.on_checkpoint = [this](std::shared_ptr<const ShardState> cut) { cuts_.push_back(std::move(cut)); };
    return std::make_unique<SegmentShard>(options, std::vector<float>(kSize, 0.0f), *CreateOptimizer(sgd, kSize));
  }

  absl::Time Now() { return clock_.Now(); }
  absl::Time Soon() { return clock_.Now() + absl::Seconds(30); }

  static ReadRange Into(const Call<PullResult>& call) {
    return [call](absl::Span<const float> v) { call->values.assign(v.begin(), v.end()); };
  }

  // Pulls elements [first, first + count) for `clock`.
  Call<PullResult> Pull(SegmentShard& shard, uint64_t id, uint64_t clock, absl::Time deadline, uint64_t first = 0,
                        uint64_t count = kSize) {
    auto call = std::make_shared<Outcome<PullResult>>();
    shard.Pull(id, clock, first, count, deadline, Into(call), [call](absl::StatusOr<PullResult> r) {
      EXPECT_FALSE(call->done) << "completed twice";
      call->done = true;
      call->result = std::move(r);
    });
    return call;
  }

  // Pushes `view` as step `clock` from element `first`, with a pull of the
  // same elements for clock + 1 when `and_pull`. `view` must outlive the call.
  Call<PushResult> PushView(SegmentShard& shard, uint64_t id, uint64_t clock, uint64_t first, const DenseView& view,
                            absl::Time deadline, bool and_pull = false, const PushInfo& info = {}) {
    auto call = std::make_shared<Outcome<PushResult>>();
    ReadRange read;
    if (and_pull) read = [call](absl::Span<const float> v) { call->values.assign(v.begin(), v.end()); };
    shard.Push(id, clock, first, &view, deadline, std::move(read), [call](absl::StatusOr<PushResult> r) {
      EXPECT_FALSE(call->done) << "completed twice";
      call->done = true;
      call->result = std::move(r);
    }, info);
    return call;
  }

  // A push of ones over `count` elements from `first`.
  Call<PushResult> Push(SegmentShard& shard, uint64_t id, uint64_t clock, absl::Time deadline,
                        bool and_pull = false, uint64_t first = 0, uint64_t count = kSize,
                        const PushInfo& info = {}) {
    v1::TensorSlice slice;
    slice.set_count(count);
    slice.set_dtype(v1::FLOAT32);
    payloads_.push_back(std::make_unique<Payload>(Payload::Borrow(Bytes(kOnes).substr(0, count * sizeof(float)))));
    views_.push_back(std::make_unique<DenseView>(slice, *payloads_.back()));
    return PushView(shard, id, clock, first, *views_.back(), deadline, and_pull, info);
  }

  FakeClock clock_;
  std::vector<std::shared_ptr<const ShardState>> cuts_;  // the checkpoints cut, in order
  std::vector<std::unique_ptr<Payload>> payloads_;
  std::vector<std::unique_ptr<DenseView>> views_;
};

TEST_F(SegmentShardTest, SynchronousPullWaitsForEveryWorkerHoldingNoThread) {
  auto shard = MakeShard(0);
  EXPECT_EQ(shard->Register(1, 0, std::nullopt).start_clock, 0u);
  EXPECT_EQ(shard->Register(2, 1, std::nullopt).start_clock, 0u);
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
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
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
    for (int w = 0; w < workers; ++w) shard->Register(w + 1, w, std::nullopt);
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
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  for (uint64_t c = 0; c < 4; ++c) {
    ASSERT_TRUE(Done(Pull(*shard, 1, c, Now())).ok());
    ASSERT_TRUE(Done(Push(*shard, 1, c, Soon())).ok());
  }
}

// Staleness 1 lets a worker compute clock c + 1 before its peers finish c,
// but not c + 2.
TEST_F(SegmentShardTest, StalenessOneWaitsOnlyForTheClockBeforeLast) {
  auto shard = MakeShard(1);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
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
    shard->Register(1, 0, std::nullopt);
    shard->Register(2, 1, std::nullopt);
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
  shard->Register(1, 0, std::nullopt);
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
  shard->Register(1, 0, std::nullopt);
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
  shard->Register(1, 0, std::nullopt);
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
  shard->Register(1, 0, std::nullopt);
  EXPECT_EQ(Done(Push(*shard, 1, 1, Now())).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<PushResult> far = Done(Push(*shard, 1, 9, Soon()));
  EXPECT_EQ(far.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(far.status().message()).find("skips ahead"), std::string::npos);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, 0.0f));
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());  // the right clock still works
}

TEST_F(SegmentShardTest, PullClockGoingBackwardsIsRejected) {
  auto shard = MakeShard(-1);
  shard->Register(1, 0, std::nullopt);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Pull(*shard, 1, 1, Now())).ok());
  EXPECT_EQ(Done(Pull(*shard, 1, 0, Now())).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SegmentShardTest, ExpiredLeaseStopsHoldingOthersBackAndRejoinCatchesUp) {
  auto shard = MakeShard(0, absl::Milliseconds(200));
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
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
  EXPECT_EQ(shard->Register(3, 1, std::nullopt).start_clock, 1u);  // rejoins at its live peer's clock
  ASSERT_TRUE(Done(Push(*shard, 3, 1, Soon())).ok());
}

// A worker waiting on its peers makes no call, yet it is alive.
TEST_F(SegmentShardTest, WaitingWorkerKeepsItsLease) {
  auto shard = MakeShard(0, absl::Milliseconds(200));
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
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

TEST_F(SegmentShardTest, LeavingWorkerReleasesWaiters) {
  auto shard = MakeShard(0);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  Call<PullResult> waiting = Pull(*shard, 1, 1, Soon());
  EXPECT_FALSE(waiting->done);
  ASSERT_TRUE(shard->Leave(2));
  EXPECT_TRUE(Done(waiting).ok()) << Done(waiting).status();
}

TEST_F(SegmentShardTest, ReplacedWorkersWaitFailsAndChangesNothing) {
  auto shard = MakeShard(-1);
  shard->Register(1, 0, std::nullopt);
  Call<PushResult> early = Push(*shard, 1, 1, Soon());
  EXPECT_FALSE(early->done);
  shard->Register(5, 0, std::nullopt);  // the same rank registers again
  absl::StatusOr<PushResult> r = Done(early);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("replaced or left"), std::string::npos);
  EXPECT_EQ(shard->Waiting(), 0u);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, 0.0f));
}

TEST_F(SegmentShardTest, DrainAnswersWaitingCallsAndParksNoMore) {
  auto shard = MakeShard(0);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
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
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
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
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
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
  for (uint64_t w = 1; w <= kWorkers; ++w) shard->Register(w, static_cast<uint32_t>(w - 1), std::nullopt);
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
    shards.back()->Register(1, 0, std::nullopt);
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
TEST_F(SegmentShardTest, CheckpointIsACutAtItsClock) {
  auto shard = MakeShard(2, absl::Seconds(60), /*checkpoint_every=*/2);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  ASSERT_EQ(cuts_.size(), 1u);  // the initial state, at clock 0
  EXPECT_EQ(cuts_[0]->clock, 0u);
  EXPECT_EQ(cuts_[0]->values, std::vector<float>(kSize, 0.0f));
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Push(*shard, 1, 1, Soon())).ok());
  Call<PushResult> early = Push(*shard, 1, 2, Soon());
  EXPECT_FALSE(early->done);
  EXPECT_EQ(shard->Waiting(), 1u);
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  EXPECT_FALSE(early->done);
  ASSERT_TRUE(Done(Push(*shard, 2, 1, Soon())).ok());
  ASSERT_TRUE(Done(early).ok()) << Done(early).status();
  ASSERT_EQ(cuts_.size(), 2u);
  EXPECT_EQ(cuts_[1]->clock, 2u);
  EXPECT_EQ(cuts_[1]->values, std::vector<float>(kSize, -4.0f));  // four updates, not five
  EXPECT_EQ(cuts_[1]->steps, 4u);
  EXPECT_EQ(cuts_[1]->ranks, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -5.0f));
}

// A waiting push whose cut never comes fails at its deadline, naming the laggard.
TEST_F(SegmentShardTest, PushWaitingForACutFailsAtItsDeadline) {
  auto shard = MakeShard(2, absl::Seconds(60), 2);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Push(*shard, 1, 1, Soon())).ok());
  Call<PushResult> early = Push(*shard, 1, 2, Now() + absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  shard->Tick();
  absl::StatusOr<PushResult> r = Done(early);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("waits for the checkpoint at clock 2"), std::string::npos)
      << r.status();
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -2.0f));
}

TEST_F(SegmentShardTest, FinalStateIsCutWhenTheLastWorkerLeaves) {
  auto shard = MakeShard(0, absl::Seconds(60), 100);
  shard->Register(1, 0, std::nullopt);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Push(*shard, 1, 1, Soon())).ok());
  ASSERT_TRUE(shard->Leave(1));
  ASSERT_EQ(cuts_.size(), 2u);
  EXPECT_EQ(cuts_[1]->clock, 2u);
  EXPECT_EQ(cuts_[1]->values, std::vector<float>(kSize, -2.0f));
  EXPECT_TRUE(cuts_[1]->ranks.empty());
}

// A restore drops every registration; the ranks it held come back at its
// clock, and the segment waits for them meanwhile.
TEST_F(SegmentShardTest, RestoreDropsRegistrationsAndKeepsRanksAtItsClock) {
  auto shard = MakeShard(0, absl::Seconds(60), 2);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  for (uint64_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(Done(Push(*shard, 1, c, Soon())).ok());
    ASSERT_TRUE(Done(Push(*shard, 2, c, Soon())).ok());
  }
  ASSERT_EQ(cuts_.back()->clock, 2u);
  const ShardState cut = *cuts_.back();
  Call<PullResult> parked = Pull(*shard, 1, 4, Soon());  // behind the bound: worker 2 is at 3
  EXPECT_FALSE(parked->done);
  const uint64_t generation = shard->generation();
  std::vector<uint64_t> dropped;
  EXPECT_FALSE(shard->Restore(cut, generation + 1, &dropped));  // someone else's view: nothing changes
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -6.0f));
  ASSERT_TRUE(shard->Restore(cut, generation, &dropped));
  EXPECT_EQ(dropped, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(shard->generation(), generation + 1);
  EXPECT_EQ(Done(parked).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -4.0f));
  EXPECT_EQ(Done(Push(*shard, 1, 3, Soon())).status().code(), absl::StatusCode::kNotFound);
  const Registered back = shard->Register(3, 1, std::nullopt);
  EXPECT_EQ(back.start_clock, 2u);
  ASSERT_TRUE(back.rank_clock.has_value());
  EXPECT_EQ(*back.rank_clock, 2u);
  // Rank 0 is expected back: the step after clock 2 waits for it.
  ASSERT_TRUE(Done(Push(*shard, 3, 2, Soon())).ok());
  Call<PullResult> waits = Pull(*shard, 3, 3, Soon());
  EXPECT_FALSE(waits->done);
  EXPECT_EQ(shard->Register(4, 0, std::nullopt).start_clock, 2u);
  ASSERT_TRUE(Done(Push(*shard, 4, 2, Soon())).ok());
  ASSERT_TRUE(Done(waits).ok());
  EXPECT_EQ(waits->Reflected(), 6);
}

// A rank the shard still knows continues at its own clock: nothing it
// pushed is applied twice.
TEST_F(SegmentShardTest, ReRegisteredRankContinuesAtItsClock) {
  auto shard = MakeShard(0, absl::Milliseconds(200));
  shard->Register(1, 0, std::nullopt);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Push(*shard, 1, 1, Soon())).ok());
  clock_.Advance(absl::Seconds(1));
  shard->Tick();  // the lease ran out
  Registered again = shard->Register(7, 0, std::nullopt);
  EXPECT_EQ(again.start_clock, 2u);
  EXPECT_EQ(again.rank_clock, std::optional<uint64_t>(2));
  // Asked to start lower (another server lags), it acknowledges the repeat.
  again = shard->Register(8, 0, 1);
  EXPECT_EQ(again.start_clock, 1u);
  absl::StatusOr<PushResult> repeat = Done(Push(*shard, 8, 1, Soon()));
  ASSERT_TRUE(repeat.ok());
  EXPECT_FALSE(repeat->applied);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -2.0f));
}

// One worker cannot park more than its share of calls: the next is
// refused with RESOURCE_EXHAUSTED, and other workers still wait normally.
TEST_F(SegmentShardTest, CallsParkedPerWorkerAreBounded) {
  auto shard = MakeShard(0, absl::Seconds(60), 0, /*max_waiting=*/3);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  std::vector<Call<PushResult>> early;
  for (int i = 0; i < 3; ++i) early.push_back(Push(*shard, 1, 1, Soon()));  // each waits for clock 0
  EXPECT_EQ(shard->Waiting(), 3u);
  absl::StatusOr<PushResult> refused = Done(Push(*shard, 1, 1, Soon()));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ(shard->Waiting(), 3u);
  Call<PullResult> other = Pull(*shard, 2, 1, Soon());  // worker 2's own share
  EXPECT_FALSE(other->done);
  EXPECT_EQ(shard->Waiting(), 4u);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());  // releases worker 1's three
  for (const auto& call : early) EXPECT_TRUE(Done(call).ok());
  EXPECT_EQ(shard->Waiting(), 1u);
  for (int i = 0; i < 3; ++i) early[i] = Push(*shard, 1, 3, Soon());  // its share is free again
  EXPECT_EQ(shard->Waiting(), 4u);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -2.0f));  // clocks 0 and 1, once each
}

// A rank whose peers all finished while it was away still owes its steps:
// it continues at its own clock, not at the end.
TEST_F(SegmentShardTest, RankRejoiningAfterItsPeersFinishedContinuesAtItsOwnClock) {
  auto shard = MakeShard(2, absl::Milliseconds(200));
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  clock_.Advance(absl::Milliseconds(150));
  ASSERT_TRUE(shard->Renew(1));
  clock_.Advance(absl::Milliseconds(100));
  shard->Tick();  // worker 2's lease ran out at clock 1
  for (uint64_t c = 0; c < 5; ++c) ASSERT_TRUE(Done(Push(*shard, 1, c, Soon())).ok());
  ASSERT_TRUE(shard->Leave(1));  // its peer finished at clock 5
  const Registered back = shard->Register(3, 1, std::nullopt);
  EXPECT_EQ(back.start_clock, 1u);
  EXPECT_EQ(back.rank_clock, std::optional<uint64_t>(1));
}

// Synchronous (staleness 0, as the server sets it): the first worker's
// push of clock 0 waits for its peer to start and pull clock 0, so that the
// peer's first step sees no update of clock 0: exactly synchronous steps.
TEST_F(SegmentShardTest, AWorkerStartingMomentsAfterItsPeerStartsAtClock0AndSeesNoneOfItsUpdates) {
  auto shard = MakeShard(0, absl::Seconds(5), 0, 64, /*ranks=*/2, /*hold_for_joiners=*/true);
  ASSERT_EQ(shard->Register(1, 0, std::nullopt).start_clock, 0u);
  ASSERT_TRUE(Done(Pull(*shard, 1, 0, Soon())).ok());
  Call<PushResult> first = Push(*shard, 1, 0, Soon(), /*and_pull=*/true);
  clock_.Advance(absl::Seconds(2));
  shard->Tick();
  EXPECT_FALSE(first->done) << "rank 1's place at clock 0 holds the segment back";
  const Registered late = shard->Register(2, 1, std::nullopt);
  EXPECT_EQ(late.start_clock, 0u);
  EXPECT_FALSE(first->done);
  Call<PullResult> peer = Pull(*shard, 2, 0, Soon());
  ASSERT_TRUE(Done(peer).ok());
  EXPECT_EQ(peer->Reflected(), 0) << "the late worker's step saw an update of its own clock";
  EXPECT_FALSE(first->done) << "its pull of clock 1 waits for the peer's push";
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  ASSERT_TRUE(Done(first).ok());
  EXPECT_EQ(first->Reflected(), 2);
}

// A push counts as its worker's start: two workers that push their first
// step without pulling (as a benchmark client does) do not wait for each other.
TEST_F(SegmentShardTest, WorkersPushingWithoutPullingDoNotHoldEachOther) {
  auto shard = MakeShard(0, absl::Seconds(5), 0, 64, /*ranks=*/2, /*hold_for_joiners=*/true);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  Call<PushResult> first = Push(*shard, 1, 0, Soon());
  EXPECT_FALSE(first->done) << "worker 2 may still pull clock 0";
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  ASSERT_TRUE(Done(first).ok());
}

TEST_F(SegmentShardTest, ARankThatNeverStartsHoldsItsPeersForOneLease) {
  auto shard = MakeShard(0, absl::Seconds(5), 0, 64, /*ranks=*/2, /*hold_for_joiners=*/true);
  shard->Register(1, 0, std::nullopt);
  absl::StatusOr<PushResult> refused = Done(Push(*shard, 1, 0, Now()));  // no time to wait
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_NE(std::string(refused.status().message()).find("rank 1, expected back or to start"), std::string::npos)
      << refused.status();
  Call<PushResult> waiting = Push(*shard, 1, 0, Soon(), /*and_pull=*/true);
  clock_.Advance(absl::Seconds(5));
  shard->Tick();
  absl::StatusOr<PushResult> waited = Done(waiting);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waiting->Reflected(), 1);
  // Its place held no rank: a worker asking for any rank gets it.
  EXPECT_EQ(shard->FreeRank(2), std::optional<uint32_t>(1));
}

// Balanced pushes weigh as their samples over batch_size (SGD, lr 1, ones:
// the values fall by the weight); a push of 0 samples counts its clock and
// moves nothing.
TEST_F(SegmentShardTest, APushWeighsAsItsSamples) {
  auto shard = MakeShard(1, absl::Seconds(60), 0, 64, 0, false, /*batch_size=*/32);
  shard->Register(1, 0, std::nullopt);
  PushInfo half;
  half.samples = 16;
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon(), false, 0, kSize, half)).ok());
  EXPECT_FLOAT_EQ(shard->Snapshot()[0], -0.5f);
  PushInfo none;
  none.samples = 0;
  absl::StatusOr<PushResult> empty = Done(Push(*shard, 1, 1, Soon(), false, 0, kSize, none));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->next_clock, 2u);
  EXPECT_FLOAT_EQ(shard->Snapshot()[0], -0.5f);
  ASSERT_TRUE(Done(Push(*shard, 1, 2, Soon())).ok());  // unset: batch_size, weight 1
  EXPECT_FLOAT_EQ(shard->Snapshot()[0], -1.5f);
}

}  // namespace
}  // namespace segps
