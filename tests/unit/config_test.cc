#include "common/config.h"
#include "common/config_hints.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

namespace segps {
namespace {

const char kMinimal[] = R"pb(
cluster { num_servers: 2 }
model {
  input_width: 50
  num_classes: 10
  segments {
    name: "a"
    layers { units: 64 activation: RELU }
    layers { units: 10 activation: SOFTMAX }
  }
}
optimizer { kind: ADAM }
data { source: SYNTHETIC_SEED }
)pb";

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(Config, FillsDefaults) {
  absl::StatusOr<v1::JobConfig> c = ParseConfig(kMinimal, "job.pbtxt");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->training().batch_size(), 32u);
  EXPECT_EQ(c->training().epochs(), 1u);
  EXPECT_FLOAT_EQ(c->optimizer().learning_rate(), 0.001f);
  EXPECT_FLOAT_EQ(c->optimizer().epsilon(), 1e-7f);
  EXPECT_EQ(c->model().segments(0).staleness(), 0);
  EXPECT_EQ(c->model().segments(0).workers(), 1u);
  EXPECT_EQ(c->data().data_seed(), 42u);
  EXPECT_EQ(c->cluster().lease_ms(), 3000u);
  EXPECT_EQ(PushesInFlight(*c, 0), 1u);
}

TEST(Config, SegmentOverridesTrainingDefaults) {
  std::string text = Replace(kMinimal, "name: \"a\"", "name: \"a\" staleness: -1 workers: 3");
  absl::StatusOr<v1::JobConfig> c = ParseConfig(text, "job.pbtxt");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(StalenessOf(*c, 0), -1);
  EXPECT_EQ(WorkersOf(*c, 0), 3u);
  EXPECT_EQ(PushesInFlight(*c, 0), 8u);
}

TEST(Config, ErrorNamesFileLineAndField) {
  std::string text = Replace(kMinimal, "units: 64", "units: 0");
  absl::StatusOr<v1::JobConfig> c = ParseConfig(text, "job.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(c.status().message()),
            "job.pbtxt line 8: model.segments[0].layers[0].units: segment \"a\" layer 0: units must be "
            "in [1, 1048576], got 0");
}

// optimizer.schedule: each decay needs its own fields and refuses the
// others', naming the line; a valid one fills its defaults.
TEST(Config, ScheduleFieldsAreCheckedByKind) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"schedule { decay: STEP }", "job.pbtxt line 13: optimizer.schedule.step_updates: is required for STEP"},
      {"schedule { decay: STEP step_updates: 5 gamma: 1.5 }",
       "job.pbtxt line 13: optimizer.schedule.gamma: must be in (0, 1], got 1.5"},
      {"schedule { decay: COSINE }", "job.pbtxt line 13: optimizer.schedule.decay_updates: is required for COSINE"},
      {"schedule { decay: COSINE decay_updates: 9 min_factor: -1 }",
       "job.pbtxt line 13: optimizer.schedule.min_factor: must be in [0, 1], got -1"},
      {"schedule { decay_updates: 9 }",
       "job.pbtxt line 13: optimizer.schedule.decay_updates: is used by decay COSINE only"},
  };
  for (const auto& [schedule, error] : cases) {
    absl::StatusOr<v1::JobConfig> c =
        ParseConfig(Replace(kMinimal, "optimizer { kind: ADAM }", "optimizer { kind: ADAM\n" + schedule + " }"),
                    "job.pbtxt");
    ASSERT_FALSE(c.ok()) << schedule;
    EXPECT_EQ(std::string(c.status().message()).substr(0, error.size()), error) << c.status();
  }
  absl::StatusOr<v1::JobConfig> step = ParseConfig(
      Replace(kMinimal, "optimizer { kind: ADAM }", "optimizer { kind: ADAM schedule { decay: STEP step_updates: 5 } }"),
      "job.pbtxt");
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FLOAT_EQ(step->optimizer().schedule().gamma(), 0.1f);
}

