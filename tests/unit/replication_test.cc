// Replication's core (cluster.replicas): a primary's shard hands each
// change to its log in order, a backup's copy takes the records and holds
// the range bit for bit, refuses records that do not fit, and a push is
// answered only once every backup holds it.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <random>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/tensor_wire.h"
#include "server/parameter_server.h"
#include "server/replica_log.h"
#include "server/replica_range.h"
#include "server/replica_wire.h"
#include "server/segment_shard.h"
#include "tests/support/registration.h"

namespace segps {
namespace {

constexpr uint64_t kOffset = 40, kCount = 24;
constexpr uint32_t kPrimary = 0, kBackup = 1;

const char kConfig[] = R"pb(
cluster { num_servers: 2 replicas: 2 }
model {
  input_width: 5
  num_classes: 3
  segments { name: "a" layers { units: 4 activation: TANH } layers { units: 3 activation: SOFTMAX } }
}
optimizer { kind: ADAM }
training { staleness: 0 workers_per_segment: 1 }
data { source: SYNTHETIC_SEED }
)pb";

// The config's optimizer: Adam with its defaults.
v1::OptimizerConfig Adam() { return ParseConfig(kConfig, "test")->optimizer(); }

class ReplicaRangeTest : public ::testing::Test {
 protected:
  // An asynchronous shard of range [kOffset, +kCount) with Adam, two
  // ranks, pushes weighted by their samples, its changes going to log_.
  void SetUp() override {
    ShardOptions options;
    options.range = {kOffset, kCount};
    options.staleness = -1;
    options.max_clock_ahead = 4;
    options.lease = absl::Seconds(60);
    options.clock = &clock_;
    options.ranks = 2;
    options.batch_size = 8;
    options.replicas = &log_;
    std::vector<float> initial(kCount);
    for (size_t i = 0; i < kCount; ++i) initial[i] = 0.1f * static_cast<float>(i) - 1.0f;
    shard_ = std::make_unique<SegmentShard>(options, initial, *CreateOptimizer(Adam(), kCount));
    ASSERT_TRUE(shard_->Register(1, 0, std::nullopt).ok());
    ASSERT_TRUE(shard_->Register(2, 1, std::nullopt).ok());
  }

  std::unique_ptr<ReplicaRange> Backup() {
    return std::make_unique<ReplicaRange>(0, kPrimary, Range{kOffset, kCount}, 2, *CreateOptimizer(Adam(), kCount));
  }

  // How a push's bytes are held: borrowed, as a transport's buffers
  // (FromPieces), or in a shared region (Mapped).
  enum class Held { kBorrowed, kTransport, kRegion };

  // Worker `id` pushes a random chunk [first, first + count) of its step
  // `clock`, its bytes held as `held`: where they lay.
  const char* PushChunk(uint64_t id, uint64_t clock, uint64_t first, uint64_t count, uint32_t samples,
                        Held held = Held::kBorrowed) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> grad(count);
    for (float& g : grad) g = u(rng_);
    v1::TensorSlice slice;
    EncodeFloat32(grad, kOffset + first, &slice);
    auto data = std::make_shared<std::string>(std::move(*slice.mutable_data()));
    const absl::string_view at = *data;
    const Payload bytes = held == Held::kBorrowed    ? Payload::Borrow(at)
                          : held == Held::kTransport ? Payload::FromPieces({at}, data)
                                                     : Payload::Mapped(at, data);
    DenseView view(slice, bytes);
    PushInfo info;
    info.samples = samples;
    info.max_abs_gradient = 1.0f;
    bool done = false;
    shard_->Push(id, clock, first, &view, clock_.Now() + absl::Seconds(5), nullptr,
                 [&](absl::StatusOr<PushResult> r) {
                   EXPECT_TRUE(r.ok()) << r.status();
                   done = true;
                 }, info);
    EXPECT_TRUE(done);
    return at.data();
  }

