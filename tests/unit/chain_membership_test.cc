// A chain's recovery as its servers see it, in process on a fake clock:
// each stage's registration reports where the rank's lane stands on every
// server (RegisterResponse.lane_clocks), and a chain rollback
// (RollbackRequest.chain) takes every stage back to a checkpoint they all
// hold, dropping every registration, or is refused and changes nothing.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status_macros.h"
#include "common/tensor_wire.h"
#include "server/parameter_server.h"
#include "tests/support/inprocess_membership.h"
#include "tests/support/subprocess.h"
#include "worker/client/membership.h"

namespace segps {
namespace {

constexpr char kChain[] = R"pb(
cluster { num_servers: 2 lease_ms: 1000 }
checkpoint { every_clocks: 2 keep: 3 }
model {
  input_width: 6
  num_classes: 3
  combine: CHAIN
  segments { name: "front" layers { units: 4 activation: RELU } }
  segments { name: "back" input_width: 4 layers { units: 3 activation: SOFTMAX } }
}
optimizer { kind: ADAM }
training { staleness: 0 }
data { source: SYNTHETIC_SEED }
)pb";

// Two servers with checkpoint directories, and stage k's replica 0 as a
// worker registered through its own Membership.
class ChainCluster {
 public:
  explicit ChainCluster(const char* config = kChain) : config_(*ParseConfig(config, "chain_membership_test")) {
    for (size_t i = 0; i < 2; ++i) {
      ServerOptions options;
      options.clock = &clock_;
      options.tick = absl::ZeroDuration();
      options.checkpoint_dir = MakeTempDir();
      servers_.push_back(*ParameterServer::Create(config_, static_cast<uint32_t>(i), options));
    }
    for (size_t i = 0; i < 2; ++i) stubs_.push_back(std::make_unique<InProcessStub>(&servers_[i], i));
    for (int k = 0; k < config_.model().segments_size(); ++k) {
      stages_.push_back(std::make_unique<Membership>(std::vector<MembershipStub*>{stubs_[0].get(), stubs_[1].get()},
                                                     ModelFingerprint(config_),
                                                     servers_[0]->shard_map().fingerprint()));
    }
  }

  absl::StatusOr<Registration> Register(int stage) { return stages_[stage]->Register(stage, 0); }

  // Stage `stage` pushes `clock` to the servers in `to`.
  absl::Status Push(int stage, uint64_t clock, std::vector<size_t> to = {0, 1}) {
    for (size_t i : to) {
      const Range range = servers_[i]->shard_map().range(stage, static_cast<uint32_t>(i));
      v1::PushRequest push;
      push.set_segment(stage);
      push.set_worker_id(stages_[stage]->worker_id(i));
      push.set_registration_secret(stages_[stage]->secret(i));
      push.set_clock(clock);
      EncodeFloat32(std::vector<float>(range.count, 0.01f * static_cast<float>(clock + 1)), range.offset,
                    push.mutable_gradient());
      v1::PushResponse response;
      SEGPS_RETURN_IF_ERROR(servers_[i]->Push(push, clock_.Now() + absl::Seconds(5), &response));
    }
    for (auto& server : servers_) server->FlushCheckpoints();
    return absl::OkStatus();
  }

  Membership& stage(int k) { return *stages_[k]; }
  std::vector<float> Values(size_t i, int stage) { return servers_[i]->shard(stage).Snapshot(); }