TEST(Config, SyntaxErrorNamesLineAndColumn) {
  absl::StatusOr<v1::JobConfig> c = ParseConfig("cluster { num_servers: two }", "bad.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("bad.pbtxt line 1 column"), std::string::npos)
      << c.status();
}

TEST(Config, UnknownFieldIsRejectedSuggestingTheNearestName) {
  absl::StatusOr<v1::JobConfig> c = ParseConfig(Replace(kMinimal, "num_servers: 2", "num_server: 2"), "x.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("no field named \"num_server\". Did you mean \"num_servers\"?"),
            std::string::npos)
      << c.status();
  // Nothing near: the message's fields are listed.
  c = ParseConfig("optimizer { zzzzzz: 1 }", "x.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("Its fields: kind, learning_rate, beta1"), std::string::npos)
      << c.status();
}

TEST(Config, UnknownEnumValueListsTheAllowedOnes) {
  absl::StatusOr<v1::JobConfig> c = ParseConfig("optimizer { kind: ADAMM }", "x.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("\"ADAMM\" for field \"kind\". Did you mean ADAM? Allowed: SGD"),
            std::string::npos)
      << c.status();
  EXPECT_EQ(std::string(c.status().message()).find("UNSPECIFIED"), std::string::npos) << c.status();
  c = ParseConfig("model { segments { layers { activation: SWISH } } }", "x.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("Allowed: IDENTITY, RELU, TANH, SIGMOID, SOFTMAX."),
            std::string::npos)
      << c.status();
  EXPECT_EQ(std::string(c.status().message()).find("Did you mean"), std::string::npos) << c.status();
}

TEST(Config, NearestNameIsOnlyANearOne) {
  EXPECT_EQ(Nearest("relu64", {"relu64x", "tanh128"}), "relu64x");
  EXPECT_EQ(Nearest("RELU64", {"relu64", "tanh128"}), "relu64");
  EXPECT_EQ(Nearest("stage9", {"relu64", "tanh128"}), "");
  EXPECT_EQ(Nearest("lable", {"a", "label"}), "label") << "a swap of neighbours is one slip";
  EXPECT_EQ(Nearest("x", {}), "");
}

struct BadCase {
  const char* from;
  const char* to;
  const char* expect;  // substring of the message
};

// Each case's config is refused with a message holding its `expect`.
void ExpectRejected(const std::vector<BadCase>& cases) {
  for (const BadCase& bad : cases) {
    absl::StatusOr<v1::JobConfig> c = ParseConfig(Replace(kMinimal, bad.from, bad.to), "job.pbtxt");
    ASSERT_FALSE(c.ok()) << bad.to;
    EXPECT_NE(std::string(c.status().message()).find(bad.expect), std::string::npos)
        << "got: " << c.status().message() << "\nexpected: " << bad.expect;
  }
}

