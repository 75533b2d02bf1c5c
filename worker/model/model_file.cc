#include "worker/model/model_file.h"

#include <map>

#include "absl/algorithm/container.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/safetensors.h"
#include "common/shard_map.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/text_format.h"
#include "onnx/onnx.pb.h"

namespace segps {
namespace {

constexpr char kFormat[] = "segps-model-1";

// The tensor of segment k's table t.
std::string TableName(const v1::ModelConfig& model, int k, int t) {
  return absl::StrCat(model.segments(k).name(), "/embeddings/", model.segments(k).embeddings(t).name());
}

// OK where `model` holds every table of every segment whole.
absl::Status CheckTables(const TrainedModel& model) {
  for (int k = 0; k < model.model.segments_size(); ++k) {
    const v1::SegmentConfig& segment = model.model.segments(k);
    for (int t = 0; t < segment.embeddings_size(); ++t) {
      const v1::EmbeddingConfig& table = segment.embeddings(t);
      if (static_cast<size_t>(k) >= model.tables.size() || static_cast<size_t>(t) >= model.tables[k].size() ||
          model.tables[k][t].size() != table.vocab() * table.dim()) {
        return absl::InvalidArgumentError(absl::StrCat("export: table ", TableName(model.model, k, t),
                                                       " is not held whole (", table.vocab(), " x ", table.dim(), ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

TrainedModel ModelOfJob(const v1::JobConfig& config, std::vector<std::vector<float>> params, const Dataset& train,
                        std::vector<std::vector<std::vector<float>>> tables) {
  TrainedModel out;
  out.job = config.name();
  out.model = config.model();
  out.params = std::move(params);
  out.tables = std::move(tables);
  out.input_scale = train.scale;
  out.mean = train.mean;
  out.std = train.std;
  out.config_fingerprint = ModelFingerprint(config);
  out.input_columns = train.columns;
  if (config.data().source() == v1::CSV) out.csv_delimiter = config.data().delimiter();
  return out;
}

absl::Status WriteModelSafetensors(const TrainedModel& model, const std::string& path) {
  absl::StatusOr<ShardMap> map = ShardMap::Create(model.model, 1);
  if (!map.ok()) return map.status();
  SEGPS_RETURN_IF_ERROR(CheckTables(model));
  std::vector<TensorToWrite> tensors;
  for (int k = 0; k < map->num_segments(); ++k) {
    if (model.params[k].size() != map->segment_size(k)) {
      return absl::InvalidArgumentError(absl::StrCat("export: segment ", model.model.segments(k).name(), " has ",
                                                     model.params[k].size(), " parameters, expected ",
                                                     map->segment_size(k)));
    }
    for (const TensorLayout& t : map->tensors(k)) {
      tensors.push_back({TensorName(model.model, k, t), TensorShape(t),
                         absl::MakeConstSpan(model.params[k]).subspan(t.offset, t.size()), {}});
    }
    const v1::SegmentConfig& segment = model.model.segments(k);
    for (int t = 0; t < segment.embeddings_size(); ++t) {
      const v1::EmbeddingConfig& table = segment.embeddings(t);
      tensors.push_back({TableName(model.model, k, t), {table.vocab(), table.dim()}, model.tables[k][t], {}});
    }
  }
  const uint64_t width = model.model.input_width();
  if (!model.mean.empty()) {
    tensors.push_back({"preprocess/mean", {width}, model.mean, {}});
    tensors.push_back({"preprocess/std", {width}, model.std, {}});
  }
  const std::string architecture = ToJson(model.model);
  std::map<std::string, std::string> metadata = {{"format", kFormat},
                                                 {"segps.job", model.job},
                                                 {"segps.model", architecture},
                                                 {"segps.combine", v1::Combine_Name(model.model.combine())},
                                                 {"segps.input_scale", absl::StrFormat("%.9g", model.input_scale)},
                                                 {"segps.normalize", model.mean.empty() ? "NONE" : "STANDARDIZE"},
                                                 {"segps.config_fingerprint", model.config_fingerprint},
                                                 {"segps.csv_delimiter", model.csv_delimiter}};
  // One name a line: a CSV header's names hold no line breaks.
  if (!model.input_columns.empty()) metadata["segps.input_columns"] = absl::StrJoin(model.input_columns, "\n");
  return WriteSafetensors(path, tensors, metadata);
}

RowSource TableRows(const TrainedModel& model) {
  if (model.model.categorical_fields() == 0) return nullptr;
  return [&model](int segment, const std::vector<std::vector<uint64_t>>& ids, std::vector<std::vector<float>>* values) {
    values->resize(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      const v1::EmbeddingConfig& table = model.model.segments(segment).embeddings(static_cast<int>(t));
      const std::vector<float>& rows = model.tables[segment][t];
      (*values)[t].resize(ids[t].size() * table.dim());
      for (size_t r = 0; r < ids[t].size(); ++r) {
        if (ids[t][r] >= table.vocab()) {
          return absl::InvalidArgumentError(absl::StrCat("id ", ids[t][r], " of table ", table.name(),
                                                         " is outside [0, ", table.vocab(), ")"));
        }
        std::copy_n(rows.begin() + static_cast<ptrdiff_t>(ids[t][r] * table.dim()), table.dim(),
                    (*values)[t].begin() + static_cast<ptrdiff_t>(r * table.dim()));
      }
    }
    return absl::OkStatus();
  };
}

absl::StatusOr<TrainedModel> ReadModelSafetensors(const std::string& path) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(path);
  if (!file.ok()) return file.status();
  const auto& meta = file->metadata();
  auto field = [&](const std::string& key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? "" : it->second;
  };
  if (field("format") != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a segps model export (metadata format is \"",
                                                   field("format"), "\", expected \"", kFormat, "\")"));
  }
  TrainedModel out;
  out.job = field("segps.job");
  out.config_fingerprint = field("segps.config_fingerprint");
  if (!google::protobuf::util::JsonStringToMessage(field("segps.model"), &out.model).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": metadata segps.model is not a model config"));
  }
  // The architecture must be one a job config could hold.
  v1::JobConfig check;
  *check.mutable_model() = out.model;
  check.mutable_cluster()->set_num_servers(1);
  check.mutable_optimizer()->set_kind(v1::SGD);
  // A regression trains on files of real-valued targets, tables on ids.
  if (out.model.loss() == v1::MSE || out.model.categorical_fields() > 0) {
    check.mutable_data()->set_source(v1::NPY);
    check.mutable_data()->set_train_x("x.npy");
    check.mutable_data()->set_train_y("y.npy");
    if (out.model.categorical_fields() > 0) check.mutable_data()->set_train_ids("ids.npy");
  } else {
    check.mutable_data()->set_source(v1::SYNTHETIC_SEED);
  }
  std::string text;
  google::protobuf::TextFormat::PrintToString(check, &text);
  absl::StatusOr<v1::JobConfig> valid = ParseConfig(text, path + " metadata segps.model");
  if (!valid.ok()) return valid.status();
  out.model = valid->model();
  if (!absl::SimpleAtof(field("segps.input_scale"), &out.input_scale) || !(out.input_scale > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": metadata segps.input_scale is not a positive number"));
  }
  absl::StatusOr<ShardMap> map = ShardMap::Create(out.model, 1);
  if (!map.ok()) return map.status();
  for (int k = 0; k < map->num_segments(); ++k) {
    out.params.emplace_back(map->segment_size(k));
    for (const TensorLayout& t : map->tensors(k)) {
      absl::StatusOr<std::vector<float>> values = file->Float32(TensorName(out.model, k, t), TensorShape(t));
      if (!values.ok()) return values.status();
      std::copy(values->begin(), values->end(), out.params[k].begin() + t.offset);
    }
    const v1::SegmentConfig& segment = out.model.segments(k);
    out.tables.emplace_back();
    for (int t = 0; t < segment.embeddings_size(); ++t) {
      absl::StatusOr<std::vector<float>> rows = file->Float32(
          TableName(out.model, k, t), {segment.embeddings(t).vocab(), segment.embeddings(t).dim()});
      if (!rows.ok()) return rows.status();
      out.tables.back().push_back(*std::move(rows));
    }
  }
  if (!field("segps.input_columns").empty()) {
    out.input_columns = absl::StrSplit(field("segps.input_columns"), '\n');
    if (out.input_columns.size() != out.model.input_width()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": metadata segps.input_columns names ",
                                                     out.input_columns.size(), " columns for ",
                                                     out.model.input_width(), " inputs"));
    }
  }
  out.csv_delimiter = field("segps.csv_delimiter").empty() ? "," : field("segps.csv_delimiter");
  if (field("segps.normalize") == "STANDARDIZE") {
    const uint64_t width = out.model.input_width();
    absl::StatusOr<std::vector<float>> mean = file->Float32("preprocess/mean", {width});
    if (!mean.ok()) return mean.status();
    absl::StatusOr<std::vector<float>> std = file->Float32("preprocess/std", {width});
    if (!std.ok()) return std.status();
    out.mean = *std::move(mean);
    out.std = *std::move(std);
  }
  return out;
}

namespace {

// An ONNX graph being written: its initializers, nodes and typed values.
class OnnxGraph {
 public:
  explicit OnnxGraph(onnx::GraphProto* graph) : graph_(graph) {}

