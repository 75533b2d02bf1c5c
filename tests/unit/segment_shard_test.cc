#include "server/segment_shard.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/tensor_wire.h"

namespace segps {
namespace {

constexpr size_t kSize = 8;

// SGD with lr 1 and gradients of ones: every applied update lowers every
// value by exactly 1, so a pulled value tells how many updates it reflects.
std::unique_ptr<SegmentShard> MakeShard(int32_t staleness, absl::Duration lease = absl::Seconds(60)) {
  v1::OptimizerConfig sgd;
  sgd.set_kind(v1::SGD);
  sgd.set_learning_rate(1.0f);
  ShardOptions options;
  options.range = {0, kSize};
  options.staleness = staleness;
  options.max_clock_ahead = 4;
  options.lease = lease;
  return std::make_unique<SegmentShard>(options, std::vector<float>(kSize, 0.0f), *CreateOptimizer(sgd, kSize));
}

const std::vector<float> kOnes(kSize, 1.0f);
absl::Time Now() { return absl::Now(); }
absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// The whole range, into a slice.
absl::StatusOr<PullResult> Pull(SegmentShard& shard, uint64_t id, uint64_t clock, absl::Time deadline,
                                v1::TensorSlice* out) {
  return shard.Pull(
      id, clock, 0, kSize, [out](absl::Span<const float> values) { EncodeFloat32(values, 0, out); }, deadline);
}

absl::string_view Bytes(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A push of ones over the whole range.
absl::StatusOr<PushResult> Push(SegmentShard& shard, uint64_t id, uint64_t clock, absl::Time deadline) {
  v1::TensorSlice slice;
  slice.set_count(kOnes.size());
  slice.set_dtype(v1::FLOAT32);
  const Payload data = Payload::Borrow(Bytes(kOnes));
  return shard.Push(id, clock, 0, DenseView(slice, data), deadline);
}

// Updates reflected by a pull reply.
int Reflected(const v1::TensorSlice& slice) {
  std::vector<float> v(kSize);
  DecodeFloat32(slice, absl::MakeSpan(v));
  return static_cast<int>(-v[0]);
}

TEST(SegmentShard, SynchronousPullWaitsForEveryWorker) {
  auto shard = MakeShard(0);
  EXPECT_EQ(shard->Register(1, 0, std::nullopt), 0u);
  EXPECT_EQ(shard->Register(2, 1, std::nullopt), 0u);
  v1::TensorSlice out;
  ASSERT_TRUE(Pull(*shard, 1, 0, Now(), &out).ok());  // clock 0 needs nothing
  ASSERT_TRUE(Push(*shard, 1, 0, Soon()).ok());
  absl::StatusOr<PullResult> blocked = Pull(*shard, 1, 1, Now(), &out);
  ASSERT_EQ(blocked.status().code(), absl::StatusCode::kUnavailable) << blocked.status();
  EXPECT_NE(std::string(blocked.status().message()).find("waiting for worker 2"), std::string::npos);

  // A pull that must wait returns as soon as the missing push lands.
  absl::StatusOr<PullResult> waited;
  v1::TensorSlice waited_out;
  std::thread puller([&] { waited = Pull(*shard, 1, 1, Soon(), &waited_out); });
  ASSERT_TRUE(Push(*shard, 2, 0, Soon()).ok());
  puller.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->clock, 1u);
  EXPECT_EQ(Reflected(waited_out), 2);
}

// Random interleavings of pushes and non-waiting pulls by three workers: a
// pull succeeds exactly when the bound allows it, and then reflects every
// update it must include.
void CheckBound(int32_t s, uint32_t seed) {
  auto shard = MakeShard(s);
  const int workers = 3;
  std::vector<uint64_t> pushed(workers, 0), pulled(workers, 0);
  for (int w = 0; w < workers; ++w) shard->Register(w + 1, w, std::nullopt);
  std::mt19937 rng(seed);
  for (int action = 0; action < 400; ++action) {
    const int w = static_cast<int>(rng() % workers);
    if (rng() % 2 == 0 && pushed[w] < pulled[w] + 1) {
      ASSERT_TRUE(Push(*shard, w + 1, pushed[w], Soon()).ok());
      ++pushed[w];
      continue;
    }
    const uint64_t clock = pushed[w];  // the step this worker computes next
    v1::TensorSlice out;
    absl::StatusOr<PullResult> r = Pull(*shard, w + 1, clock, Now(), &out);
    const uint64_t needed = clock > static_cast<uint64_t>(s) ? clock - s : 0;
    const uint64_t min_pushed = *std::min_element(pushed.begin(), pushed.end());
    if (min_pushed >= needed) {
      ASSERT_TRUE(r.ok()) << "blocked although every worker had pushed " << min_pushed << " >= " << needed;
      int must_include = 0;
      for (uint64_t p : pushed) must_include += static_cast<int>(std::min(p, needed));
      EXPECT_GE(Reflected(out), must_include);
      pulled[w] = clock;
    } else {
      ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << "returned values missing updates";
    }
  }
}

TEST(SegmentShard, BoundHoldsForStaleness0) { CheckBound(0, 1); }
TEST(SegmentShard, BoundHoldsForStaleness1) { CheckBound(1, 2); }
TEST(SegmentShard, BoundHoldsForStaleness3) { CheckBound(3, 3); }

TEST(SegmentShard, UnboundedNeverWaits) {
  auto shard = MakeShard(-1);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  v1::TensorSlice out;
  for (uint64_t c = 0; c < 4; ++c) {
    ASSERT_TRUE(Pull(*shard, 1, c, Now(), &out).ok());
    ASSERT_TRUE(Push(*shard, 1, c, Soon()).ok());
  }
}

// Momentum 0.5, lr 1, two workers at staleness 1: after both push ones at
// clock 0 the velocity is -1.5 and the values -2.5.
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
  auto shard = std::make_unique<SegmentShard>(options, std::vector<float>(kSize, 0.0f),
                                              *CreateOptimizer(momentum, kSize));
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  EXPECT_TRUE(Push(*shard, 1, 0, Soon()).ok());
  EXPECT_TRUE(Push(*shard, 2, 0, Soon()).ok());
  return shard;
}

float PulledValue(SegmentShard& shard, uint64_t id, uint64_t clock) {
  v1::TensorSlice slice;
  EXPECT_TRUE(Pull(shard, id, clock, Now(), &slice).ok());
  std::vector<float> v(kSize);
  DecodeFloat32(slice, absl::MakeSpan(v));
  return v[kSize - 1];
}

TEST(SegmentShard, LookaheadMovesWorkerPullsByTheUpdatesTheyWillMiss) {
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

TEST(SegmentShard, WithoutLookaheadWorkerPullsAreTheValues) {
  auto shard = MakeMomentumShard(false);
  EXPECT_EQ(PulledValue(*shard, 1, 2), -2.5f);
}

TEST(SegmentShard, RetriedPushIsAppliedOnce) {
  auto shard = MakeShard(0);
  shard->Register(1, 0, std::nullopt);
  absl::StatusOr<PushResult> first = Push(*shard, 1, 0, Soon());
  absl::StatusOr<PushResult> again = Push(*shard, 1, 0, Soon());
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_TRUE(first->applied);
  EXPECT_FALSE(again->applied);
  EXPECT_EQ(again->next_clock, 1u);
  EXPECT_EQ(shard->Snapshot()[0], -1.0f);
}

TEST(SegmentShard, PushesThatOvertakeEachOtherApplyInOrder) {
  auto shard = MakeShard(-1);
  shard->Register(1, 0, std::nullopt);
  absl::StatusOr<PushResult> later;
  std::thread early_arrival([&] { later = Push(*shard, 1, 1, Soon()); });
  ASSERT_TRUE(Push(*shard, 1, 0, Soon()).ok());
  early_arrival.join();
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->next_clock, 2u);
  EXPECT_EQ(shard->Snapshot()[0], -2.0f);
}

TEST(SegmentShard, SkippedClockIsRejectedAndChangesNothing) {
  auto shard = MakeShard(0);
  shard->Register(1, 0, std::nullopt);
  absl::StatusOr<PushResult> skip = Push(*shard, 1, 1, Now());
  EXPECT_EQ(skip.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<PushResult> far = Push(*shard, 1, 9, Soon());
  EXPECT_EQ(far.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(far.status().message()).find("skips ahead"), std::string::npos);
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, 0.0f));
  ASSERT_TRUE(Push(*shard, 1, 0, Soon()).ok());  // the right clock still works
}