  // Both workers push `steps` steps in two chunks each, interleaved.
  void Train(uint64_t from, uint64_t steps) {
    for (uint64_t c = from; c < from + steps; ++c) {
      PushChunk(1, c, 0, 10, 8);
      PushChunk(2, c, 0, 10, 5);
      PushChunk(2, c, 10, kCount - 10, 5);
      PushChunk(1, c, 10, kCount - 10, 8);
    }
  }

  // Takes the log's records as the Replicate stream does: encoded, then
  // decoded from bytes cut into 13-byte slices, so that the gradient's
  // floats lie split and misaligned across them.
  static void Feed(ReplicaLog& log, ReplicaRange& backup) {
    for (const ReplicaLog::Record& record : log.Take(kBackup)) {
      grpc::ByteBuffer sent = EncodeRecord(*record);
      std::vector<grpc::Slice> whole, cut;
      ASSERT_TRUE(sent.Dump(&whole).ok());
      std::string bytes;
      for (const grpc::Slice& s : whole) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      for (size_t at = 0; at < bytes.size(); at += 13) cut.emplace_back(bytes.substr(at, 13));
      v1::ReplicaRecord decoded;
      Payload gradient;
      ASSERT_TRUE(DecodeRecord(grpc::ByteBuffer(cut.data(), cut.size()), &decoded, &gradient).ok());
      ASSERT_TRUE(backup.Take(decoded, gradient).ok());
    }
  }

  FakeClock clock_;
  std::mt19937 rng_{7};
  ReplicaLog log_{0, kPrimary, {kBackup}};
  std::unique_ptr<SegmentShard> shard_;
};

TEST_F(ReplicaRangeTest, ABackupFedThePrimarysRecordsHoldsItsRangeBitForBit) {
  std::unique_ptr<ReplicaRange> backup = Backup();
  shard_->SyncReplica(kBackup);
  Train(0, 6);
  Feed(log_, *backup);
  EXPECT_EQ(backup->Digest(), shard_->Digest());
  EXPECT_EQ(backup->Snapshot().values, shard_->Snapshot());
  EXPECT_EQ(backup->position().seq, log_.last());
  // Positions: both ranks at clock 6.
  const ReplicaRange::Copy copy = backup->Snapshot();
  ASSERT_EQ(copy.ranks.size(), 2u);
  for (const auto& [rank, at] : copy.ranks) {
    EXPECT_EQ(at.next_clock(), 6u) << rank;
    EXPECT_EQ(at.applied(), 0u) << rank;
  }
  // A backup whose link opened again mid-run starts from the state and
  // follows on from there.
  Train(6, 2);
  std::unique_ptr<ReplicaRange> fresh = Backup();
  shard_->SyncReplica(kBackup);
  Train(8, 3);
  Feed(log_, *fresh);
  EXPECT_EQ(fresh->Digest(), shard_->Digest());
  EXPECT_EQ(fresh->Snapshot().values, shard_->Snapshot());
}

// A push's record holds the push's own bytes only where they stay as they
// are (a transport's buffers); borrowed bytes, and a shared region's that
// its worker may write again, are copied. The backup ends equal either way.
TEST_F(ReplicaRangeTest, ARecordHoldsAPushsOwnBytesOnlyWhereTheyCannotChange) {
  std::unique_ptr<ReplicaRange> backup = Backup();
  shard_->SyncReplica(kBackup);
  const Held holds[] = {Held::kTransport, Held::kRegion, Held::kBorrowed, Held::kTransport};
  std::vector<const char*> sent;
  for (uint64_t c = 0; c < 4; ++c) {
    sent.push_back(PushChunk(1, c, 0, kCount, 8, holds[c]));
    PushChunk(2, c, 0, kCount, 8);
  }
  const std::vector<ReplicaLog::Record> records = log_.Take(kBackup);
  ASSERT_EQ(records.size(), 9u);  // the state, then two pushes a clock
  for (uint64_t c = 0; c < 4; ++c) {
    const ReplicaChange& change = *records[1 + 2 * c];
    ASSERT_EQ(change.record.push().rank(), 0u);
    ASSERT_EQ(change.gradient.pieces().size(), 1u);
    EXPECT_EQ(change.gradient.pieces()[0].data() == sent[c], holds[c] == Held::kTransport) << c;
    EXPECT_NE(change.gradient.owner(), nullptr) << c;  // held as long as the record
  }
  for (const ReplicaLog::Record& record : records) ASSERT_TRUE(backup->Take(record->record, record->gradient).ok());
  EXPECT_EQ(backup->Digest(), shard_->Digest());
}

