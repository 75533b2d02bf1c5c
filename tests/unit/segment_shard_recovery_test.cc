// SegmentShard: checkpoint cuts, restores, ranks that rejoin or start late,
// limits on parked calls, weighted pushes.
#include "tests/unit/segment_shard_fixture.h"

namespace segps {
namespace testing_shard {

TEST_F(SegmentShardTest, CheckpointIsACutAtItsClock) {
  auto shard = MakeShard(2, absl::Seconds(60), /*checkpoint_every=*/2);
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
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
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
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

// A cut the disk has no room for waits, and the pushes of its clock with
// it: no cut clock is skipped. One that waits past its deadline says so.
TEST_F(SegmentShardTest, ACutWaitsForRoomOnTheDiskAndThePushesOfItsClockWithIt) {
  auto shard = MakeShard(0, absl::Seconds(60), 2);
  Reg(*shard, 1, 0);
  ASSERT_EQ(cuts_.size(), 1u);
  disk_has_room_ = false;
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Push(*shard, 1, 1, Soon())).ok());
  Call<PushResult> late = Push(*shard, 1, 2, Now() + absl::Seconds(1));
  EXPECT_FALSE(late->done);
  clock_.Advance(absl::Seconds(1));
  shard->Tick();
  absl::StatusOr<PushResult> r = Done(late);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("waits for the disk"), std::string::npos) << r.status();
  Call<PushResult> waiting = Push(*shard, 1, 2, Soon());
  shard->CutRoomMade();
  EXPECT_FALSE(waiting->done);
  EXPECT_EQ(shard->Waiting(), 1u);
  EXPECT_EQ(cuts_.size(), 1u);
  disk_has_room_ = true;
  shard->CutRoomMade();
  ASSERT_TRUE(Done(waiting).ok()) << Done(waiting).status();
  ASSERT_EQ(cuts_.size(), 2u);
  EXPECT_EQ(cuts_[1]->clock, 2u);
  EXPECT_EQ(cuts_[1]->values, std::vector<float>(kSize, -2.0f));
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -3.0f));
}

// Early stopping: every epoch's end is cut, whatever checkpoint_every says;
// ending the segment at a state answers its workers OUT_OF_RANGE from then
// on and cuts that state as the final one, with no rank waiting to resume.
TEST_F(SegmentShardTest, EpochEndsAreCutAndAnEndedSegmentRefusesItsWorkers) {
  auto shard = MakeShard(0, absl::Seconds(60), /*checkpoint_every=*/100);
  Reg(*shard, 1, 0);
  ASSERT_TRUE(shard->SetEpochClocks(3).ok());
  EXPECT_EQ(shard->SetEpochClocks(4).code(), absl::StatusCode::kInvalidArgument);
  for (uint64_t c = 0; c < 7; ++c) ASSERT_TRUE(Done(Push(*shard, 1, c, Soon())).ok()) << c;
  std::vector<uint64_t> cut;
  for (const auto& state : cuts_) cut.push_back(state->clock);
  EXPECT_EQ(cut, (std::vector<uint64_t>{0, 3, 6}));
  const ShardState best = *cuts_[1];
  Call<PushResult> parked = Push(*shard, 1, 8, Soon());  // waits for clock 7
  std::vector<uint64_t> dropped;
  shard->EndAt(best, "segment 0 stopped early", &dropped);
  EXPECT_EQ(dropped, (std::vector<uint64_t>{1}));
  EXPECT_EQ(Done(parked).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Done(Push(*shard, 1, 7, Soon())).status().code(), absl::StatusCode::kOutOfRange);
  absl::StatusOr<Registered> again = shard->Register(2, 0, std::nullopt, nullptr, std::nullopt);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(again.status().message()).find("stopped early"), std::string::npos) << again.status();
  EXPECT_EQ(shard->Snapshot(), std::vector<float>(kSize, -3.0f));
  ASSERT_EQ(cuts_.size(), 4u);
  EXPECT_EQ(cuts_.back()->clock, 3u);
  EXPECT_TRUE(cuts_.back()->ranks.empty());
  EXPECT_EQ(shard->EndedAt(), std::optional<uint64_t>(3));
}

TEST_F(SegmentShardTest, FinalStateIsCutWhenTheLastWorkerLeaves) {
  auto shard = MakeShard(0, absl::Seconds(60), 100);
  Reg(*shard, 1, 0);
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
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
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
  const Registered back = Reg(*shard, 3, 1);
  EXPECT_EQ(back.start_clock, 2u);
  ASSERT_TRUE(back.rank_clock.has_value());
  EXPECT_EQ(*back.rank_clock, 2u);
  // Rank 0 is expected back: the step after clock 2 waits for it.
  ASSERT_TRUE(Done(Push(*shard, 3, 2, Soon())).ok());
  Call<PullResult> waits = Pull(*shard, 3, 3, Soon());
  EXPECT_FALSE(waits->done);
  EXPECT_EQ(Reg(*shard, 4, 0).start_clock, 2u);
  ASSERT_TRUE(Done(Push(*shard, 4, 2, Soon())).ok());
  ASSERT_TRUE(Done(waits).ok());
  EXPECT_EQ(waits->Reflected(), 6);
}