TEST(Config, RejectsEachBrokenField) {
  const std::vector<BadCase> cases = {
      {"num_servers: 2", "num_servers: 0", "cluster.num_servers: must be >= 1"},
      {"input_width: 50", "input_width: 0", "model.input_width: must be > 0"},
      {"num_classes: 10", "num_classes: 1", "model.num_classes: must be >= 2"},
      {"units: 10 activation: SOFTMAX", "units: 9 activation: SOFTMAX", "last layer must be SOFTMAX"},
      {"units: 64 activation: RELU", "units: 64 activation: SOFTMAX", "only allowed on a segment's last layer"},
      {"units: 64 activation: RELU", "units: 64", "activation: is required"},
      {"units: 64 activation: RELU", "units: 64 activation: 9", "layers[0].activation: 9 is no activation"},
      {"name: \"a\"", "name: \"../a\"", "segments[0].name: \"../a\" must be 1 to 100 letters, digits"},
      {"name: \"a\"", "name: \"a b\"", "segments[0].name: \"a b\" must be"},
      {"units: 64 activation: RELU", "units: 64 activation: RELU dropout: 1",
       "layers[0].dropout: must be in [0, 1) on a layer that does not end in SOFTMAX, got 1"},
      {"units: 10 activation: SOFTMAX", "units: 10 activation: SOFTMAX dropout: 0.1", "layers[1].dropout: must be"},
      {"kind: ADAM", "kind: ADAM learning_rate: -1", "optimizer.learning_rate: must be > 0"},
      {"kind: ADAM", "kind: ADAM beta1: 1", "optimizer.beta1: must be in [0, 1)"},
      {"kind: ADAM", "kind: ADAM clip_gradient_norm: -1", "optimizer.clip_gradient_norm: must be finite and >= 0"},
      {"kind: ADAM", "kind: ADAM clip_value: inf", "optimizer.clip_value: must be finite and >= 0"},
      {"kind: ADAM", "", "optimizer.kind: is required"},
      {"source: SYNTHETIC_SEED", "", "data.source: is required"},
      {"name: \"a\"", "name: \"a\" staleness: -2", "staleness: must be >= 0, or -1"},
      {"name: \"a\"", "", "name: is required"},
      {"source: SYNTHETIC_SEED", "source: FASHION_MNIST", "FASHION_MNIST needs model.input_width 784"},
      {"num_servers: 2", "num_servers: 2 chunk_bytes: 100", "cluster.chunk_bytes: is 100; it must be at least 4096"},
      {"num_servers: 2", "num_servers: 2 max_message_bytes: 8192 chunk_bytes: 8192", "leave 4096 bytes of max_message_bytes"},
      {"num_servers: 2", "num_servers: 2 wire_dtype: 7", "cluster.wire_dtype: is 7; use FLOAT32, BFLOAT16 or FLOAT16"},
      {"num_servers: 2", "num_servers: 2 bfloat16_wire: true", "cluster.bfloat16_wire: is replaced by wire_dtype: BFLOAT16"},
      {"kind: ADAM }", "kind: ADAM } training { gradient_topk: 1 }", "training.gradient_topk: must be in [0, 1)"},
      {"kind: ADAM }", "kind: ADAM } training { gradient_topk: -0.1 }", "training.gradient_topk: must be in [0, 1)"},
      {"kind: ADAM }", "kind: ADAM } training { staleness: -1 balance {} }",
       "training.balance: needs a finite staleness bound, but segment \"a\" is unbounded"},
      {"kind: ADAM }", "kind: ADAM } training { balance { min_share: 0 } }",
       "training.balance.min_share: must be in (0, 1], got 0"},
      {"kind: ADAM }", "kind: ADAM } training { workers_per_segment: 2 balance { shares: 40 } }",
       "training.balance.shares: gives 1 shares, but segment \"a\" has 2 workers"},
      {"kind: ADAM }", "kind: ADAM } training { workers_per_segment: 2 balance { shares: 40 shares: 40 } }",
       "training.balance.shares: sum to 80; they must sum to batch_size x workers (64)"},
      {"kind: ADAM }", "kind: ADAM } training { workers_per_segment: 2 balance { shares: 62 shares: 2 } }",
       "training.balance.shares[1]: is 2, below min_share x batch_size (4)"},
      {"kind: ADAM", "kind: SGD momentum_lookahead: true",
       "optimizer.momentum_lookahead: needs an optimizer with momentum (MOMENTUM or ADAM); SGD has none"},
      {"source: SYNTHETIC_SEED", "source: NPY train_y: \"y.npy\"", "data.train_x: is required for NPY"},
      {"source: SYNTHETIC_SEED", "source: NPY train_x: \"x.npy\"", "data.train_y: is required for NPY"},
      {"source: SYNTHETIC_SEED", "source: NPY train_x: \"x.npy\" train_y: \"y.npy\" test_x: \"t.npy\"",
       "data.test_y: is missing: give test_x and test_y together"},
      {"source: SYNTHETIC_SEED", "source: NPY train_x: \"x.npy\" train_y: \"y.npy\" train_csv: \"a.csv\"",
       "data.train_csv: is not used by data.source NPY"},
      {"source: SYNTHETIC_SEED", "source: NPY train_x: \"x.npy\" train_y: \"y.npy\" scale: 0",
       "data.scale: must be finite and > 0"},
      {"source: SYNTHETIC_SEED",
       "source: NPY train_x: \"x.npy\" train_y: \"y.npy\" test_x: \"t.npy\" test_y: \"u.npy\" test_fraction: 0.1",
       "data.test_fraction: applies only without test files"},
      {"source: SYNTHETIC_SEED", "source: CSV train_csv: \"a.csv\" test_fraction: 1",
       "data.test_fraction: must be in (0, 1), got 1"},
      {"source: SYNTHETIC_SEED", "source: CSV", "data.train_csv: is required for CSV"},
      {"source: SYNTHETIC_SEED", "source: CSV train_csv: \"a.csv\" delimiter: \";;\"",
       "data.delimiter: must be one character"},
      {"source: SYNTHETIC_SEED", "source: CSV train_csv: \"a.csv\" scale: 2", "data.scale: is used by data.source NPY only"},
      {"source: SYNTHETIC_SEED", "source: SYNTHETIC_SEED test_fraction: 0.5",
       "data.test_fraction: is used by data.source NPY and CSV only"},
  };
  ExpectRejected(cases);
}