TEST_F(ReplicaRangeTest, RecordsThatDoNotFitAreRefusedAndChangeNothing) {
  std::unique_ptr<ReplicaRange> backup = Backup();
  shard_->SyncReplica(kBackup);
  Train(0, 1);
  std::vector<ReplicaLog::Record> records = log_.Take(kBackup);
  ASSERT_EQ(records.size(), 5u);  // the state, then four chunks
  auto take = [&](const ReplicaLog::Record& r) { return backup->Take(r->record, r->gradient); };
  // No push before the state.
  EXPECT_EQ(take(records[1]).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(take(records[0]).ok());
  const std::string before = backup->Digest();
  // `record` with gradient bytes `bytes`.
  auto refused = [&](const v1::ReplicaRecord& record, absl::string_view bytes, absl::StatusCode code) {
    EXPECT_EQ(backup->Take(record, Payload::Borrow(bytes)).code(), code) << record.ShortDebugString();
    EXPECT_EQ(backup->Digest(), before);
  };
  std::string bytes;
  for (absl::string_view piece : records[1]->gradient.pieces()) bytes.append(piece.data(), piece.size());
  const v1::ReplicaRecord push = records[1]->record;
  refused(records[2]->record, bytes, absl::StatusCode::kFailedPrecondition);  // skips record 1
  v1::ReplicaRecord bad = push;
  bad.mutable_gradient()->set_offset(kOffset + kCount);  // past the range
  refused(bad, bytes, absl::StatusCode::kInvalidArgument);
  bad = push;
  bad.mutable_gradient()->set_dtype(v1::BFLOAT16);
  refused(bad, bytes, absl::StatusCode::kInvalidArgument);
  refused(push, bytes.substr(0, 3), absl::StatusCode::kInvalidArgument);  // short
  std::string with_nan = bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  with_nan.replace(0, sizeof(float), reinterpret_cast<const char*>(&nan), sizeof(float));
  refused(push, with_nan, absl::StatusCode::kInvalidArgument);
  bad = push;
  bad.mutable_push()->set_rank(2);  // two ranks
  refused(bad, bytes, absl::StatusCode::kInvalidArgument);
  bad = push;
  bad.mutable_gradient()->set_offset(kOffset + 1);  // not where its rank's step stands
  refused(bad, bytes, absl::StatusCode::kFailedPrecondition);
  bad = records[0]->record;
  bad.mutable_state()->mutable_slots()->RemoveLast();
  refused(bad, "", absl::StatusCode::kInvalidArgument);
  bad.Clear();
  bad.set_seq(2);
  refused(bad, "", absl::StatusCode::kInvalidArgument);  // no change at all
  // The real ones are still taken, in order.
  for (size_t i = 1; i < records.size(); ++i) ASSERT_TRUE(take(records[i]).ok()) << i;
  EXPECT_EQ(backup->Digest(), shard_->Digest());
}

TEST(ReplicaWireTest, BytesThatAreNotARecordAreRefusedNamingTheStream) {
  for (const std::string& bytes : {std::string("\xff\xff\xff"), std::string("\x3a\x05\x22\x09xy")}) {
    const grpc::Slice slice(bytes);
    v1::ReplicaRecord record;
    Payload gradient;
    const absl::Status decoded = DecodeRecord(grpc::ByteBuffer(&slice, 1), &record, &gradient);
    EXPECT_EQ(decoded.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(decoded.message().find("Replicate: malformed message"), std::string::npos) << decoded;
  }
}


// A backup dropped (out of reach for a lease) holds no push back and
// queues nothing; once its link opens again (Restart) it is sent the whole
// state, and later pushes wait for it again.
TEST(ReplicaLogTest, ADroppedBackupHoldsNothingBackUntilItsLinkOpensAgain) {
  ReplicaLog log(0, 0, {1, 2});
  v1::ReplicaRecord change;
  change.mutable_push()->set_rank(0);
  bool first_held = false, second_held = false, third_held = false;
  const uint64_t first = log.Append(change);
  log.WhenHeld(first, [&](absl::Status status) { first_held = status.ok(); });
  log.Acked(1, first);
  EXPECT_FALSE(first_held);  // backup 2 has not taken it
  log.Drop(2);
  EXPECT_TRUE(first_held);
  EXPECT_TRUE(log.Take(2).empty());
  const uint64_t second = log.Append(change);
  EXPECT_TRUE(log.Take(2).empty());  // nothing queues for a dropped backup
  EXPECT_EQ(log.Take(1).size(), 2u);
  log.WhenHeld(second, [&](absl::Status status) { second_held = status.ok(); });
  EXPECT_FALSE(second_held);  // backup 1 is live
  log.Acked(1, second);
  EXPECT_TRUE(second_held);
  log.Restart(2, v1::ReplicaRecord());
  const std::vector<ReplicaLog::Record> state = log.Take(2);
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0]->record.seq(), second);
  const uint64_t third = log.Append(change);
  log.WhenHeld(third, [&](absl::Status status) { third_held = status.ok(); });
  log.Acked(1, third);
  EXPECT_FALSE(third_held);  // backup 2 is back
  log.Acked(2, third);
  EXPECT_TRUE(third_held);
}