// A rank the shard still knows continues at its own clock: nothing it
// pushed is applied twice.
TEST_F(SegmentShardTest, ReRegisteredRankContinuesAtItsClock) {
  auto shard = MakeShard(0, absl::Milliseconds(200));
  Reg(*shard, 1, 0);
  ASSERT_TRUE(Done(Push(*shard, 1, 0, Soon())).ok());
  ASSERT_TRUE(Done(Push(*shard, 1, 1, Soon())).ok());
  clock_.Advance(absl::Seconds(1));
  shard->Tick();  // the lease ran out
  Registered again = Reg(*shard, 7, 0);
  EXPECT_EQ(again.start_clock, 2u);
  EXPECT_EQ(again.rank_clock, std::optional<uint64_t>(2));
  // Asked to start lower (another server lags), it acknowledges the repeat.
  again = Reg(*shard, 8, 0, 1, /*replaces=*/7);
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
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
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
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  clock_.Advance(absl::Milliseconds(150));
  ASSERT_TRUE(shard->Renew(1));
  clock_.Advance(absl::Milliseconds(100));
  shard->Tick();  // worker 2's lease ran out at clock 1
  for (uint64_t c = 0; c < 5; ++c) ASSERT_TRUE(Done(Push(*shard, 1, c, Soon())).ok());
  ASSERT_TRUE(shard->Leave(1));  // its peer finished at clock 5
  const Registered back = Reg(*shard, 3, 1);
  EXPECT_EQ(back.start_clock, 1u);
  EXPECT_EQ(back.rank_clock, std::optional<uint64_t>(1));
}

// Synchronous (staleness 0, as the server sets it): the first worker's
// push of clock 0 waits for its peer to start and pull clock 0, so that the
// peer's first step sees no update of clock 0: exactly synchronous steps.
TEST_F(SegmentShardTest, AWorkerStartingMomentsAfterItsPeerStartsAtClock0AndSeesNoneOfItsUpdates) {
  auto shard = MakeShard(0, absl::Seconds(5), 0, 64, /*ranks=*/2, /*hold_for_joiners=*/true);
  ASSERT_EQ(Reg(*shard, 1, 0).start_clock, 0u);
  ASSERT_TRUE(Done(Pull(*shard, 1, 0, Soon())).ok());
  Call<PushResult> first = Push(*shard, 1, 0, Soon(), /*and_pull=*/true);
  clock_.Advance(absl::Seconds(2));
  shard->Tick();
  EXPECT_FALSE(first->done) << "rank 1's place at clock 0 holds the segment back";
  const Registered late = Reg(*shard, 2, 1);
  EXPECT_EQ(late.start_clock, 0u);
  // As on a server where rank 1 registers first: nothing there to agree on,
  // so two workers registering at once never see the servers disagree.
  EXPECT_FALSE(late.rank_clock.has_value()) << "rank 1's place at its start was reported as a clock it held";
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
  Reg(*shard, 1, 0);
  Reg(*shard, 2, 1);
  Call<PushResult> first = Push(*shard, 1, 0, Soon());
  EXPECT_FALSE(first->done) << "worker 2 may still pull clock 0";
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  ASSERT_TRUE(Done(first).ok());
}

TEST_F(SegmentShardTest, ARankThatNeverStartsHoldsItsPeersForOneLease) {
  auto shard = MakeShard(0, absl::Seconds(5), 0, 64, /*ranks=*/2, /*hold_for_joiners=*/true);
  Reg(*shard, 1, 0);
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

// A stage of a chain may register long before its lane can move (its
// first stage still loading the data): the peer it waits for is held for
// one lease from the segment's first push, not from its own registration,
// so a rank registering after more than a lease of nobody pushing still
// starts with its peers at clock 0, and is not taken for one started again.
TEST_F(SegmentShardTest, ARankYetToStartIsHeldForOneLeaseFromTheFirstPush) {
  // Worker 1 (rank 0) registers, renews its lease over two leases with
  // nobody pushing, then pushes clock 0 and waits for rank 1.
  auto idle_then_push = [&](SegmentShard& shard) {
    Reg(shard, 1, 0);
    for (int beat = 0; beat < 3; ++beat) {
      clock_.Advance(absl::Seconds(4));
      EXPECT_TRUE(shard.Renew(1));
      shard.Tick();
    }
    return Push(shard, 1, 0, Soon(), /*and_pull=*/true);
  };
  auto shard = MakeShard(0, absl::Seconds(5), 0, 64, /*ranks=*/2, /*hold_for_joiners=*/true);
  Call<PushResult> first = idle_then_push(*shard);
  clock_.Advance(absl::Seconds(4));
  shard->Tick();
  EXPECT_FALSE(first->done) << "rank 1's place was given up before anyone went on without it";
  const Registered late = Reg(*shard, 2, 1);
  EXPECT_EQ(late.start_clock, 0u);
  EXPECT_FALSE(late.rank_clock.has_value());
  ASSERT_TRUE(Done(Pull(*shard, 2, 0, Soon())).ok());
  ASSERT_TRUE(Done(Push(*shard, 2, 0, Soon())).ok());
  ASSERT_TRUE(Done(first).ok());
  EXPECT_EQ(first->Reflected(), 2);
  // From that first push on, a lease: a rank that never comes is given up.
  auto alone = MakeShard(0, absl::Seconds(5), 0, 64, /*ranks=*/2, /*hold_for_joiners=*/true);
  Call<PushResult> waiting = idle_then_push(*alone);
  clock_.Advance(absl::Seconds(5));
  alone->Tick();
  ASSERT_TRUE(Done(waiting).ok());
  EXPECT_EQ(waiting->Reflected(), 1);
}

// Balanced pushes weigh as their samples over batch_size (SGD, lr 1, ones:
// the values fall by the weight); a push of 0 samples counts its clock and
// moves nothing.
TEST_F(SegmentShardTest, APushWeighsAsItsSamples) {
  auto shard = MakeShard(1, absl::Seconds(60), 0, 64, 0, false, /*batch_size=*/32);
  Reg(*shard, 1, 0);
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

}  // namespace testing_shard
}  // namespace segps
