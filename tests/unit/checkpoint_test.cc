#include "server/checkpoint.h"

#include "server/checkpoint_report.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/embedding.h"
#include "common/safetensors.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

// Two servers over segment "a" (50 -> 16 -> 10: 986 parameters), Adam:
// server 0's range ends at element 493, inside the first kernel [50, 16]
// (800 elements), which it cuts.
v1::JobConfig Job(const std::string& dir, uint32_t servers = 2, v1::OptimizerKind kind = v1::ADAM,
                  const std::string& optimizer = "") {
  absl::StatusOr<v1::JobConfig> config = ParseConfig(absl::StrFormat(R"pb(
    name: "ckpt"
    cluster { num_servers: %u }
    model {
      input_width: 50
      num_classes: 10
      segments { name: "a" layers { units: 16 activation: RELU } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { kind: %s %s }
    data { source: SYNTHETIC_TEACHER }
    checkpoint { dir: "%s" every_clocks: 10 keep: 2 }
  )pb", servers, v1::OptimizerKind_Name(kind), optimizer, dir), "test.pbtxt");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

ShardState StateOf(uint64_t clock, uint64_t n, size_t slots) {
  ShardState state;
  state.clock = clock;
  state.steps = clock * 2;
  state.updates = clock * 2;
  state.ranks = {0, 1};
  for (uint64_t i = 0; i < n; ++i) state.values.push_back(static_cast<float>(clock) + 0.001f * i);
  for (size_t s = 0; s < slots; ++s) state.slots.emplace_back(n, static_cast<float>(s + 1) * clock);
  return state;
}

TEST(Checkpoint, RoundTripsStateWithUserNamesAndPartsOfCutTensors) {
  const std::string dir = MakeTempDir();
  const v1::JobConfig config = Job(dir);
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(config, 0, dir);
  ASSERT_TRUE(store.ok()) << store.status();
  const uint64_t n = 493;  // server 0's range of 986
  const ShardState state = StateOf(10, n, 2);
  ASSERT_TRUE((*store)->Write(0, state).ok());
  EXPECT_EQ((*store)->Path(0, 10), dir + "/a/clock-000000000010/server-0-of-2.safetensors");
  absl::StatusOr<ShardState> back = (*store)->Read(0, 10);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->values, state.values);
  EXPECT_EQ(back->slots, state.slots);
  EXPECT_EQ(back->steps, 20u);
  EXPECT_EQ(back->ranks, state.ranks);

  // What another tool sees: the cut kernel stored flat with its offset, slots beside it.
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read((*store)->Path(0, 10));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors().at("a/dense_0/kernel").shape, (std::vector<uint64_t>{493}));
  EXPECT_EQ(file->metadata().at("segps.part.a/dense_0/kernel"), "0 of 50x16");
  EXPECT_EQ(file->tensors().count("a/dense_0/kernel/adam_m"), 1u);
  EXPECT_EQ(file->tensors().count("a/dense_0/bias"), 0u);  // server 1's
  EXPECT_EQ(file->metadata().at("segps.clock"), "10");
  const std::string manifest = ReadFile(dir + "/server-0-of-2.json");
  EXPECT_NE(manifest.find("\"clocks\":[10]"), std::string::npos) << manifest;
  EXPECT_NE(manifest.find("\"optimizer_slots\":[\"adam_m\",\"adam_v\"]"), std::string::npos) << manifest;

  // Server 1 stores the rest of that kernel with its offset, and whole tensors with their shapes.
  absl::StatusOr<std::unique_ptr<CheckpointStore>> other = CheckpointStore::Open(config, 1, dir);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Write(0, StateOf(10, 493, 2)).ok());
  file = SafetensorsFile::Read((*other)->Path(0, 10));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("segps.part.a/dense_0/kernel"), "493 of 50x16");
  EXPECT_EQ(file->tensors().at("a/dense_1/kernel").shape, (std::vector<uint64_t>{16, 10}));
}