// model.loss and training.early_stopping, and what they need of the rest.
TEST(Config, RejectsBrokenLossesAndEarlyStopping) {
  ExpectRejected({
      {"num_classes: 10", "num_classes: 10 loss: MSE", "model.num_classes: is 10; loss: MSE regresses one target"},
      {"num_classes: 10", "num_classes: 1 loss: MSE", "the last layer must be IDENTITY with units == model.num_classes (1)"},
      {"num_classes: 10", "num_classes: 1", "model.num_classes: must be >= 2, got 1 (a regression sets loss: MSE)"},
      {"num_classes: 10", "num_classes: 1 loss: 7", "model.loss: 7 is no loss"},
      {"num_classes: 10\n  segments {\n    name: \"a\"\n    layers { units: 64 activation: RELU }\n    layers { units: 10 "
       "activation: SOFTMAX }",
       "num_classes: 1 loss: MSE\n  segments {\n    name: \"a\"\n    layers { units: 64 activation: RELU }\n    layers { "
       "units: 1 activation: IDENTITY }",
       "data.source: SYNTHETIC_SEED has classes for labels; model.loss MSE regresses real-valued targets: NPY or CSV"},
      {"kind: ADAM }", "kind: ADAM } training { early_stopping { patience: 2 } }",
       "training.early_stopping: stops on the validation loss: set data.validation_fraction"},
      {"kind: ADAM }", "kind: ADAM } training { early_stopping { } }",
       "training.early_stopping.patience: must be at least 1"},
      {"source: SYNTHETIC_SEED }", "source: SYNTHETIC_SEED validation_fraction: 0.1 } "
       "training { early_stopping { patience: 1 min_delta: -1 } }",
       "training.early_stopping.min_delta: must be a finite number >= 0, got -1"},
  });
}

const char kChain[] = R"pb(
cluster { num_servers: 1 }
model {
  input_width: 50
  num_classes: 10
  combine: CHAIN
  segments { name: "s0" layers { units: 64 activation: RELU } }
  segments { name: "s1" input_width: 64 layers { units: 10 activation: SOFTMAX } }
}
optimizer { kind: SGD }
training { batch_size: 32 micro_batches: 4 schedule: ONE_F_ONE_B }
data { source: SYNTHETIC_SEED }
)pb";

TEST(Config, ChainStagesTakeThePreviousStagesOutput) {
  absl::StatusOr<v1::JobConfig> c = ParseConfig(kChain, "chain.pbtxt");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->training().micro_batches(), 4u);
  EXPECT_EQ(c->training().schedule(), v1::ONE_F_ONE_B);
  // Unset: one micro-batch, GPipe's order.
  c = ParseConfig(Replace(kChain, "micro_batches: 4 schedule: ONE_F_ONE_B", ""), "chain.pbtxt");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->training().micro_batches(), 1u);
  EXPECT_EQ(c->training().schedule(), v1::GPIPE);
}