 private:
  v1::JobConfig config_;
  FakeClock clock_;
  std::vector<std::unique_ptr<ParameterServer>> servers_;
  std::vector<std::unique_ptr<InProcessStub>> stubs_;
  std::vector<std::unique_ptr<Membership>> stages_;
};

TEST(ChainMembership, ALaneIsAtACleanCutOnlyWhereEveryStageOnEveryServerIsAtOneClock) {
  ChainCluster chain;
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(chain.Register(k).ok());
  for (uint64_t c = 0; c < 3; ++c) {
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(chain.Push(k, c).ok());
  }
  absl::StatusOr<Registration> again = chain.Register(0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->lane_clock, std::optional<uint64_t>(3));
  EXPECT_EQ(again->start_clock, 3u);
  // The last stage pushed clock 3, the first did not: a lane torn between clocks.
  ASSERT_TRUE(chain.Push(1, 3).ok());
  again = chain.Register(0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->lane_clock, std::nullopt);
  // Both at 4, but the last stage's clock 4 reached server 0 only.
  ASSERT_TRUE(chain.Push(0, 3).ok());
  ASSERT_TRUE(chain.Push(1, 4, {0}).ok());
  again = chain.Register(0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->lane_clock, std::nullopt);
  // Every server holds a checkpoint of both stages at 0, 2 and 4 at most.
  for (uint64_t c : again->chain_checkpoint_clocks) EXPECT_TRUE(c % 2 == 0 && c <= 4) << c;
  ASSERT_FALSE(again->chain_checkpoint_clocks.empty());
}

TEST(ChainMembership, AChainRollsBackEveryStageToACheckpointTheyAllHoldOrChangesNothing) {
  ChainCluster chain;
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(chain.Register(k).ok());
  std::vector<std::vector<float>> at_two;
  for (uint64_t c = 0; c < 5; ++c) {
    if (c == 2) at_two = {chain.Values(0, 0), chain.Values(0, 1)};
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(chain.Push(k, c).ok());
  }
  ASSERT_TRUE(chain.Push(1, 5).ok());  // the last stage one clock ahead
  absl::StatusOr<Registration> joined = chain.Register(0);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(joined->lane_clock, std::nullopt);
  // Clock 3 is no checkpoint: refused, naming the clocks there are, and nothing changes.
  const absl::Status refused = chain.stage(0).RollBackChain(0, 3);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("no checkpoint of every stage of the chain at clock 3"), std::string::npos)
      << refused;
  EXPECT_TRUE(chain.Push(1, 6).ok()) << "the last stage's registration still holds";
  ASSERT_TRUE(chain.stage(0).RollBackChain(0, 2).ok());
  // Every registration of every stage was dropped; both stages are back at 2.
  EXPECT_EQ(chain.Push(1, 7).code(), absl::StatusCode::kNotFound);
  for (int k = 0; k < 2; ++k) {
    absl::StatusOr<Registration> back = chain.Register(k);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->start_clock, 2u) << "stage " << k;
    EXPECT_EQ(back->lane_clock, std::optional<uint64_t>(2)) << "stage " << k;
    EXPECT_EQ(chain.Values(0, k), at_two[k]) << "stage " << k << "'s parameters are its checkpoint's";
  }
  // At its checkpoint already and untouched: another rollback there, even
  // within the second, changes nothing and keeps the registrations.
  ASSERT_TRUE(chain.stage(0).RollBackChain(0, 2).ok());
  EXPECT_TRUE(chain.Push(1, 2).ok()) << "the last stage's new registration still holds";
}

// Segments that are no chain do not roll back together.
TEST(ChainMembership, AnEnsembleRefusesAChainRollback) {
  std::string ensemble = kChain;
  ensemble.replace(ensemble.find("combine: CHAIN"), 14, "");
  ensemble.replace(ensemble.find("input_width: 4 "), 15, "");
  ensemble.replace(ensemble.find("units: 4 activation: RELU"), 25, "units: 3 activation: SOFTMAX");
  ChainCluster cluster(ensemble.c_str());
  ASSERT_TRUE(cluster.Register(0).ok());
  ASSERT_TRUE(cluster.Push(0, 0).ok());
  const absl::Status refused = cluster.stage(0).RollBackChain(0, 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("chain is for a model of combine: CHAIN"), std::string::npos) << refused;
  EXPECT_TRUE(cluster.Push(0, 1).ok()) << "the registration still holds";
}

}  // namespace
}  // namespace segps