TEST(Checkpoint, KeepsTheNewestAndFindsThemAgainAtOpen) {
  const std::string dir = MakeTempDir();
  const v1::JobConfig config = Job(dir);
  {
    std::unique_ptr<CheckpointStore> store = *CheckpointStore::Open(config, 0, dir);
    for (uint64_t c : {0, 10, 20}) ASSERT_TRUE(store->Write(0, StateOf(c, 493, 2)).ok());
    EXPECT_EQ(store->Clocks(0), (std::vector<uint64_t>{10, 20}));
    EXPECT_FALSE(std::filesystem::exists(store->Path(0, 0)));
  }
  std::unique_ptr<CheckpointStore> reopened = *CheckpointStore::Open(config, 0, dir);
  EXPECT_EQ(reopened->Clocks(0), (std::vector<uint64_t>{10, 20}));
  absl::StatusOr<std::optional<ShardState>> latest = reopened->Latest(0);
  ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
  EXPECT_EQ((*latest)->clock, 20u);
}

// Early stopping keeps the newest patience + 2 epoch ends besides `keep`,
// and ending a segment drops the checkpoints after its end.
TEST(Checkpoint, EpochEndsEarlyStoppingNeedsAreKeptAndTheNewerDroppedAtTheEnd) {
  const std::string dir = MakeTempDir();
  v1::JobConfig config = Job(dir);
  config.mutable_training()->mutable_early_stopping()->set_patience(1);
  std::unique_ptr<CheckpointStore> store = *CheckpointStore::Open(config, 0, dir);
  for (uint64_t c : {0, 10, 15, 20, 30, 40, 45, 50}) {
    ShardState state = StateOf(c, 493, 2);
    state.epoch_clocks = 15;
    ASSERT_TRUE(store->Write(0, state).ok());
  }
  // keep: 2 gives 45 and 50; the three newest epoch ends, 45, 30 and 15, stay too.
  EXPECT_EQ(store->Clocks(0), (std::vector<uint64_t>{15, 30, 45, 50}));
  ASSERT_TRUE(store->DropAfter(0, 30).ok());
  EXPECT_EQ(store->Clocks(0), (std::vector<uint64_t>{15, 30}));
  EXPECT_FALSE(std::filesystem::exists(store->Path(0, 50)));
  EXPECT_EQ((*(*CheckpointStore::Open(config, 0, dir))->Latest(0))->clock, 30u);
}

// A damaged newest file is refused with its name, and the one before is used.
TEST(Checkpoint, DamagedOrTruncatedNewestFallsBackToThePreviousNamingTheFile) {
  for (const char* damage : {"flip", "truncate", "torn write"}) {
    SCOPED_TRACE(damage);
    const std::string dir = MakeTempDir();
    const v1::JobConfig config = Job(dir);
    std::unique_ptr<CheckpointStore> store = *CheckpointStore::Open(config, 0, dir);
    ASSERT_TRUE(store->Write(0, StateOf(10, 493, 2)).ok());
    ASSERT_TRUE(store->Write(0, StateOf(20, 493, 2)).ok());
    const std::string newest = store->Path(0, 20);
    std::string bytes = ReadFile(newest);
    if (std::string(damage) == "flip") {
      bytes[bytes.size() - 100] ^= 0x10;  // a bit of the data
    } else if (std::string(damage) == "truncate") {
      bytes.resize(bytes.size() / 2);
    } else {
      // A writer killed mid-write without the rename: the old name holds a
      // prefix and its temporary file lies beside it.
      WriteFile(newest + ".tmp.12345", bytes.substr(0, 100));
      bytes.resize(300);
    }
    WriteFile(newest, bytes);
    std::unique_ptr<CheckpointStore> reopened = *CheckpointStore::Open(config, 0, dir);
    absl::StatusOr<ShardState> bad = reopened->Read(0, 20);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(std::string(bad.status().message()).find(newest), std::string::npos) << bad.status();
    absl::StatusOr<std::optional<ShardState>> latest = reopened->Latest(0);
    ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
    EXPECT_EQ((*latest)->clock, 10u);
    EXPECT_EQ((*latest)->values, StateOf(10, 493, 2).values);
    EXPECT_EQ(reopened->Clocks(0), (std::vector<uint64_t>{10}));
  }
}