  void Initializer(const std::string& name, const std::vector<uint64_t>& shape, absl::Span<const float> v) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (uint64_t d : shape) t->add_dims(static_cast<int64_t>(d));
    t->set_raw_data(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  void Index(const std::string& name, int64_t value) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_int64_data(value);
  }
  // A node of `op` whose one output is named `output`: that name.
  std::string Node(const std::string& op, const std::vector<std::string>& inputs, const std::string& output) {
    AddNode(op, inputs, output);
    return output;
  }
  onnx::NodeProto* AddNode(const std::string& op, const std::vector<std::string>& inputs, const std::string& output) {
    onnx::NodeProto* n = graph_->add_node();
    n->set_op_type(op);
    n->set_name(output);
    for (const std::string& in : inputs) n->add_input(in);
    n->add_output(output);
    return n;
  }
  // A [batch, width] tensor (float, or `type`) as a graph input or output.
  static void Value(onnx::ValueInfoProto* v, const std::string& name, uint64_t width,
                    int type = onnx::TensorProto::FLOAT) {
    v->set_name(name);
    auto* tensor = v->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(type);
    tensor->mutable_shape()->add_dim()->set_dim_param("batch");
    tensor->mutable_shape()->add_dim()->set_dim_value(static_cast<int64_t>(width));
  }
  onnx::GraphProto* proto() { return graph_; }