TEST(ReplicatedServerTest, APushIsAnsweredOnlyOnceItsBackupHoldsIt) {
  const v1::JobConfig config = *ParseConfig(kConfig, "test");
  FakeClock clock;
  ServerOptions options;
  options.clock = &clock;
  options.tick = absl::ZeroDuration();
  std::unique_ptr<ParameterServer> server = *ParameterServer::Create(config, 0, options);
  ASSERT_EQ(server->replica_logs().size(), 1u);
  ReplicaLog& log = *server->replica_logs()[0];
  EXPECT_EQ(log.backups(), std::vector<uint32_t>{1});
  ASSERT_NE(server->copy(0, 1), nullptr);  // it backs server 1's range
  const Range range = server->shard_map().range(0, 0);
  v1::PushRequest push = RegisteredPush(config, server.get(), 0.25f);
  auto send = [&](absl::optional<absl::Status>* outcome, v1::PushResponse* response) {
    server->Push(push, Payload::Borrow(push.gradient().data()), clock.Now() + absl::Seconds(5), nullptr, response,
                 [outcome](absl::Status s) { *outcome = s; });
  };
  absl::optional<absl::Status> first, retry;
  v1::PushResponse first_response, retry_response;
  send(&first, &first_response);
  EXPECT_FALSE(first.has_value()) << "answered before its backup held it";
  EXPECT_EQ(server->Waiting(), 1u);
  v1::StatsResponse stats;
  server->Stats(&stats);
  EXPECT_EQ(stats.waiting_for_backups(), 1u);
  send(&retry, &retry_response);  // the worker retries: acknowledged, also once the backup holds it
  EXPECT_FALSE(retry.has_value());
  // The backup's link opens: the state holds the push.
  server->SyncReplicas(1);
  std::vector<ReplicaLog::Record> records = log.Take(1);
  ASSERT_FALSE(records.empty());
  ReplicaRange backup(0, 0, range, 1, *CreateOptimizer(config.optimizer(), range.count));
  for (const ReplicaLog::Record& record : records) ASSERT_TRUE(backup.Take(record->record, record->gradient).ok());
  EXPECT_FALSE(first.has_value());
  log.Acked(1, backup.position().seq);
  ASSERT_TRUE(first.has_value() && retry.has_value());
  EXPECT_TRUE(first->ok()) << *first;
  EXPECT_TRUE(retry->ok()) << *retry;
  EXPECT_TRUE(first_response.applied());
  EXPECT_FALSE(retry_response.applied());
  EXPECT_EQ(server->Waiting(), 0u);
  EXPECT_EQ(backup.Digest(), server->shard(0).Digest());
}