TEST(Config, BrokenChainsAreRejectedNamingTheField) {
  for (const auto& [from, to, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           // The second stage's stated input is not the first stage's output.
           {"input_width: 64", "input_width: 32",
            "chain.pbtxt line 8: model.segments[1].input_width: is 32, but stage \"s0\"'s last layer gives 64"},
           // Softmax before the last stage.
           {"units: 64 activation: RELU", "units: 64 activation: SOFTMAX",
            "model.segments[0].layers[0].activation: stage \"s0\" of a CHAIN ends in SOFTMAX: only the last stage may"},
           // Micro-batches that do not divide the batch.
           {"micro_batches: 4", "micro_batches: 5", "training.micro_batches: 5 does not divide batch_size 32"},
           // Replicas that do not pair up.
           {"name: \"s1\"", "name: \"s1\" workers: 2",
            "model.segments[1].workers: is 2, but a CHAIN's stages pair up replica by replica"},
           // The last stage must still end in the classes' softmax.
           {"units: 10 activation: SOFTMAX", "units: 10 activation: RELU",
            "the last layer must be SOFTMAX with units == model.num_classes"},
           // Early stopping ends ensemble segments only.
           {"ONE_F_ONE_B }\ndata { source: SYNTHETIC_SEED",
            "ONE_F_ONE_B early_stopping { patience: 1 } }\ndata { source: SYNTHETIC_SEED validation_fraction: 0.1",
            "training.early_stopping: is not supported with combine: CHAIN yet"},
       }) {
    absl::StatusOr<v1::JobConfig> c = ParseConfig(Replace(kChain, from, to), "chain.pbtxt");
    ASSERT_FALSE(c.ok()) << to;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(c.status().message()).find(says), std::string::npos) << c.status();
  }
  // An ensemble takes no micro-batches, nor stage widths.
  absl::StatusOr<v1::JobConfig> c = ParseConfig(Replace(kMinimal, "optimizer", "training { micro_batches: 2 } optimizer"),
                                                "job.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("training.micro_batches: is only for combine: CHAIN"),
            std::string::npos)
      << c.status();
  c = ParseConfig(Replace(kMinimal, "name: \"a\"", "name: \"a\" input_width: 50"), "job.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("model.segments[0].input_width: is only for combine: CHAIN"),
            std::string::npos)
      << c.status();
}

// A model of segments declared by their tensors (trained from Python)
// needs no data, input width or classes; each tensor is checked with its
// field named.
const char kTensors[] = R"pb(
cluster { num_servers: 2 }
optimizer { kind: SGD learning_rate: 0.1 }
model {
  segments {
    name: "cnn"
    tensors { name: "0.weight" shape: 4 shape: 1 shape: 3 shape: 3 }
    tensors { name: "0.bias" shape: 4 uniform: 0.33 }
  }
}
)pb";