TEST(SegmentShard, PullClockGoingBackwardsIsRejected) {
  auto shard = MakeShard(-1);
  shard->Register(1, 0, std::nullopt);
  v1::TensorSlice out;
  ASSERT_TRUE(Push(*shard, 1, 0, Soon()).ok());
  ASSERT_TRUE(Pull(*shard, 1, 1, Now(), &out).ok());
  EXPECT_EQ(Pull(*shard, 1, 0, Now(), &out).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SegmentShard, ExpiredLeaseStopsHoldingOthersBackAndRejoinCatchesUp) {
  auto shard = MakeShard(0, absl::Milliseconds(200));
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  ASSERT_TRUE(Push(*shard, 1, 0, Soon()).ok());
  // Worker 2 never pushes; the pull returns once its lease runs out, not at the deadline.
  const absl::Time start = absl::Now();
  v1::TensorSlice out;
  absl::StatusOr<PullResult> r = Pull(*shard, 1, 1, Soon(), &out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  absl::StatusOr<PushResult> late = Push(*shard, 2, 0, Soon());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(late.status().message()).find("register again"), std::string::npos);
  EXPECT_EQ(shard->Snapshot()[0], -1.0f);
  EXPECT_EQ(shard->Register(3, 1, std::nullopt), 1u);  // rejoins at the segment's clock
  ASSERT_TRUE(Push(*shard, 3, 1, Soon()).ok());
}

TEST(SegmentShard, LeavingWorkerReleasesWaiters) {
  auto shard = MakeShard(0);
  shard->Register(1, 0, std::nullopt);
  shard->Register(2, 1, std::nullopt);
  ASSERT_TRUE(Push(*shard, 1, 0, Soon()).ok());
  absl::StatusOr<PullResult> r;
  v1::TensorSlice out;
  std::thread puller([&] { r = Pull(*shard, 1, 1, Soon(), &out); });
  ASSERT_TRUE(shard->Leave(2));
  puller.join();
  EXPECT_TRUE(r.ok()) << r.status();
}

// An update split over threads lands exactly as one applied on the handler's
// thread alone: Adam, a range several parts long, float16 gradients.
TEST(SegmentShard, UpdateSplitOverThreadsMatchesOneThread) {
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
    for (auto& shard : shards) ASSERT_TRUE(shard->Push(1, clock, 0, DenseView(slice, data), Soon()).ok());
  }
  const std::vector<float> alone = shards[0]->Snapshot(), split = shards[1]->Snapshot();
  ASSERT_NE(alone, initial);
  EXPECT_EQ(alone, split);
}

}  // namespace
}  // namespace segps
