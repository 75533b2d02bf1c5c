// Embedding tables: the server's rows (initial values, lazy optimizer
// updates, the budget, checkpoints), the checks on rows from the wire, the
// worker's batch of rows, and one worker training against servers over
// loopback gRPC, step for step against a single-process reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/embedding.h"
#include "common/hash.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/checkpoint.h"
#include "server/server_metrics.h"
#include "server/row_requests.h"
#include "tests/support/inprocess_cluster.h"
#include "tests/support/reference_training.h"
#include "tests/support/subprocess.h"
#include "worker/client/ps_client.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/model/embedding_lookup.h"
#include "worker/train/trainer.h"

namespace segps {
namespace {

// One segment "ctr" with a table "user" (field 0) and a table "item"
// looked up by fields 1 and 2, before 16 -> 2 dense layers.
v1::JobConfig CtrJob(v1::OptimizerKind kind, uint32_t servers = 2, const std::string& extra = "") {
  absl::StatusOr<v1::JobConfig> config = ParseConfig(absl::StrFormat(R"pb(
    name: "ctr-test"
    seed: 11
    cluster { num_servers: %u lease_ms: 60000 %s }
    model {
      input_width: 4
      num_classes: 2
      categorical_fields: 3
      segments {
        name: "ctr"
        embeddings { name: "user" vocab: 1000000 dim: 4 field: 0 }
        embeddings { name: "item" vocab: 500 dim: 3 field: 1 field: 2 }
        layers { units: 16 activation: RELU }
        layers { units: 2 activation: SOFTMAX }
      }
    }
    optimizer { kind: %s learning_rate: 0.1 }
    training { batch_size: 32 epochs: 2 }
    data { source: SYNTHETIC_CTR train_samples: 640 test_samples: 200 }
  )pb", servers, extra, v1::OptimizerKind_Name(kind)), "ctr-test.pbtxt");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

v1::EmbeddingConfig Table(uint32_t dim) {
  v1::EmbeddingConfig table;
  table.set_name("t");
  table.set_vocab(100);
  table.set_dim(dim);
  table.add_field(0);
  return table;
}

// A table's mistakes are refused naming the file, line and field.
TEST(EmbeddingConfig, RefusesTablesThatCannotWork) {
  auto error = [](const std::string& segment_text, const std::string& more = "") {
    absl::StatusOr<v1::JobConfig> config = ParseConfig(absl::StrCat(R"pb(
      cluster { num_servers: 1 }
      model { input_width: 4 num_classes: 2 categorical_fields: 2 segments { name: "s" )pb", segment_text,
                                                                   R"pb( layers { units: 2 activation: SOFTMAX } } )pb",
                                                                   more, R"pb(}
      optimizer { kind: SGD }
      data { source: SYNTHETIC_CTR })pb"), "t.pbtxt");
    EXPECT_FALSE(config.ok());
    return std::string(config.status().message());
  };
  EXPECT_NE(error(R"pb(embeddings { name: "u" vocab: 10 dim: 4 field: 2 })pb")
                .find("model.segments[0].embeddings[0].field: table \"u\" of segment \"s\": 2 is out of range: "
                      "model.categorical_fields is 2 (id columns 0 to 1)"),
            std::string::npos);
  EXPECT_NE(error(R"pb(embeddings { name: "u" vocab: 0 dim: 4 field: 0 })pb").find("vocab: table \"u\""),
            std::string::npos);
  EXPECT_NE(error(R"pb(embeddings { name: "u" vocab: 10 dim: 4 })pb").find("needs at least one id column"),
            std::string::npos);
  EXPECT_NE(error(R"pb(embeddings { name: "u" vocab: 10 dim: 4 field: 0 }
                       embeddings { name: "u" vocab: 10 dim: 4 field: 1 })pb")
                .find("is used by another table"),
            std::string::npos);
  EXPECT_NE(error(R"pb(embeddings { name: "u" vocab: 10 dim: 4 field: 0 })pb", "combine: CHAIN")
                .find("not supported in a CHAIN"),
            std::string::npos);
  EXPECT_NE(error(R"pb(embeddings { name: "u" vocab: 10 dim: 4 field: 5 })pb").find("t.pbtxt line 3: "),
            std::string::npos);
  const absl::StatusOr<v1::JobConfig> small = ParseConfig(R"pb(
    cluster { num_servers: 64 }
    model {
      input_width: 1 num_classes: 2 categorical_fields: 1
      segments { name: "s" embeddings { name: "u" vocab: 10 dim: 1 field: 0 } layers { units: 2 activation: SOFTMAX } }
    }
    optimizer { kind: SGD }
    data { source: SYNTHETIC_CTR })pb", "t.pbtxt");
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("fewer dense parameters than the 64 servers"), std::string::npos)
      << small.status();
}

TEST(EmbeddingTable, UntouchedRowsReadAsTheirInitialValuesAndAreNotStored) {
  const v1::JobConfig config = CtrJob(v1::SGD);
  RowBudget budget(0);
  EmbeddingTable table(Table(4), config.optimizer(), 11, 0, 1, &budget);
  std::vector<float> got(8), want(4);
  table.Read({7, 9}, absl::MakeSpan(got));
  InitialRow(11, 0, 1, 9, absl::MakeSpan(want));
  EXPECT_EQ(std::vector<float>(got.begin() + 4, got.end()), want);
  for (float v : got) EXPECT_TRUE(v >= -kEmbeddingInit && v < kEmbeddingInit) << v;
  EXPECT_NE(got[0], got[4]);  // rows differ
  EXPECT_EQ(table.stored(), 0u);
  EXPECT_EQ(budget.used(), 0u);
}

TEST(EmbeddingTable, AdaGradUpdatesOnlyThePushedRowsAndTheirAccumulators) {
  v1::JobConfig config = CtrJob(v1::ADAGRAD);
  RowBudget budget(0);
  EmbeddingTable table(Table(2), config.optimizer(), 11, 0, 0, &budget);
  std::vector<float> before(4);
  table.Read({3, 5}, absl::MakeSpan(before));
  const std::vector<float> g = {1.0f, -2.0f};
  ASSERT_TRUE(table.Update(1, 1.0f, {3}, g).ok());
  EXPECT_EQ(table.pending_new(), 1u);
  table.Commit();
  ASSERT_TRUE(table.Update(2, 1.0f, {3}, g).ok());
  table.Commit();
  std::vector<float> after(4);
  table.Read({3, 5}, absl::MakeSpan(after));
  const v1::OptimizerConfig& o = config.optimizer();
  for (int j = 0; j < 2; ++j) {
    float w = before[j], a = o.initial_accumulator();
    for (int step = 0; step < 2; ++step) {
      a += g[j] * g[j];
      w -= o.learning_rate() * g[j] / (std::sqrt(a) + o.epsilon());
    }
    EXPECT_FLOAT_EQ(after[j], w);
  }
  EXPECT_EQ(after[2], before[2]);  // row 5 was never pushed
  EXPECT_EQ(after[3], before[3]);
  EXPECT_EQ(table.stored(), 1u);
  const TableState saved = table.Save();
  ASSERT_EQ(saved.ids, std::vector<uint64_t>{3});
  ASSERT_EQ(saved.rows.size(), 4u);  // the values, then the accumulator
  EXPECT_FLOAT_EQ(saved.rows[2], o.initial_accumulator() + 2 * g[0] * g[0]);
}

TEST(EmbeddingTable, ANonFiniteResultOrAFullBudgetChangesNothing) {
  v1::JobConfig config = CtrJob(v1::SGD);
  config.mutable_optimizer()->set_learning_rate(1e30f);
  RowBudget budget(1);
  EmbeddingTable table(Table(2), config.optimizer(), 11, 0, 0, &budget);
  // Row 2 would stay finite, row 4 would not: neither is stored.
  const absl::Status refused = table.Update(1, 1.0f, {2, 4}, std::vector<float>{0, 0, 1e30f, 0});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("row 4 of table \"t\""), std::string::npos) << refused;
  EXPECT_EQ(table.stored(), 0u);
  EXPECT_TRUE(budget.Take(1));
  EXPECT_FALSE(budget.Take(1));
  budget.Give(1);
  EXPECT_EQ(budget.used(), 0u);
}

// A checkpoint holds the stored rows as ids plus rows, and refuses a file
// whose ids are out of order.
TEST(EmbeddingTable, CheckpointsRoundTripTheStoredRows) {
  const std::string dir = MakeTempDir();
  v1::JobConfig config = CtrJob(v1::ADAGRAD, 1);
  config.mutable_checkpoint()->set_dir(dir);
  config.mutable_checkpoint()->set_keep(2);
  std::unique_ptr<CheckpointStore> store = *CheckpointStore::Open(config, 0, dir);
  const ShardMap map = *ShardMap::Create(config.model(), 1);
  ShardState state;
  state.clock = 5;
  state.values.assign(map.segment_size(0), 0.5f);
  state.slots.assign(1, std::vector<float>(map.segment_size(0), 0.1f));
  state.tables.resize(2);
  state.tables[0].ids = {2, 90000};
  state.tables[0].rows.assign(2 * 8, 0.25f);  // dim 4: values and accumulator
  ASSERT_TRUE(store->Write(0, state).ok());
  absl::StatusOr<ShardState> back = store->Read(0, 5);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->tables.size(), 2u);
  EXPECT_EQ(back->tables[0].ids, state.tables[0].ids);
  EXPECT_EQ(back->tables[0].rows, state.tables[0].rows);
  EXPECT_TRUE(back->tables[1].ids.empty());
  // A merge keeps the rows (Checkpoint.MergeAndSplitCarryEmbeddingTables
  // deals them out again): values only without the optimizer slots.
  ASSERT_TRUE(MergeCheckpoints(dir, 5, false, dir + "/merged.safetensors").ok());
  absl::StatusOr<SafetensorsFile> merged = SafetensorsFile::Read(dir + "/merged.safetensors");
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->metadata().at("segps.embeddings.ctr/user"), "2 4");
  EXPECT_EQ(merged->metadata().at("segps.embeddings.ctr/item"), "0 0");
  EXPECT_EQ(*merged->Float32("embeddings/ctr/user/rows", {2, 4}), std::vector<float>(8, 0.25f));
  state.clock = 10;
  state.tables[0].ids = {90000, 2};
  ASSERT_TRUE(store->Write(0, state).ok());
  const absl::StatusOr<ShardState> bad = store->Read(0, 10);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("embedding table \"user\""), std::string::npos) << bad.status();
}

// Rows from the wire: each mistake is named, and nothing is parsed.
// A row's server is Mix64(Mix64(segment << 32 | table) ^ id) mod the
// servers, the modulo taken by multiplication: equal to the division's for
// every count of servers tried, ids of every size among them.
TEST(RowServers, EqualsTheHashModuloTheServers) {
  std::mt19937_64 rng(7);
  for (const uint32_t n : {1u, 2u, 3u, 5u, 7u, 16u, 100u, 1023u, 65537u, 2147483647u, 4294967295u}) {
    for (const int segment : {0, 3}) {
      const uint32_t table = static_cast<uint32_t>(segment) + 1;
      const RowServers servers(segment, table, n);
      for (int k = 0; k < 20000; ++k) {
        const uint64_t id = k < 100 ? static_cast<uint64_t>(k) : rng() >> (k % 64);
        const uint64_t h = Mix64(Mix64(static_cast<uint64_t>(segment) << 32 | table) ^ id);
        ASSERT_EQ(servers.Of(id), h % n) << "n " << n << " id " << id;
        ASSERT_EQ(RowServer(segment, table, id, n), h % n) << "n " << n << " id " << id;
      }
    }
  }
}

// A batch's rows split by server, either way the split is made (a pass a
// server up to 8 servers, appended row by row beyond): every position once,
// at its row's server, ascending.
TEST(RowServers, SplitRowsPutsEachRowWithItsServerInOrder) {
  const std::vector<std::vector<uint64_t>> ids = {{5, 9, 1000, 77, 3}, {}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  for (const uint32_t n : {1u, 2u, 3u, 8u, 9u, 20u}) {
    const RowSplit split = SplitRows(2, n, ids);
    ASSERT_EQ(split.size(), n);
    for (size_t t = 0; t < ids.size(); ++t) {
      std::vector<uint32_t> seen;
      for (uint32_t s = 0; s < n; ++s) {
        ASSERT_EQ(split[s].size(), ids.size());
        EXPECT_TRUE(std::is_sorted(split[s][t].begin(), split[s][t].end())) << "n " << n << " server " << s;
        for (const uint32_t r : split[s][t]) {
          EXPECT_EQ(RowServer(2, static_cast<uint32_t>(t), ids[t][r], n), s) << "n " << n << " id " << ids[t][r];
          seen.push_back(r);
        }
      }
      std::sort(seen.begin(), seen.end());
      std::vector<uint32_t> all(ids[t].size());
      std::iota(all.begin(), all.end(), 0u);
      EXPECT_EQ(seen, all) << "n " << n << " table " << t;
    }
  }
}

TEST(RowRequests, RefusesWhatNoServerShouldApply) {
  const v1::JobConfig config = CtrJob(v1::SGD, 2);
  const v1::SegmentConfig& seg = config.model().segments(0);
  uint64_t mine = 0;
  while (RowServer(0, 1, mine, 2) != 0) ++mine;
  uint64_t other = 0;
  while (RowServer(0, 1, other, 2) != 1) ++other;
  uint64_t next = mine + 1;  // another row of this server's, above `mine`
  while (RowServer(0, 1, next, 2) != 0) ++next;
  auto rows = [](uint32_t table, std::vector<uint64_t> ids, size_t floats, float value = 0.5f) {
    google::protobuf::RepeatedPtrField<v1::Rows> out;
    v1::Rows* r = out.Add();
    r->set_table(table);
    r->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
    std::vector<float> values(floats, value);
    r->set_values(std::string(reinterpret_cast<const char*>(values.data()), floats * 4));
    return out;
  };
  auto refusal = [&](const google::protobuf::RepeatedPtrField<v1::Rows>& r) {
    absl::StatusOr<std::vector<RowGradients>> parsed = ParseRows(seg, 0, 0, 2, r, true, nullptr, "Push");
    EXPECT_FALSE(parsed.ok());
    return std::string(parsed.status().message());
  };
  EXPECT_TRUE(ParseRows(seg, 0, 0, 2, rows(1, {mine}, 3), true, nullptr, "Push").ok());
  EXPECT_NE(refusal(rows(2, {mine}, 3)).find("table 2 does not exist"), std::string::npos);
  EXPECT_NE(refusal(rows(1, {500}, 3)).find("rows of table \"item\": id 500 (row 0) is not below vocab 500"),
            std::string::npos);
  EXPECT_NE(refusal(rows(1, {other}, 3)).find("held by server 1"), std::string::npos);
  EXPECT_NE(refusal(rows(1, {mine, mine}, 6)).find("appears twice"), std::string::npos);
  // Ascending ids need no set to show that none repeats; others are checked through one.
  EXPECT_TRUE(ParseRows(seg, 0, 0, 2, rows(1, {mine, next}, 6), true, nullptr, "Push").ok());
  EXPECT_TRUE(ParseRows(seg, 0, 0, 2, rows(1, {next, mine}, 6), true, nullptr, "Push").ok());
  EXPECT_NE(refusal(rows(1, {mine, next, mine}, 9)).find("id " + std::to_string(mine) + " appears twice"),
            std::string::npos);
  EXPECT_NE(refusal(rows(1, {mine}, 2)).find("values has 8 bytes"), std::string::npos);
  EXPECT_NE(refusal(rows(1, {mine}, 3, NAN)).find("must be finite"), std::string::npos);
}

TEST(BatchRows, LooksUpEachDistinctIdOnceAndSumsItsGradients) {
  const v1::JobConfig config = CtrJob(v1::SGD);
  BatchRows batch(config.model().segments(0), 1, 3);
  // Two samples; item id 7 appears in both item fields of sample 0 and once in sample 1.
  const std::vector<uint64_t> ids = {100, 7, 7, 200, 7, 8};
  batch.Collect(ids.data(), 2);
  EXPECT_EQ(batch.ids()[0], (std::vector<uint64_t>{100, 200}));
  EXPECT_EQ(batch.ids()[1], (std::vector<uint64_t>{7, 8}));
  (*batch.mutable_values())[0] = {1, 1, 1, 1, 2, 2, 2, 2};
  (*batch.mutable_values())[1] = {7, 7, 7, 8, 8, 8};
  const std::vector<float> dense = {0.5f, -0.5f};
  std::vector<float> input(2 * 11);  // 1 + 4 + 3 + 3
  batch.FillInput(dense.data(), input.data());
  EXPECT_EQ(input, (std::vector<float>{0.5f, 1, 1, 1, 1, 7, 7, 7, 7, 7, 7, -0.5f, 2, 2, 2, 2, 7, 7, 7, 8, 8, 8}));
  std::vector<float> grad(22);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i);
  batch.SumGradients(grad.data());
  EXPECT_EQ(batch.gradients()[0], (std::vector<float>{1, 2, 3, 4, 12, 13, 14, 15}));
  // id 7: columns 5-7 and 8-10 of sample 0, 16-18 of sample 1.
  EXPECT_EQ(batch.gradients()[1], (std::vector<float>{5 + 8 + 16, 6 + 9 + 17, 7 + 10 + 18, 19, 20, 21}));
}

TEST(RocAuc, CountsOrderedPairsAndTiesHalf) {
  EXPECT_DOUBLE_EQ(RocAuc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(RocAuc({0.5f, 0.5f}, {0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(RocAuc({0.9f, 0.1f}, {1, 0}), 1.0);
  EXPECT_DOUBLE_EQ(RocAuc({0.9f, 0.1f}, {1, 1}), 0.5);
}

TEST(SyntheticCtr, IdsLieBelowTheirFieldsVocabAndLabelsDependOnThem) {
  const v1::JobConfig config = CtrJob(v1::SGD);
  const TrainTest data = *LoadData(config);
  ASSERT_EQ(data.train.fields, 3);
  ASSERT_EQ(data.train.ids.size(), 640u * 3);
  uint64_t head = 0;
  for (size_t i = 0; i < data.train.size(); ++i) {
    EXPECT_LT(data.train.ids[i * 3], 1000000u);
    EXPECT_LT(data.train.ids[i * 3 + 1], 500u);
    head += data.train.ids[i * 3 + 1] < 10;
  }
  // floor(501^u) - 1 < 10 for u < log(11) / log(501): about 39% of draws.
  EXPECT_GT(head, 640u * 30 / 100);
  EXPECT_LT(head, 640u * 48 / 100);
  EXPECT_EQ(LoadData(config)->train.ids, data.train.ids);  // deterministic
}

// CSV ids: strings hashed into each field's vocab, columns found by name,
// the held-out rows keeping their ids; a missing column named.
TEST(CsvIds, HashesEachValueIntoItsFieldsVocab) {
  const std::string dir = MakeTempDir();
  std::string table = "f0,user,label,f1,f2,f3,item\n";
  for (int i = 0; i < 40; ++i) {
    table += absl::StrFormat("%d,u%d,%d,0.5,1,2,\"it %d\"\n", i, i % 7, i % 2, i % 3);
  }
  WriteFile(dir + "/t.csv", table);
  auto config_with = [&](const std::string& columns) {
    return ParseConfig(absl::StrFormat(R"pb(
      cluster { num_servers: 1 }
      model {
        input_width: 4 num_classes: 2 categorical_fields: 2
        segments {
          name: "s"
          embeddings { name: "user" vocab: 1000 dim: 2 field: 0 }
          embeddings { name: "item" vocab: 5 dim: 2 field: 1 }
          layers { units: 2 activation: SOFTMAX }
        }
      }
      optimizer { kind: SGD }
      data { source: CSV train_csv: "%s/t.csv" label_column: "label" %s test_fraction: 0.25 }
    )pb", dir, columns), "t.pbtxt");
  };
  const absl::StatusOr<v1::JobConfig> config = config_with(R"pb(categorical_columns: "user" categorical_columns: "item")pb");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<TrainTest> data = LoadData(*config);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->train.fields, 2);
  EXPECT_EQ(data->train.width, 4);
  EXPECT_EQ(data->train.columns, (std::vector<std::string>{"f0", "f1", "f2", "f3"}));
  for (const Dataset* set : {&data->train, &data->test}) {
    for (size_t r = 0; r < set->size(); ++r) {
      std::vector<float> x(4);
      set->CopyRow(r, x.data());
      const int i = static_cast<int>(x[0]);  // the row's number in the file
      EXPECT_EQ(set->ids[r * 2], Fnv1a64(absl::StrCat("u", i % 7)) % 1000) << r;
      EXPECT_EQ(set->ids[r * 2 + 1], Fnv1a64(absl::StrCat("it ", i % 3)) % 5) << r;
    }
  }
  EXPECT_EQ(data->train.size() + data->test.size(), 40u);
  const absl::StatusOr<v1::JobConfig> missing =
      config_with(R"pb(categorical_columns: "user" categorical_columns: "items")pb");
  ASSERT_TRUE(missing.ok());
  const absl::Status refused = LoadData(*missing).status();
  EXPECT_NE(refused.message().find("data.categorical_columns \"items\" is not a column name of the header"),
            std::string::npos)
      << refused;
  EXPECT_NE(config_with(R"pb(categorical_columns: "user")pb").status().message().find(
                "data.categorical_columns: names 1 columns for model.categorical_fields 2"),
            std::string::npos);
}

// One worker at staleness 0 over two servers: the dense parameters and
// every touched row equal the single-process reference's, for SGD and AdaGrad.
class EmbeddingTraining : public ::testing::TestWithParam<v1::OptimizerKind> {};

TEST_P(EmbeddingTraining, OneWorkerEqualsTheSingleProcessReference) {
  const v1::JobConfig config = CtrJob(GetParam());
  const TrainTest data = *LoadData(config);
  InProcessCluster cluster(config);
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  absl::StatusOr<TrainReport> report = Train(config, TrainerOptions(), data.train, backend.get(), client.get());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->steps, 40u);  // 2 epochs of 640 / 32
  const EmbeddingReference reference = TrainEmbeddingReference(config, data.train, 0);
  EXPECT_LT(MaxRelativeError(cluster.Parameters(0), reference.params), 1e-5);
  std::unique_ptr<ParameterClient> reader = *ConnectGrpc(config, cluster.addresses());
  std::vector<std::vector<uint64_t>> ids(2);
  std::vector<float> want;
  for (size_t t = 0; t < 2; ++t) {
    for (const auto& [id, values] : reference.tables[t]) ids[t].push_back(id);
  }
  std::vector<std::vector<float>> got;
  ASSERT_TRUE(reader->PullRows(0, 0, ids, &got).ok());
  uint64_t touched = 0;
  for (size_t t = 0; t < 2; ++t) {
    std::vector<float> expected;
    for (const auto& [id, values] : reference.tables[t]) expected.insert(expected.end(), values.begin(), values.end());
    EXPECT_LT(MaxRelativeError(got[t], expected), 1e-5) << "table " << t;
    touched += ids[t].size();
  }
  // Every touched row is stored, each on one server, both servers holding some.
  EXPECT_EQ(cluster.StoredRows(0, 0) + cluster.StoredRows(1, 0), touched);
  EXPECT_GT(cluster.StoredRows(0, 0), 0u);
  EXPECT_GT(cluster.StoredRows(1, 0), 0u);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EmbeddingTraining, ::testing::Values(v1::SGD, v1::ADAGRAD),
                         [](const ::testing::TestParamInfo<v1::OptimizerKind>& info) {
                           return v1::OptimizerKind_Name(info.param);
                         });

// The server's metrics count the rows it stores, and those pulled and pushed.
TEST(EmbeddingTraining, MetricsCountTheRowsStoredPulledAndPushed) {
  const v1::JobConfig config = CtrJob(v1::ADAGRAD, 1);
  const TrainTest data = *LoadData(config);
  prometheus::Registry registry;
  ServerMetrics metrics(registry, config, 0);
  ServerOptions options;
  options.metrics = &metrics;
  InProcessCluster cluster(config, options);
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  ASSERT_TRUE(Train(config, TrainerOptions(), data.train, backend.get(), client.get()).ok());
  const std::string scraped = prometheus::TextSerializer().Serialize(registry.Collect());
  const uint64_t held = cluster.StoredRows(0, 0);
  ASSERT_GT(held, 0u);
  EXPECT_NE(scraped.find(absl::StrCat("segps_server_embedding_rows{segment=\"ctr\",server=\"0\"} ", held)),
            std::string::npos)
      << scraped;
  EXPECT_NE(scraped.find("segps_server_embedding_bytes{segment=\"ctr\",server=\"0\"}"), std::string::npos);
  for (const char* series : {"segps_server_embedding_rows_pulled_total", "segps_server_embedding_rows_pushed_total"}) {
    const size_t at = scraped.find(absl::StrCat(series, "{segment=\"ctr\",server=\"0\"} "));
    ASSERT_NE(at, std::string::npos) << series;
    EXPECT_GE(std::stod(scraped.substr(scraped.find('}', at) + 2)), static_cast<double>(held)) << series;
  }
}

// A pull that asks for more rows than a reply can carry is refused before
// the server reads any.
TEST(EmbeddingTraining, APullOfMoreRowsThanAReplyHoldsIsRefused) {
  const v1::JobConfig config = CtrJob(v1::SGD, 1, "max_message_bytes: 1048576 chunk_bytes: 4096");
  InProcessCluster cluster(config);
  std::unique_ptr<ParameterClient> reader = *ConnectGrpc(config, cluster.addresses());
  std::vector<std::vector<uint64_t>> ids(2);
  for (uint64_t id = 0; id < 50000; ++id) ids[0].push_back(id);  // 50,000 x (8 + 16) bytes
  std::vector<std::vector<float>> values;
  const absl::Status refused = reader->PullRows(0, 0, ids, &values);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("more than cluster.max_message_bytes"), std::string::npos) << refused;
}

// A budget smaller than the rows a step touches refuses the push with the
// reason, and the servers store nothing.
TEST(EmbeddingTraining, ARowBudgetRefusesInsteadOfGrowing) {
  const v1::JobConfig config = CtrJob(v1::SGD, 1, "embedding_rows_budget: 10");
  const TrainTest data = *LoadData(config);
  InProcessCluster cluster(config);
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  std::unique_ptr<ParameterClient> client = *ConnectGrpc(config, cluster.addresses());
  absl::StatusOr<TrainReport> report = Train(config, TrainerOptions(), data.train, backend.get(), client.get());
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("cluster.embedding_rows_budget"), std::string::npos) << report.status();
  EXPECT_EQ(cluster.StoredRows(0, 0), 0u);
}

}  // namespace
}  // namespace segps
