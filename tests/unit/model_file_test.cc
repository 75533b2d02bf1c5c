#include "worker/model/model_file.h"

#include <gtest/gtest.h>

#include <random>

#include "common/config.h"
#include "common/safetensors.h"
#include "common/shard_map.h"
#include "onnx/onnx.pb.h"
#include "tests/support/subprocess.h"
#include "worker/model/backend.h"
#include "worker/model/evaluator.h"

namespace segps {
namespace {

v1::JobConfig Job() {
  return *ParseConfig(R"(
    name: "exported"
    cluster { num_servers: 2 }
    model { input_width: 5 num_classes: 3
            segments { name: "a" layers { units: 4 activation: RELU } layers { units: 3 activation: SOFTMAX } }
            segments { name: "b" layers { units: 6 activation: TANH } layers { units: 2 activation: SIGMOID }
                       layers { units: 3 activation: SOFTMAX } } }
    optimizer { kind: ADAM }
    data { source: SYNTHETIC_TEACHER train_samples: 50 test_samples: 40 normalize: STANDARDIZE })",
                      "job.pbtxt");
}

TrainedModel Model(const v1::JobConfig& config, const Dataset& train) {
  ShardMap map = *ShardMap::Create(config.model(), 1);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 0.5f);
  std::vector<std::vector<float>> params;
  for (int k = 0; k < map.num_segments(); ++k) {
    params.emplace_back(map.segment_size(k));
    for (float& v : params.back()) v = normal(rng);
  }
  return ModelOfJob(config, std::move(params), train);
}

TEST(ModelFile, SafetensorsRoundTripsParametersArchitectureAndPreprocessing) {
  const v1::JobConfig config = Job();
  TrainTest data = *LoadData(config);
  TrainedModel model = Model(config, data.train);
  ASSERT_EQ(model.mean.size(), 5u);
  model.input_columns = {"age", "height", "weight", "pulse", "temperature"};  // as a CSV header names them
  model.csv_delimiter = ";";
  const std::string path = MakeTempDir() + "/m.safetensors";
  ASSERT_TRUE(WriteModelSafetensors(model, path).ok());
  // Named as a user would name them, kernels [in, out].
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().count("b/dense_1/kernel"), 1u);
  EXPECT_EQ(file->tensors().at("b/dense_1/kernel").shape, (std::vector<uint64_t>{6, 2}));
  EXPECT_EQ(file->tensors().at("b/dense_2/bias").shape, (std::vector<uint64_t>{3}));
  EXPECT_EQ(file->metadata().at("segps.normalize"), "STANDARDIZE");
  EXPECT_EQ(file->metadata().at("segps.config_fingerprint"), ModelFingerprint(config));

  absl::StatusOr<TrainedModel> read = ReadModelSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->params, model.params);
  EXPECT_EQ(read->mean, model.mean);
  EXPECT_EQ(read->std, model.std);
  EXPECT_EQ(read->input_scale, model.input_scale);
  EXPECT_EQ(read->input_columns, model.input_columns);
  EXPECT_EQ(read->csv_delimiter, ";");
  EXPECT_EQ(read->job, "exported");
  EXPECT_EQ(read->model.SerializeAsString(), config.model().SerializeAsString());

  // The read model predicts exactly what the evaluator scores.
  std::unique_ptr<Backend> backend = CreateCpuBackend(1);
  EvalReport report = *Evaluate(config, data.test, model.params, backend.get());
  EXPECT_EQ(*Predict(read->model, data.test, read->params, -1, backend.get()), report.probabilities);
}

TEST(ModelFile, RefusesAFileThatIsNotACompleteExport) {
  const std::string dir = MakeTempDir();
  const std::vector<float> v = {1};
  ASSERT_TRUE(WriteSafetensors(dir + "/other.safetensors", {{"w", {1}, v, {}}}, {}).ok());
  absl::StatusOr<TrainedModel> other = ReadModelSafetensors(dir + "/other.safetensors");
  EXPECT_NE(std::string(other.status().message()).find("not a segps model export"), std::string::npos)
      << other.status();

  const v1::JobConfig config = Job();
  TrainedModel model = Model(config, LoadData(config)->train);
  model.params[1].pop_back();
  EXPECT_NE(std::string(WriteModelSafetensors(model, dir + "/m.safetensors").message())
                .find("segment b has 58 parameters, expected 59"),
            std::string::npos);
}

TEST(ModelFile, OnnxGraphRunsEachSegmentThenAveragesThem) {
  const v1::JobConfig config = Job();
  TrainedModel model = Model(config, LoadData(config)->train);
  const std::string path = MakeTempDir() + "/m.onnx";
  ASSERT_TRUE(WriteModelOnnx(model, path).ok());
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(ReadFile(path)));
  std::vector<std::string> ops;
  for (const auto& node : proto.graph().node()) ops.push_back(node.op_type());
  EXPECT_EQ(ops, (std::vector<std::string>{"Sub", "Div", "Gemm", "Relu", "Gemm", "Softmax", "Gemm", "Tanh", "Gemm",
                                           "Sigmoid", "Gemm", "Softmax", "Mean"}));
  EXPECT_EQ(proto.graph().output(0).name(), "probabilities");
  EXPECT_EQ(proto.graph().initializer_size(), 2 + 10);  // mean, std, and 5 dense layers' kernels and biases
}

}  // namespace
}  // namespace segps