// Refused naming each field that differs, with both values, and the
// server count (a matter of re-cutting the files, not of the model); only
// the optimizer settings that change between runs of one job
// (CompareForResume) resume, and the refusal names neither those nor a
// fingerprint.
TEST(Checkpoint, AnotherJobsCheckpointIsRefusedNamingWhatDiffers) {
  const std::string dir = MakeTempDir();
  {
    std::unique_ptr<CheckpointStore> store = *CheckpointStore::Open(Job(dir, 2, v1::ADAM, "learning_rate: 0.001"), 0, dir);
    ASSERT_TRUE(store->Write(0, StateOf(10, 493, 2)).ok());
  }
  {
    // A learning rate may change between runs: the checkpoint resumes, saying so.
    std::unique_ptr<CheckpointStore> store = *CheckpointStore::Open(Job(dir, 2, v1::ADAM, "learning_rate: 0.003"), 0, dir);
    absl::StatusOr<std::optional<ShardState>> latest = store->Latest(0);
    ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
    EXPECT_EQ((*latest)->changed,
              std::vector<std::string>{"optimizer.learning_rate: 0.003 here, 0.001 in the checkpoint"});
  }
  const std::pair<v1::JobConfig, std::string> others[] = {
      {Job(dir, 2, v1::ADAM, "learning_rate: 0.003 epsilon: 0.01"), "optimizer.epsilon: 0.01 here, "},
      {Job(dir, 2, v1::SGD, "learning_rate: 0.001"), "optimizer.kind: SGD here, ADAM in the checkpoint"},
      {Job(dir, 3, v1::ADAM, "learning_rate: 0.001"), "server-0-of-2.safetensors"}};
  for (const auto& [other, expected] : others) {
    std::unique_ptr<CheckpointStore> store = *CheckpointStore::Open(other, 0, dir);
    absl::StatusOr<std::optional<ShardState>> latest = store->Latest(0);
    ASSERT_EQ(latest.status().code(), absl::StatusCode::kFailedPrecondition) << latest.status();
    const std::string message(latest.status().message());
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    if (other.cluster().num_servers() == 3) {
      EXPECT_NE(message.find("segps-checkpoint split"), std::string::npos) << message;
    } else {
      EXPECT_NE(message.find("a checkpoint of another model or optimizer"), std::string::npos) << message;
      EXPECT_EQ(message.find(CheckpointFingerprint(other)), std::string::npos) << "fingerprints say nothing: " << message;
      EXPECT_EQ(message.find("learning_rate"), std::string::npos) << "a setting that may change: " << message;
    }
  }
}

// A cut every few clocks logs its first checkpoint, its first wait for the
// disk, and then one line a segment an interval, summing up what happened.
TEST(CheckpointReport, TellsTheFirstAndThenSumsUpAnIntervalAtATime) {
  CheckpointReport report(1, absl::Seconds(30));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  std::optional<std::string> first = report.Written("relu64", 0, "/ck/relu64/0", absl::Milliseconds(2), t0);
  ASSERT_TRUE(first.has_value());
  EXPECT_NE(first->find("server 1: checkpoint of relu64 at clock 0 written to /ck/relu64/0"), std::string::npos) << *first;
  std::optional<std::string> wait = report.Waited("relu64", 7, t0 + absl::Seconds(1));
  ASSERT_TRUE(wait.has_value());
  EXPECT_NE(wait->find("checkpoint of relu64 at clock 7 waits for the disk"), std::string::npos) << *wait;
  // Another segment is told on its own.
  EXPECT_TRUE(report.Written("tanh128", 0, "/ck/tanh128/0", absl::Milliseconds(2), t0).has_value());
  int lines = 0;
  for (int i = 1; i <= 100; ++i) {  // a cut every 0.2 s for 20 s, every other one waiting (asked twice)
    const absl::Time now = t0 + absl::Milliseconds(200 * i);
    lines += report.Written("relu64", 14 * i, "/ck/relu64/" + std::to_string(14 * i), absl::Milliseconds(2), now)
                 .has_value();
    lines += report.Waited("relu64", 14 * i + 7, now).has_value();
    lines += report.Waited("relu64", 14 * i + 7, now).has_value();
  }
  EXPECT_EQ(lines, 0) << "within the interval nothing more is said";
  std::optional<std::string> summary =
      report.Written("relu64", 1414, "/ck/relu64/1414", absl::Milliseconds(2), t0 + absl::Seconds(31));
  ASSERT_TRUE(summary.has_value());
  EXPECT_NE(summary->find("checkpoints of relu64 in the last 31s: 101 written (newest at clock 1414, /ck/relu64/1414), "
                          "101 waited for the disk"),
            std::string::npos)
      << *summary;
}