TEST(ReplicatedServerTest, AHelloIsCheckedForTheRingAndTheJob) {
  const v1::JobConfig config = *ParseConfig(kConfig, "test");
  ServerOptions sealed;
  sealed.tick = absl::ZeroDuration();
  sealed.authenticated = true;
  sealed.state_key = "servers' key";
  std::unique_ptr<ParameterServer> zero = *ParameterServer::Create(config, 0, sealed);
  std::unique_ptr<ParameterServer> one = *ParameterServer::Create(config, 1, sealed);
  EXPECT_TRUE(one->CheckHello(zero->Hello(1)).ok());
  EXPECT_EQ(zero->CheckHello(zero->Hello(1)).code(), absl::StatusCode::kFailedPrecondition);  // not server 0
  v1::ReplicaHello forged = zero->Hello(1);
  forged.set_incarnation(forged.incarnation() + 1);
  EXPECT_EQ(one->CheckHello(forged).code(), absl::StatusCode::kPermissionDenied);
  forged = zero->Hello(1);
  forged.clear_proof();
  EXPECT_EQ(one->CheckHello(forged).code(), absl::StatusCode::kPermissionDenied);
  // A record of a range its sender is not the primary of.
  v1::ReplicaRecord record;
  record.set_range(1);
  EXPECT_EQ(one->TakeReplica(0, record, Payload()).code(), absl::StatusCode::kInvalidArgument);
  record.set_range(0);
  record.set_segment(5);
  EXPECT_EQ(one->TakeReplica(0, record, Payload()).code(), absl::StatusCode::kNotFound);
}

// A server serving a range taken over (ServeAlone: no backup to wait for)
// answers a push at once. Handed over, it gives the range's state as
// applied, which another server takes back whole, and refuses every call
// from then on, naming why: nothing changes the range after its state left.
TEST(ReplicatedServerTest, ARangeHandedOverRefusesEveryCallAndItsStateIsAllThatWasApplied) {
  const v1::JobConfig config = *ParseConfig(kConfig, "test");
  ServerOptions options;
  options.tick = absl::ZeroDuration();
  std::unique_ptr<ParameterServer> taken = *ParameterServer::Create(config, 0, options);
  taken->ServeAlone();
  v1::PushRequest push = RegisteredPush(config, taken.get(), 0.25f);
  v1::PushResponse pushed;
  ASSERT_TRUE(taken->Push(push, absl::InfiniteFuture(), &pushed).ok());
  EXPECT_TRUE(pushed.applied());
  const std::string digest = taken->shard(0).Digest();

  std::vector<v1::ReplicaRecord> states = taken->HandOver("server 0 is back");
  ASSERT_EQ(states.size(), 1u);
  ASSERT_TRUE(states[0].has_state());
  push.set_clock(1);
  const absl::Status late = taken->Push(push, absl::InfiniteFuture(), &pushed);
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  EXPECT_NE(late.message().find("server 0 is back"), std::string::npos) << late;
  v1::RegisterResponse registered;
  const absl::Status again = taken->Register(RegistrationFor(config, *taken), &registered);
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
  EXPECT_EQ(taken->shard(0).Digest(), digest) << "the range changed after it was handed over";

  std::unique_ptr<ParameterServer> back = *ParameterServer::Create(config, 0, options);
  back->BeginTakeBack();
  ASSERT_TRUE(back->TakeBack(0, states[0]).ok());
  back->EndTakeBack();
  EXPECT_EQ(back->shard(0).Digest(), digest);
  EXPECT_EQ(back->shard(0).RankPosition(0).first, 1u) << "rank 0 continues after its one step";
}