 private:
  onnx::GraphProto* const graph_;
};

// The model's preprocessing of "input" (scale, standardization): the features' name.
std::string Preprocess(const TrainedModel& model, OnnxGraph* g) {
  const uint64_t width = model.model.input_width();
  std::string features = "input";
  if (model.input_scale != 1) {
    const float scale = model.input_scale;
    g->Initializer("preprocess/scale", {}, absl::MakeConstSpan(&scale, 1));
    features = g->Node("Mul", {features, "preprocess/scale"}, "preprocess/scaled");
  }
  if (!model.mean.empty()) {
    g->Initializer("preprocess/mean", {width}, model.mean);
    g->Initializer("preprocess/std", {width}, model.std);
    features = g->Node("Sub", {features, "preprocess/mean"}, "preprocess/centred");
    features = g->Node("Div", {features, "preprocess/std"}, "preprocess/standardized");
  }
  return features;
}

// Segment k's first layer's input: `h` followed by, for each of its tables
// in order and each field the table serves, the row of that field's id
// (Gather from "ids"); `h` itself for a segment without tables.
std::string AddTables(const TrainedModel& model, int k, const std::string& h, OnnxGraph* g) {
  const v1::SegmentConfig& seg = model.model.segments(k);
  if (seg.embeddings_size() == 0) return h;
  std::vector<std::string> parts = {h};
  for (int t = 0; t < seg.embeddings_size(); ++t) {
    const v1::EmbeddingConfig& table = seg.embeddings(t);
    const std::string weight = TableName(model.model, k, t);
    g->Initializer(weight, {table.vocab(), table.dim()}, model.tables[k][t]);
    for (int f = 0; f < table.field_size(); ++f) {
      const std::string field = absl::StrCat("ids/field_", table.field(f));
      if (absl::c_none_of(g->proto()->initializer(), [&](const onnx::TensorProto& i) { return i.name() == field; })) {
        g->Index(field, table.field(f));
      }
      auto* axis = g->AddNode("Gather", {"ids", field}, absl::StrCat(weight, "/ids_", f))->add_attribute();
      axis->set_name("axis");
      axis->set_type(onnx::AttributeProto::INT);
      axis->set_i(1);
      parts.push_back(g->Node("Gather", {weight, absl::StrCat(weight, "/ids_", f)}, absl::StrCat(weight, "/rows_", f)));
    }
  }
  auto* axis = g->AddNode("Concat", parts, seg.name() + "/input")->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  return seg.name() + "/input";
}

// Segment k's layers from `h`: the name of its output.
std::string AddSegment(const TrainedModel& model, const ShardMap& map, int k, std::string h, OnnxGraph* g) {
  const bool chain = model.model.combine() == v1::CHAIN;
  const v1::SegmentConfig& seg = model.model.segments(k);
  const auto& tensors = map.tensors(k);
  h = AddTables(model, k, h, g);
  for (size_t i = 0; i + 1 < tensors.size(); i += 2) {
    const TensorLayout& kernel = tensors[i];
    const TensorLayout& bias = tensors[i + 1];
    const std::string layer = absl::StrCat(seg.name(), "/dense_", kernel.layer);
    g->Initializer(TensorName(model.model, k, kernel), TensorShape(kernel),
                   absl::MakeConstSpan(model.params[k]).subspan(kernel.offset, kernel.size()));
    g->Initializer(TensorName(model.model, k, bias), TensorShape(bias),
                   absl::MakeConstSpan(model.params[k]).subspan(bias.offset, bias.size()));
    h = g->Node("Gemm", {h, TensorName(model.model, k, kernel), TensorName(model.model, k, bias)},
                absl::StrCat(layer, "/linear"));
    const bool last = static_cast<int>(kernel.layer) + 1 == seg.layers_size();
    const std::string out = last && !chain                         ? seg.name() + "/probabilities"
                            : last && k + 1 == map.num_segments() ? "probabilities"
                                                                   : layer + "/output";
    switch (seg.layers(kernel.layer).activation()) {
      case v1::RELU: h = g->Node("Relu", {h}, out); break;
      case v1::TANH: h = g->Node("Tanh", {h}, out); break;
      case v1::SIGMOID: h = g->Node("Sigmoid", {h}, out); break;
      case v1::SOFTMAX: {
        auto* axis = g->AddNode("Softmax", {h}, out)->add_attribute();
        axis->set_name("axis");
        axis->set_type(onnx::AttributeProto::INT);
        axis->set_i(1);
        h = out;
        break;
      }
      default: h = g->Node("Identity", {h}, out);
    }
  }
  return h;
}

}  // namespace

absl::Status WriteModelOnnx(const TrainedModel& model, const std::string& path) {
  absl::StatusOr<ShardMap> map = ShardMap::Create(model.model, 1);
  if (!map.ok()) return map.status();
  SEGPS_RETURN_IF_ERROR(CheckTables(model));
  onnx::ModelProto proto;
  proto.set_ir_version(8);
  proto.set_producer_name("segps");
  const bool chain = model.model.combine() == v1::CHAIN;
  proto.set_doc_string(absl::StrCat("segps job ", model.job, ": ",
                                    chain ? absl::StrCat("one network, a chain of ", model.model.segments_size(),
                                                         " stages")
                                          : absl::StrCat("the ensemble of ", model.model.segments_size(),
                                                         " segments (mean of their softmax outputs)")));
  auto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(13);
  auto* meta = proto.add_metadata_props();
  meta->set_key("segps.config_fingerprint");
  meta->set_value(model.config_fingerprint);
  OnnxGraph g(proto.mutable_graph());
  g.proto()->set_name(model.job);
  const uint64_t classes = model.model.num_classes();
  OnnxGraph::Value(g.proto()->add_input(), "input", model.model.input_width());
  if (model.model.categorical_fields() > 0) {
    OnnxGraph::Value(g.proto()->add_input(), "ids", model.model.categorical_fields(), onnx::TensorProto::INT64);
  }
  const std::string features = Preprocess(model, &g);
  // An ensemble's segments each start from the features; a chain's stage
  // from the previous stage's output.
  std::vector<std::string> outputs;
  std::string h = features;
  for (int k = 0; k < map->num_segments(); ++k) {
    h = AddSegment(model, *map, k, chain ? h : features, &g);
    outputs.push_back(h);
  }
  OnnxGraph::Value(g.proto()->add_output(), "probabilities", classes);
  if (!chain) {
    g.Node("Mean", outputs, "probabilities");
    for (const std::string& out : outputs) OnnxGraph::Value(g.proto()->add_output(), out, classes);
  }
  std::string bytes;
  if (!proto.SerializeToString(&bytes)) return absl::InternalError("export: the ONNX model does not serialise");
  return WriteFileAtomically(path, bytes);
}

}  // namespace segps