// The servers' files of one clock merge into the whole tensors, and a
// merged file splits again for another server count, with the same state.
TEST(Checkpoint, MergeJoinsTheServersFilesAndSplitRecutsThemForThreeServers) {
  const std::string dir = MakeTempDir();
  const v1::JobConfig two = Job(dir + "/ckpt");
  const ShardMap map2 = *ShardMap::Create(two.model(), 2);
  // The whole segment's state: values v, Adam's m = 2v, v = 3v.
  std::vector<float> whole(map2.segment_size(0));
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = 0.5f + static_cast<float>(i);
  for (uint32_t server = 0; server < 2; ++server) {
    const Range r = map2.range(0, server);
    ShardState state;
    state.clock = 30;
    state.steps = state.updates = 60;
    state.ranks = {0};
    state.values.assign(whole.begin() + r.offset, whole.begin() + r.end());
    for (float scale : {2.0f, 3.0f}) {
      state.slots.emplace_back();
      for (float v : state.values) state.slots.back().push_back(scale * v);
    }
    ASSERT_TRUE((*CheckpointStore::Open(two, server, dir + "/ckpt"))->Write(0, state).ok());
  }
  ASSERT_TRUE(MergeCheckpoints(dir + "/ckpt", std::nullopt, true, dir + "/merged.safetensors").ok());
  absl::StatusOr<SafetensorsFile> merged = SafetensorsFile::Read(dir + "/merged.safetensors");
  ASSERT_TRUE(merged.ok()) << merged.status();
  const std::vector<float> kernel(whole.begin(), whole.begin() + 800);
  EXPECT_EQ(*merged->Float32("a/dense_0/kernel", {50, 16}), kernel);
  EXPECT_EQ(merged->Float32("a/dense_1/bias", {10})->back(), whole.back());
  EXPECT_EQ(merged->Float32("a/dense_0/kernel/adam_v", {50, 16})->at(799), 3 * whole[799]);
  EXPECT_EQ(merged->metadata().at("segps.clock.a"), "30");

  // Without every server's file a clock is not merged.
  std::filesystem::remove(dir + "/ckpt/a/clock-000000000030/server-1-of-2.safetensors");
  absl::Status incomplete = MergeCheckpoints(dir + "/ckpt", std::nullopt, true, dir + "/other.safetensors");
  EXPECT_EQ(incomplete.code(), absl::StatusCode::kNotFound) << incomplete;
  EXPECT_NE(std::string(incomplete.message()).find("1 files for 2 servers"), std::string::npos) << incomplete;

  v1::JobConfig three = Job(dir + "/three", 3);
  ASSERT_TRUE(SplitCheckpoint(dir + "/merged.safetensors", three, dir + "/three").ok());
  const ShardMap map3 = *ShardMap::Create(three.model(), 3);
  for (uint32_t server = 0; server < 3; ++server) {
    std::unique_ptr<CheckpointStore> store = *CheckpointStore::Open(three, server, dir + "/three");
    absl::StatusOr<std::optional<ShardState>> restored = store->Latest(0);
    ASSERT_TRUE(restored.ok() && restored->has_value()) << restored.status();
    const Range r = map3.range(0, server);
    EXPECT_EQ((*restored)->clock, 30u);
    EXPECT_EQ((*restored)->steps, 60u);
    EXPECT_EQ((*restored)->values, std::vector<float>(whole.begin() + r.offset, whole.begin() + r.end()));
    EXPECT_EQ((*restored)->slots[0][0], 2 * whole[r.offset]);
  }
}