// A reader reads a backup's copy of another server's range
// (PullRequest.copy_of) once the copy holds a state: the primary's values,
// as the primary gives them. Every other use is refused, naming the field.
TEST(ReplicatedServerTest, ACopyIsReadByAReaderWithinItsRangeOnceItHoldsAState) {
  const v1::JobConfig config = *ParseConfig(kConfig, "test");
  ServerOptions options;
  options.tick = absl::ZeroDuration();
  std::unique_ptr<ParameterServer> zero = *ParameterServer::Create(config, 0, options);
  std::unique_ptr<ParameterServer> one = *ParameterServer::Create(config, 1, options);
  const Range range = zero->shard_map().range(0, 0);
  v1::PullRequest read;
  read.set_reader(true);
  read.set_copy_of(0);
  v1::PullResponse copy;
  EXPECT_EQ(one->Pull(read, absl::InfiniteFuture(), &copy).code(), absl::StatusCode::kFailedPrecondition);
  zero->SyncReplicas(1);  // the range's whole state, as a link opening sends it
  for (const ReplicaLog::Record& record : zero->replica_logs()[0]->Take(1)) {
    ASSERT_TRUE(one->TakeReplica(0, record->record, record->gradient).ok());
  }
  ASSERT_TRUE(one->Pull(read, absl::InfiniteFuture(), &copy).ok());
  v1::PullRequest primary_read;
  primary_read.set_reader(true);
  v1::PullResponse primary;
  ASSERT_TRUE(zero->Pull(primary_read, absl::InfiniteFuture(), &primary).ok());
  EXPECT_EQ(copy.values().offset(), range.offset);
  EXPECT_EQ(copy.values().count(), range.count);
  EXPECT_EQ(copy.values().data(), primary.values().data());
  struct Bad {
    const char* field;
    std::function<void(v1::PullRequest*)> change;
    absl::StatusCode code;
  };
  const std::vector<Bad> bad = {
      {"reader", [](v1::PullRequest* r) { r->set_reader(false); }, absl::StatusCode::kInvalidArgument},
      {"worker_id", [](v1::PullRequest* r) { r->set_worker_id(7); }, absl::StatusCode::kInvalidArgument},
      {"rows_only", [](v1::PullRequest* r) { r->set_rows_only(true); }, absl::StatusCode::kInvalidArgument},
      {"reply_region_offset", [](v1::PullRequest* r) { r->set_reply_region_offset(0); },
       absl::StatusCode::kInvalidArgument},
      {"copy_of", [](v1::PullRequest* r) { r->set_copy_of(1); }, absl::StatusCode::kNotFound},
      {"copy_of", [](v1::PullRequest* r) { r->set_copy_of(9); }, absl::StatusCode::kNotFound},
      {"offset", [&](v1::PullRequest* r) { r->set_offset(range.end()); r->set_count(1); },
       absl::StatusCode::kInvalidArgument},
      {"count", [&](v1::PullRequest* r) { r->set_offset(range.offset); r->set_count(range.count + 1); },
       absl::StatusCode::kInvalidArgument},
      {"dtype", [](v1::PullRequest* r) { r->set_dtype(static_cast<v1::DType>(99)); },
       absl::StatusCode::kInvalidArgument},
  };
  for (const Bad& b : bad) {
    v1::PullRequest request = read;
    b.change(&request);
    v1::PullResponse response;
    const absl::Status status = one->Pull(request, absl::InfiniteFuture(), &response);
    EXPECT_EQ(status.code(), b.code) << b.field << ": " << status;
    EXPECT_NE(status.message().find("Pull copy_of"), std::string::npos) << b.field << ": " << status;
  }
}

}  // namespace
}  // namespace segps