TEST(Config, SegmentsDeclaredByTheirTensorsAreCheckedNamingTheField) {
  absl::StatusOr<v1::JobConfig> c = ParseConfig(kTensors, "job.pbtxt");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(TensorsOnly(c->model()));
  EXPECT_EQ(c->model().combine(), v1::AVERAGE_SOFTMAX);
  for (const auto& [from, to, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"shape: 4 uniform", "shape: 0 uniform",
            "job.pbtxt line 8: model.segments[0].tensors[1].shape: tensor \"0.bias\" of segment \"cnn\": "
            "dimensions must be > 0"},
           {"name: \"0.bias\"", "name: \"0.weight\"", "tensors[1].name: tensor \"0.weight\" of segment \"cnn\": "
                                                      "is used by another tensor of the segment"},
           {"name: \"0.bias\" shape: 4", "name: \"0.bias\"", "tensors[1].shape: tensor \"0.bias\" of segment "
                                                             "\"cnn\": needs at least one dimension"},
           {"uniform: 0.33", "uniform: -1", "tensors[1].uniform: tensor \"0.bias\" of segment \"cnn\": must be "
                                            "finite (and a uniform bound >= 0)"},
           {"uniform: 0.33", "constant: inf", "tensors[1].constant: "},
           {"shape: 3 shape: 3", "shape: 65536 shape: 65536 shape: 2",
            "tensors[0].shape: tensor \"0.weight\" of segment \"cnn\": dimensions must be > 0 and the segment at "
            "most 4294967296 elements"},
           {"name: \"cnn\"", "name: \"cnn\" layers { units: 2 activation: SOFTMAX }",
            "model.segments[0].layers[0]: segment \"cnn\" is declared by its tensors: give layers or tensors, "
            "not both"},
           {"model {", "model { partition: BALANCED",
            "model.partition: segments declared by their tensors are cut by hand"},
       }) {
    c = ParseConfig(Replace(kTensors, from, to), "job.pbtxt");
    ASSERT_FALSE(c.ok()) << to;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(c.status().message()).find(says), std::string::npos) << c.status();
  }
  // Beside a layered segment, the model needs its data and widths again.
  const std::string mixed = Replace(kTensors, "model {", R"pb(model {
  segments { name: "dense" layers { units: 2 activation: SOFTMAX } })pb");
  c = ParseConfig(mixed, "job.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("model.input_width: must be > 0"), std::string::npos) << c.status();
}

TEST(Config, DataFilesAreRelativeToTheConfigFile) {
  char dir[] = "/tmp/segps_config_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/job.pbtxt";
  std::string text = Replace(kMinimal, "source: SYNTHETIC_SEED",
                             "source: NPY train_x: \"data/x.npy\" train_y: \"/abs/y.npy\"");
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  absl::StatusOr<v1::JobConfig> c = LoadConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data().train_x(), std::string(dir) + "/data/x.npy");
  EXPECT_EQ(c->data().train_y(), "/abs/y.npy");
  EXPECT_FLOAT_EQ(c->data().test_fraction(), 0.2f);
  EXPECT_EQ(c->data().normalize(), v1::NONE);
}

TEST(Config, MissingFileIsNotFound) {
  absl::StatusOr<v1::JobConfig> c = LoadConfig("/nonexistent/job.pbtxt");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(c.status().message()).find("/nonexistent/job.pbtxt"), std::string::npos);
}

TEST(Config, FingerprintTracksModelOptimizerAndSeed) {
  v1::JobConfig a = *ParseConfig(kMinimal, "a");
  v1::JobConfig b = *ParseConfig(Replace(kMinimal, "units: 64", "units: 65"), "b");
  v1::JobConfig c = *ParseConfig(Replace(kMinimal, "kind: ADAM", "kind: SGD"), "c");
  v1::JobConfig d = *ParseConfig(Replace(kMinimal, "num_servers: 2", "num_servers: 3"), "d");
  EXPECT_EQ(ModelFingerprint(a), ModelFingerprint(*ParseConfig(kMinimal, "again")));
  EXPECT_NE(ModelFingerprint(a), ModelFingerprint(b));
  EXPECT_NE(ModelFingerprint(a), ModelFingerprint(c));
  EXPECT_EQ(ModelFingerprint(a), ModelFingerprint(d));  // cluster size is the shard map's business
  a.set_seed(1);
  EXPECT_NE(ModelFingerprint(a), ModelFingerprint(*ParseConfig(kMinimal, "a")));
}

TEST(Config, ShippedConfigsLoad) {
  const std::string dir = std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/";
  for (const char* name : {"seed.pbtxt", "teacher.pbtxt", "fashion_mnist.pbtxt"}) {
    absl::StatusOr<v1::JobConfig> c = LoadConfig(dir + name);
    EXPECT_TRUE(c.ok()) << name << ": " << c.status();
  }
}

}  // namespace
}  // namespace segps