// Embedding tables survive merge and split: the merged file holds each
// table whole (ids ascending; rows with their optimizer slots, or values
// only without), and a split re-deals the rows by the new server count.
TEST(Checkpoint, MergeAndSplitCarryEmbeddingTables) {
  const std::string dir = MakeTempDir();
  auto job = [&](const std::string& at, uint32_t servers) {
    absl::StatusOr<v1::JobConfig> config = ParseConfig(absl::StrFormat(R"pb(
      name: "tables"
      cluster { num_servers: %u }
      model {
        input_width: 4
        num_classes: 2
        categorical_fields: 1
        segments {
          name: "a"
          embeddings { name: "user" vocab: 1000 dim: 4 field: 0 }
          layers { units: 8 activation: RELU }
          layers { units: 2 activation: SOFTMAX }
        }
      }
      optimizer { kind: ADAM }
      data { source: SYNTHETIC_CTR }
      checkpoint { dir: "%s" every_clocks: 10 keep: 2 }
    )pb", servers, at), "tables.pbtxt");
    EXPECT_TRUE(config.ok()) << config.status();
    return *config;
  };
  const v1::JobConfig two = job(dir + "/ckpt", 2);
  const ShardMap map2 = *ShardMap::Create(two.model(), 2);
  constexpr uint64_t kStride = 12;  // 4 values, Adam's 4 m and 4 v
  auto row_of = [](uint64_t id) {
    std::vector<float> row(kStride);
    for (uint64_t i = 0; i < kStride; ++i) row[i] = static_cast<float>(id) + 0.01f * static_cast<float>(i);
    return row;
  };
  for (uint32_t server = 0; server < 2; ++server) {
    ShardState state;
    state.clock = 30;
    state.values.assign(map2.range(0, server).count, 0.25f);
    state.slots.assign(2, state.values);
    state.tables.resize(1);
    for (uint64_t id = 0; id < 1000; id += 7) {
      if (RowServer(0, 0, id, 2) != server) continue;
      state.tables[0].ids.push_back(id);
      const std::vector<float> row = row_of(id);
      state.tables[0].rows.insert(state.tables[0].rows.end(), row.begin(), row.end());
    }
    ASSERT_TRUE((*CheckpointStore::Open(two, server, dir + "/ckpt"))->Write(0, state).ok());
  }
  ASSERT_TRUE(MergeCheckpoints(dir + "/ckpt", std::nullopt, false, dir + "/values.safetensors").ok());
  absl::StatusOr<SafetensorsFile> values = SafetensorsFile::Read(dir + "/values.safetensors");
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->metadata().at("segps.embeddings.a/user"), "143 4");
  EXPECT_EQ(*values->Float32("embeddings/a/user/rows", {143, 4})->begin(), 0.0f);
  ASSERT_TRUE(MergeCheckpoints(dir + "/ckpt", std::nullopt, true, dir + "/merged.safetensors").ok());

  const v1::JobConfig three = job(dir + "/three", 3);
  ASSERT_TRUE(SplitCheckpoint(dir + "/merged.safetensors", three, dir + "/three").ok());
  size_t rows = 0;
  for (uint32_t server = 0; server < 3; ++server) {
    absl::StatusOr<std::optional<ShardState>> restored =
        (*CheckpointStore::Open(three, server, dir + "/three"))->Latest(0);
    ASSERT_TRUE(restored.ok() && restored->has_value()) << restored.status();
    const TableState& table = (*restored)->tables.at(0);
    for (size_t r = 0; r < table.ids.size(); ++r) {
      EXPECT_EQ(table.ids[r] % 7, 0u);
      EXPECT_EQ(RowServer(0, 0, table.ids[r], 3), server);
      const std::vector<float> row(table.rows.begin() + r * kStride, table.rows.begin() + (r + 1) * kStride);
      EXPECT_EQ(row, row_of(table.ids[r])) << "id " << table.ids[r];
    }
    rows += table.ids.size();
  }
  EXPECT_EQ(rows, 143u);
}

}  // namespace
}  // namespace segps
