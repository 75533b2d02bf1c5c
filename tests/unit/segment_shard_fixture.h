// The SegmentShard tests' fixture: a shard on a fake clock, calls whose
// completions are recorded, and the helpers both test files share.
#ifndef SEGPS_TESTS_UNIT_SEGMENT_SHARD_FIXTURE_H_
#define SEGPS_TESTS_UNIT_SEGMENT_SHARD_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "common/clock.h"
#include "common/tensor_wire.h"
#include "server/segment_shard.h"

namespace segps {
namespace testing_shard {

constexpr size_t kSize = 8;
const std::vector<float> kOnes(kSize, 1.0f);

inline absl::string_view Bytes(const std::vector<float>& v) {
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

// Registers worker `id` as `rank` (a failure if the shard refuses).
inline Registered Reg(SegmentShard& shard, uint64_t id, uint32_t rank, std::optional<uint64_t> join = std::nullopt,
                      std::optional<uint64_t> replaces = std::nullopt) {
  absl::StatusOr<Registered> r = shard.Register(id, rank, join, nullptr, replaces);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.value_or(Registered{});
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
    options.cut_room = [this](uint64_t) { return disk_has_room_; };
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
  bool disk_has_room_ = true;  // what cut_room answers
  std::vector<std::unique_ptr<Payload>> payloads_;
  std::vector<std::unique_ptr<DenseView>> views_;
};

}  // namespace testing_shard
}  // namespace segps

#endif  // SEGPS_TESTS_UNIT_SEGMENT_SHARD_FIXTURE_H_
