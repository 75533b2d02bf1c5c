#include "common/config.h"

#include "common/balance.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config_hints.h"
#include "common/config_locator.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace segps {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::TextFormat;

class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first_.empty()) first_ = absl::StrFormat("line %d column %d: %s", line + 1, column + 1, message);
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

constexpr uint32_t kMaxLayerUnits = 1u << 20;

// cluster: the servers, messages, deadlines and leases.
absl::Status ValidateCluster(v1::JobConfig& c, const Locator& at) {
  auto* cluster = c.mutable_cluster();
  if (cluster->server_addresses_size() > 0) {
    if (cluster->num_servers() == 0) cluster->set_num_servers(cluster->server_addresses_size());
    if (cluster->num_servers() != static_cast<uint32_t>(cluster->server_addresses_size())) {
      return at.Error({{"cluster", -1}, {"num_servers", -1}},
                      absl::StrCat("is ", cluster->num_servers(), " but ",
                                   cluster->server_addresses_size(),
                                   " server_addresses are listed; they must agree"));
    }
  }
  if (cluster->num_servers() == 0) {
    return at.Error({{"cluster", -1}, {"num_servers", -1}},
                    "must be >= 1 (or list cluster.server_addresses)");
  }
  if (cluster->num_servers() > 1024) {
    return at.Error({{"cluster", -1}, {"num_servers", -1}}, "must be <= 1024");
  }
  if (cluster->replicas() == 0) cluster->set_replicas(1);
  if (cluster->replicas() > cluster->num_servers()) {
    return at.Error({{"cluster", -1}, {"replicas", -1}},
                    absl::StrCat("is ", cluster->replicas(), "; it must be at most num_servers (",
                                 cluster->num_servers(), "): each copy of a range lives on another server"));
  }
  if (cluster->lease_ms() == 0) cluster->set_lease_ms(3000);
  if (cluster->pull_wait_ms() == 0) cluster->set_pull_wait_ms(10000);
  if (cluster->max_message_bytes() == 0) cluster->set_max_message_bytes(64ull << 20);
  if (cluster->max_message_bytes() > (1ull << 31) - 1) {
    return at.Error({{"cluster", -1}, {"max_message_bytes", -1}}, "must be < 2 GiB (a gRPC limit)");
  }
  if (cluster->chunk_bytes() == 0) cluster->set_chunk_bytes(std::min<uint64_t>(2ull << 20, cluster->max_message_bytes() - 4096));
  if (cluster->chunk_bytes() < 4096 || cluster->chunk_bytes() + 4096 > cluster->max_message_bytes()) {
    return at.Error({{"cluster", -1}, {"chunk_bytes", -1}},
                    absl::StrCat("is ", cluster->chunk_bytes(), "; it must be at least 4096 and leave 4096 bytes of ",
                                 "max_message_bytes (", cluster->max_message_bytes(), ") for the message header"));
  }
  if (cluster->rpc_deadline_ms() == 0) cluster->set_rpc_deadline_ms(30000);
  if (cluster->recovery_timeout_ms() == 0) cluster->set_recovery_timeout_ms(300000);
  if (cluster->max_waiting_calls() == 0) cluster->set_max_waiting_calls(64);
  if (cluster->max_streams_per_connection() == 0) cluster->set_max_streams_per_connection(256);
  if (cluster->max_open_calls() == 0) cluster->set_max_open_calls(4096);
  if (cluster->max_open_calls() < 16) {
    return at.Error({{"cluster", -1}, {"max_open_calls", -1}}, "must be >= 16: a worker holds several calls per server");
  }

  return absl::OkStatus();
}

// checkpoint, and cluster.wire_dtype.
absl::Status ValidateCheckpointAndWire(v1::JobConfig& c, const Locator& at) {
  auto* cluster = c.mutable_cluster();
  auto* checkpoint = c.mutable_checkpoint();
  if (checkpoint->every_clocks() == 0) checkpoint->set_every_clocks(100);
  if (checkpoint->keep() == 0) checkpoint->set_keep(3);
  if (checkpoint->keep() < 2) {
    return at.Error({{"checkpoint", -1}, {"keep", -1}},
                    "must be >= 2, so that a crash while writing a checkpoint leaves a valid one");
  }
  if (!(checkpoint->every_seconds() >= 0 && std::isfinite(checkpoint->every_seconds()))) {
    return at.Error({{"checkpoint", -1}, {"every_seconds", -1}},
                    absl::StrCat("must be finite and >= 0, got ", checkpoint->every_seconds()));
  }
  if (cluster->bfloat16_wire()) {
    return at.Error({{"cluster", -1}, {"bfloat16_wire", -1}}, "is replaced by wire_dtype: BFLOAT16");
  }
  if (cluster->wire_dtype() == v1::DTYPE_UNSPECIFIED) cluster->set_wire_dtype(v1::FLOAT32);
  if (cluster->wire_dtype() != v1::FLOAT32 && cluster->wire_dtype() != v1::BFLOAT16 &&
      cluster->wire_dtype() != v1::FLOAT16) {
    return at.Error({{"cluster", -1}, {"wire_dtype", -1}},
                    absl::StrCat("is ", static_cast<int>(cluster->wire_dtype()), "; use FLOAT32, BFLOAT16 or FLOAT16"));
  }

  return absl::OkStatus();
}

// training fields that segments inherit (checked before them).
absl::Status ValidateTrainingDefaults(v1::JobConfig& c, const Locator& at) {
  auto* training = c.mutable_training();
  if (training->batch_size() == 0) training->set_batch_size(32);
  if (training->epochs() == 0) training->set_epochs(1);
  if (training->staleness() < -1) {
    return at.Error({{"training", -1}, {"staleness", -1}},
                    absl::StrCat("must be >= 0, or -1 for unbounded; got ", training->staleness()));
  }
  if (training->workers_per_segment() == 0) training->set_workers_per_segment(1);
  if (training->log_interval_s() <= 0) training->set_log_interval_s(2.0f);

  return absl::OkStatus();
}

// model.partition: BALANCED cuts one segment into the stages of a CHAIN.
absl::Status PartitionBalanced(v1::ModelConfig* model, bool chain, const Locator& at) {
  if (model->partition() == v1::BALANCED) {
    if (!chain || model->segments_size() != 1) {
      return at.Error({{"model", -1}, {"partition", -1}},
                      "BALANCED cuts one segment's layers into the stages of a CHAIN: give combine: CHAIN and one "
                      "segment");
    }
    const v1::SegmentConfig whole = model->segments(0);
    if (model->stages() < 2 || model->stages() > static_cast<uint32_t>(whole.layers_size())) {
      return at.Error({{"model", -1}, {"stages", -1}},
                      absl::StrCat("must be in [2, ", whole.layers_size(), "] (the segment's layers), got ",
                                   model->stages()));
    }
    std::vector<double> costs;
    uint64_t fan_in = model->input_width();
    for (const v1::LayerConfig& layer : whole.layers()) {
      costs.push_back(LayerCost(fan_in, layer.units(), costs.empty()));
      fan_in = layer.units();
    }
    model->clear_segments();
    int next = 0;
    const std::vector<uint32_t> cut = CutChain(costs, model->stages());
    for (size_t k = 0; k < cut.size(); ++k) {
      v1::SegmentConfig* stage = model->add_segments();
      *stage = whole;
      stage->set_name(absl::StrCat(whole.name(), "_", k));
      if (k > 0) stage->clear_input_width();
      stage->clear_layers();
      for (uint32_t l = 0; l < cut[k]; ++l) *stage->add_layers() = whole.layers(next++);
    }
  } else if (model->stages() != 0) {
    return at.Error({{"model", -1}, {"stages", -1}}, "is for partition: BALANCED");
  }
  return absl::OkStatus();
}

// The layers of segment k.
absl::Status ValidateLayers(const v1::ModelConfig* model, int k, bool chain, const Locator& at) {
  const v1::SegmentConfig* seg = &model->segments(k);
  for (int l = 0; l < seg->layers_size(); ++l) {
    const auto& layer = seg->layers(l);
    const bool last = l + 1 == seg->layers_size();
    if (layer.units() == 0 || layer.units() > kMaxLayerUnits) {
      return at.Error({{"model", -1}, {"segments", k}, {"layers", l}, {"units", -1}},
                      absl::StrCat("segment \"", seg->name(), "\" layer ", l,
                                   ": units must be in [1, ", kMaxLayerUnits, "], got ",
                                   layer.units()));
    }
    if (!v1::Activation_IsValid(layer.activation())) {
      return at.Error({{"model", -1}, {"segments", k}, {"layers", l}, {"activation", -1}},
                      absl::StrCat(layer.activation(), " is no activation: IDENTITY, RELU, TANH, SIGMOID, or SOFTMAX"));
    }
    if (layer.activation() == v1::ACTIVATION_UNSPECIFIED) {
      return at.Error({{"model", -1}, {"segments", k}, {"layers", l}, {"activation", -1}},
                      "is required: IDENTITY, RELU, TANH, SIGMOID, or SOFTMAX on the last layer");
    }
    if (layer.activation() == v1::SOFTMAX && !last) {
      return at.Error({{"model", -1}, {"segments", k}, {"layers", l}, {"activation", -1}},
                      "SOFTMAX is only allowed on a segment's last layer");
    }
    if (!(layer.dropout() >= 0 && layer.dropout() < 1) ||
        (layer.dropout() > 0 && layer.activation() == v1::SOFTMAX)) {
      return at.Error({{"model", -1}, {"segments", k}, {"layers", l}, {"dropout", -1}},
                      absl::StrCat("must be in [0, 1) on a layer that does not end in SOFTMAX, got ",
                                   layer.dropout()));
    }
    if (last && chain && k + 1 < model->segments_size()) {
      if (layer.activation() == v1::SOFTMAX) {
        return at.Error({{"model", -1}, {"segments", k}, {"layers", l}, {"activation", -1}},
                        absl::StrCat("stage \"", seg->name(),
                                     "\" of a CHAIN ends in SOFTMAX: only the last stage may"));
      }
    } else if (last && (layer.activation() != OutputActivation(*model) || layer.units() != model->num_classes())) {
      return at.Error({{"model", -1}, {"segments", k}, {"layers", l}},
                      absl::StrCat("segment \"", seg->name(), "\": the last layer must be ",
                                   v1::Activation_Name(OutputActivation(*model)), " with units == model.num_classes (",
                                   model->num_classes(), ")",
                                   model->loss() == v1::MSE ? " under loss: MSE" : ""));
    }
  }
  return absl::OkStatus();
}

// Segment k's embedding tables: named uniquely, shaped, each field an id column.
absl::Status ValidateEmbeddings(const v1::ModelConfig& model, int k, uint32_t servers, const Locator& at) {
  const v1::SegmentConfig& seg = model.segments(k);
  if (seg.embeddings_size() > 0 && model.combine() == v1::CHAIN) {
    return at.Error({{"model", -1}, {"segments", k}, {"embeddings", 0}}, "tables are not supported in a CHAIN's stages");
  }
  // A step's rows ride on its push to every server: each must hold part of the dense range.
  if (seg.embeddings_size() > 0 && ShardMap::Create(model, 1)->segment_size(k) < servers) {
    return at.Error({{"model", -1}, {"segments", k}, {"embeddings", 0}},
                    absl::StrCat("segment \"", seg.name(), "\" has fewer dense parameters than the ", servers,
                                 " servers; a segment with tables needs at least one on each"));
  }
  for (int t = 0; t < seg.embeddings_size(); ++t) {
    const v1::EmbeddingConfig& table = seg.embeddings(t);
    auto error = [&](const char* field, const std::string& message) {
      return at.Error({{"model", -1}, {"segments", k}, {"embeddings", t}, {field, -1}},
                      absl::StrCat("table \"", table.name(), "\" of segment \"", seg.name(), "\": ", message));
    };
    if (table.name().empty()) return error("name", "is required");
    for (int u = 0; u < t; ++u) {
      if (seg.embeddings(u).name() == table.name()) return error("name", "is used by another table of the segment");
    }
    if (table.vocab() == 0) return error("vocab", "must be > 0");
    if (table.dim() == 0 || table.dim() > kMaxLayerUnits) return error("dim", absl::StrCat("must be in [1, ", kMaxLayerUnits, "]"));
    if (table.field_size() == 0) return error("field", "needs at least one id column");
    for (uint32_t field : table.field()) {
      if (field >= model.categorical_fields()) {
        return error("field", absl::StrCat(field, " is out of range: model.categorical_fields is ",
                                           model.categorical_fields(), " (id columns 0 to ",
                                           static_cast<int64_t>(model.categorical_fields()) - 1, ")"));
      }
    }
  }
  return absl::OkStatus();
}

// Segment k's declared tensors: named uniquely, shaped, initialised with
// finite values, alone (no layers or tables) and not in a CHAIN.
absl::Status ValidateTensors(const v1::ModelConfig& model, int k, const Locator& at) {
  const v1::SegmentConfig& seg = model.segments(k);
  const std::string where = absl::StrCat("segment \"", seg.name(), "\" is declared by its tensors");
  if (seg.layers_size() > 0) {
    return at.Error({{"model", -1}, {"segments", k}, {"layers", 0}}, where + ": give layers or tensors, not both");
  }
  if (seg.embeddings_size() > 0) {
    return at.Error({{"model", -1}, {"segments", k}, {"embeddings", 0}}, where + ": tables are for layered segments");
  }
  if (model.combine() == v1::CHAIN) {
    return at.Error({{"model", -1}, {"segments", k}, {"tensors", 0}}, where + ": not supported in a CHAIN's stages");
  }
  constexpr uint64_t kMaxSegmentElements = uint64_t{1} << 32;
  uint64_t total = 0;
  for (int t = 0; t < seg.tensors_size(); ++t) {
    const v1::TensorConfig& tensor = seg.tensors(t);
    auto error = [&](const char* field, const std::string& message) {
      return at.Error({{"model", -1}, {"segments", k}, {"tensors", t}, {field, -1}},
                      absl::StrCat("tensor \"", tensor.name(), "\" of segment \"", seg.name(), "\": ", message));
    };
    if (tensor.name().empty() || tensor.name().size() > 200) return error("name", "must be 1 to 200 characters");
    for (int u = 0; u < t; ++u) {
      if (seg.tensors(u).name() == tensor.name()) return error("name", "is used by another tensor of the segment");
    }
    if (tensor.shape_size() == 0) return error("shape", "needs at least one dimension");
    uint64_t elements = 1;
    for (uint64_t dim : tensor.shape()) {
      if (dim == 0 || dim > kMaxSegmentElements || elements * dim > kMaxSegmentElements - total) {
        return error("shape", absl::StrCat("dimensions must be > 0 and the segment at most ", kMaxSegmentElements,
                                           " elements; got ", dim, " after ", elements));
      }
      elements *= dim;
    }
    total += elements;
    const float init = tensor.init_case() == v1::TensorConfig::kUniform ? tensor.uniform() : tensor.constant();
    if (!std::isfinite(init) || (tensor.init_case() == v1::TensorConfig::kUniform && init < 0)) {
      return error(tensor.init_case() == v1::TensorConfig::kUniform ? "uniform" : "constant",
                   absl::StrCat("must be finite (and a uniform bound >= 0), got ", init));
    }
  }
  return absl::OkStatus();
}

// model.segments: names, input widths, layers, staleness and workers.
absl::Status ValidateSegments(v1::JobConfig& c, const Locator& at) {
  auto* model = c.mutable_model();
  auto* training = c.mutable_training();
  const bool chain = model->combine() == v1::CHAIN;
  for (int k = 0; k < model->segments_size(); ++k) {
    auto* seg = model->mutable_segments(k);
    if (seg->has_input_width()) {
      if (!chain) {
        return at.Error({{"model", -1}, {"segments", k}, {"input_width", -1}},
                        "is only for combine: CHAIN (every segment of an ensemble takes model.input_width)");
      }
      const uint64_t expected =
          k == 0 ? model->input_width() : model->segments(k - 1).layers(model->segments(k - 1).layers_size() - 1).units();
      if (seg->input_width() != expected) {
        return at.Error({{"model", -1}, {"segments", k}, {"input_width", -1}},
                        absl::StrCat("is ", seg->input_width(), ", but ",
                                     k == 0 ? std::string("model.input_width")
                                            : absl::StrCat("stage \"", model->segments(k - 1).name(), "\"'s last layer"),
                                     " gives ", expected));
      }
    }
    if (seg->name().empty()) {
      return at.Error({{"model", -1}, {"segments", k}, {"name", -1}}, "is required");
    }
    // A segment's name names its folder of checkpoints (which segps-local
    // --fresh deletes) and its tensors: one path component, never "." or "..".
    if (seg->name().size() > 100 || seg->name()[0] == '.' ||
        seg->name().find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
            std::string::npos) {
      return at.Error({{"model", -1}, {"segments", k}, {"name", -1}},
                      absl::StrCat("\"", absl::CHexEscape(seg->name()),
                                   "\" must be 1 to 100 letters, digits, '_', '-' or '.', not starting with '.'"));
    }
    for (int j = 0; j < k; ++j) {
      if (model->segments(j).name() == seg->name()) {
        return at.Error({{"model", -1}, {"segments", k}, {"name", -1}},
                        absl::StrCat("\"", seg->name(), "\" is used by segments[", j,
                                     "] too; names must be unique"));
      }
    }
    if (DeclaredByTensors(*seg)) {
      SEGPS_RETURN_IF_ERROR(ValidateTensors(*model, k, at));
    } else if (seg->layers_size() == 0) {
      return at.Error({{"model", -1}, {"segments", k}, {"layers", -1}},
                      absl::StrCat("segment \"", seg->name(), "\" needs at least one layer (or its tensors)"));
    }
    SEGPS_RETURN_IF_ERROR(ValidateLayers(model, k, chain, at));
    SEGPS_RETURN_IF_ERROR(ValidateEmbeddings(*model, k, c.cluster().num_servers(), at));
    if (seg->embeddings_size() > 0 && c.cluster().replicas() > 1) {
      return at.Error({{"model", -1}, {"segments", k}, {"embeddings", 0}},
                      "tables are not yet replicated: use cluster.replicas: 1 with embedding tables");
    }
    if (!seg->has_staleness()) seg->set_staleness(training->staleness());
    if (seg->staleness() < -1) {
      return at.Error({{"model", -1}, {"segments", k}, {"staleness", -1}},
                      absl::StrCat("must be >= 0, or -1 for unbounded; got ", seg->staleness()));
    }
    if (!seg->has_workers()) seg->set_workers(training->workers_per_segment());
    if (seg->workers() == 0 || seg->workers() > 4096) {
      return at.Error({{"model", -1}, {"segments", k}, {"workers", -1}},
                      absl::StrCat("must be in [1, 4096], got ", seg->workers()));
    }
  }
  return absl::OkStatus();
}

// model: its shape, how segments combine, then each segment.
absl::Status ValidateModel(v1::JobConfig& c, const Locator& at) {
  auto* model = c.mutable_model();
  if (model->segments_size() > 0 && TensorsOnly(*model)) {
    if (model->combine() == v1::COMBINE_UNSPECIFIED) model->set_combine(v1::AVERAGE_SOFTMAX);
    if (model->partition() == v1::PARTITION_UNSPECIFIED) model->set_partition(v1::MANUAL);
    if (model->partition() != v1::MANUAL) {
      return at.Error({{"model", -1}, {"partition", -1}}, "segments declared by their tensors are cut by hand");
    }
    return ValidateSegments(c, at);
  }
  if (model->input_width() == 0) {
    return at.Error({{"model", -1}, {"input_width", -1}}, "must be > 0");
  }
  if (!v1::Loss_IsValid(model->loss())) {
    return at.Error({{"model", -1}, {"loss", -1}}, absl::StrCat(model->loss(), " is no loss: CROSS_ENTROPY or MSE"));
  }
  if (model->loss() == v1::MSE && model->num_classes() != 1) {
    return at.Error({{"model", -1}, {"num_classes", -1}},
                    absl::StrCat("is ", model->num_classes(), "; loss: MSE regresses one target: set 1"));
  }
  if (model->loss() != v1::MSE && model->num_classes() < 2) {
    return at.Error({{"model", -1}, {"num_classes", -1}},
                    absl::StrCat("must be >= 2, got ", model->num_classes(), " (a regression sets loss: MSE)"));
  }
  if (model->segments_size() == 0) {
    return at.Error({{"model", -1}, {"segments", -1}}, "at least one segment is required");
  }
  if (model->combine() == v1::COMBINE_UNSPECIFIED) model->set_combine(v1::AVERAGE_SOFTMAX);
  const bool chain = model->combine() == v1::CHAIN;
  if (model->partition() == v1::PARTITION_UNSPECIFIED) model->set_partition(v1::MANUAL);
  SEGPS_RETURN_IF_ERROR(PartitionBalanced(model, chain, at));
  SEGPS_RETURN_IF_ERROR(ValidateSegments(c, at));
  return absl::OkStatus();
}

// training fields that depend on how segments combine (micro-batches, top-k).
absl::Status ValidateChainTraining(v1::JobConfig& c, const Locator& at) {
  auto* model = c.mutable_model();
  auto* training = c.mutable_training();
  const bool chain = model->combine() == v1::CHAIN;
  if (training->micro_batches() == 0) training->set_micro_batches(1);
  if (training->schedule() == v1::SCHEDULE_UNSPECIFIED) training->set_schedule(v1::GPIPE);
  if (chain) {
    for (int k = 1; k < model->segments_size(); ++k) {
      if (model->segments(k).workers() != model->segments(0).workers()) {
        return at.Error({{"model", -1}, {"segments", k}, {"workers", -1}},
                        absl::StrCat("is ", model->segments(k).workers(), ", but a CHAIN's stages pair up replica by "
                                     "replica: every stage needs as many workers as the first (",
                                     model->segments(0).workers(), ")"));
      }
    }
    if (training->batch_size() % training->micro_batches() != 0) {
      return at.Error({{"training", -1}, {"micro_batches", -1}},
                      absl::StrCat(training->micro_batches(), " does not divide batch_size ",
                                   training->batch_size()));
    }
    if (training->has_balance() || training->gradient_topk() != 0) {
      return at.Error({{"training", -1}, {training->has_balance() ? "balance" : "gradient_topk", -1}},
                      "is not supported with combine: CHAIN");
    }
  } else if (training->micro_batches() != 1) {
    return at.Error({{"training", -1}, {"micro_batches", -1}}, "is only for combine: CHAIN");
  }
  if (!(training->gradient_topk() >= 0 && training->gradient_topk() < 1)) {
    return at.Error({{"training", -1}, {"gradient_topk", -1}},
                    absl::StrCat("must be in [0, 1) (0: dense pushes), got ", training->gradient_topk()));
  }
  return absl::OkStatus();
}

// training.balance: shares of a clock by worker speed.
absl::Status ValidateBalance(v1::JobConfig& c, const Locator& at) {
  auto* model = c.mutable_model();
  auto* training = c.mutable_training();
  if (training->has_balance()) {
    auto* balance = training->mutable_balance();
    if (!balance->has_every_clocks()) balance->set_every_clocks(20);
    if (!balance->has_min_share()) balance->set_min_share(0.1f);
    if (!(balance->min_share() > 0 && balance->min_share() <= 1)) {
      return at.Error({{"training", -1}, {"balance", -1}, {"min_share", -1}},
                      absl::StrCat("must be in (0, 1], got ", balance->min_share()));
    }
    const uint32_t least = MinShare(*training);
    for (int k = 0; k < model->segments_size(); ++k) {
      const auto& seg = model->segments(k);
      if (seg.staleness() < 0) {
        return at.Error({{"training", -1}, {"balance", -1}}, absl::StrCat("needs a finite staleness bound, but segment \"", seg.name(),
                                            "\" is unbounded: the shares of a clock are fixed before any "
                                            "worker reaches it, which only a bound guarantees"));
      }
      if (balance->shares_size() == 0) continue;
      if (static_cast<uint32_t>(balance->shares_size()) != seg.workers()) {
        return at.Error({{"training", -1}, {"balance", -1}, {"shares", -1}},
                        absl::StrCat("gives ", balance->shares_size(), " shares, but segment \"", seg.name(),
                                     "\" has ", seg.workers(), " workers"));
      }
    }
    uint64_t total = 0;
    for (int r = 0; r < balance->shares_size(); ++r) {
      if (balance->shares(r) < least) {
        return at.Error({{"training", -1}, {"balance", -1}, {"shares", r}},
                        absl::StrCat("is ", balance->shares(r), ", below min_share x batch_size (", least, ")"));
      }
      total += balance->shares(r);
    }
    if (balance->shares_size() > 0 && total != uint64_t{training->batch_size()} * balance->shares_size()) {
      return at.Error({{"training", -1}, {"balance", -1}, {"shares", -1}},
                      absl::StrCat("sum to ", total, "; they must sum to batch_size x workers (",
                                   uint64_t{training->batch_size()} * balance->shares_size(), ")"));
    }
  }
  return absl::OkStatus();
}

// training.worker_parameter_budget_bytes and pushes_in_flight.
absl::Status ValidateBudget(v1::JobConfig& c, const Locator& at) {
  auto* model = c.mutable_model();
  auto* training = c.mutable_training();
  if (training->worker_parameter_budget_bytes() > 0) {
    const absl::StatusOr<ShardMap> map = ShardMap::Create(*model, 1);
    if (!map.ok()) return map.status();
    for (int k = 0; k < model->segments_size(); ++k) {
      const uint64_t need = map->segment_size(k) * kWorkerBytesPerParameter;
      if (need > training->worker_parameter_budget_bytes()) {
        return at.Error({{"training", -1}, {"worker_parameter_budget_bytes", -1}},
                        absl::StrCat("is ", training->worker_parameter_budget_bytes(), ", but a worker of segment \"",
                                     model->segments(k).name(), "\" needs ", need, " (", map->segment_size(k),
                                     " parameters x ", kWorkerBytesPerParameter,
                                     "): cut the network into stages (model.combine: CHAIN)"));
      }
    }
  }
  if (training->pushes_in_flight() > 64) {
    return at.Error({{"training", -1}, {"pushes_in_flight", -1}}, "must be <= 64");
  }

  return absl::OkStatus();
}

// optimizer.schedule: each decay's fields, and no other decay's.
absl::Status ValidateSchedule(v1::LearningRateSchedule* s, const Locator& at) {
  auto error = [&](const char* field, const std::string& message) {
    return at.Error({{"optimizer", -1}, {"schedule", -1}, {field, -1}}, message);
  };
  const bool step = s->decay() == v1::LearningRateSchedule::STEP, cosine = s->decay() == v1::LearningRateSchedule::COSINE;
  if (step && s->step_updates() == 0) return error("step_updates", "is required for STEP: updates between decays");
  if (!step && (s->step_updates() != 0 || s->has_gamma())) return error("step_updates", "is used by decay STEP only");
  if (step && !s->has_gamma()) s->set_gamma(0.1f);
  if (step && !(s->gamma() > 0 && s->gamma() <= 1)) {
    return error("gamma", absl::StrCat("must be in (0, 1], got ", s->gamma()));
  }
  if (cosine && s->decay_updates() == 0) return error("decay_updates", "is required for COSINE: updates to decay over");
  if (!cosine && (s->decay_updates() != 0 || s->min_factor() != 0)) {
    return error("decay_updates", "is used by decay COSINE only");
  }
  if (cosine && !(s->min_factor() >= 0 && s->min_factor() <= 1)) {
    return error("min_factor", absl::StrCat("must be in [0, 1], got ", s->min_factor()));
  }
  return absl::OkStatus();
}

// optimizer: kind, learning rate and hyperparameters.
absl::Status ValidateOptimizer(v1::JobConfig& c, const Locator& at) {
  auto* opt = c.mutable_optimizer();
  switch (opt->kind()) {
    case v1::SGD:
    case v1::MOMENTUM:
      if (!opt->has_learning_rate()) opt->set_learning_rate(0.01f);
      break;
    case v1::ADAM:
    case v1::ADAGRAD:
      if (!opt->has_learning_rate()) opt->set_learning_rate(0.001f);
      break;
    default:
      return at.Error({{"optimizer", -1}, {"kind", -1}}, "is required: SGD, MOMENTUM, ADAM or ADAGRAD");
  }
  if (!opt->has_beta1()) opt->set_beta1(0.9f);
  if (!opt->has_beta2()) opt->set_beta2(0.999f);
  if (!opt->has_epsilon()) opt->set_epsilon(1e-7f);
  if (!opt->has_momentum()) opt->set_momentum(0.9f);
  if (!opt->has_initial_accumulator()) opt->set_initial_accumulator(0.1f);
  if (!(opt->learning_rate() > 0)) {
    return at.Error({{"optimizer", -1}, {"learning_rate", -1}},
                    absl::StrCat("must be > 0, got ", opt->learning_rate()));
  }
  auto in_unit = [](float v) { return v >= 0 && v < 1; };
  if (!in_unit(opt->beta1())) return at.Error({{"optimizer", -1}, {"beta1", -1}}, "must be in [0, 1)");
  if (!in_unit(opt->beta2())) return at.Error({{"optimizer", -1}, {"beta2", -1}}, "must be in [0, 1)");
  if (!in_unit(opt->momentum())) {
    return at.Error({{"optimizer", -1}, {"momentum", -1}}, "must be in [0, 1)");
  }
  if (!(opt->epsilon() > 0)) return at.Error({{"optimizer", -1}, {"epsilon", -1}}, "must be > 0");
  if (!(opt->weight_decay() >= 0)) {
    return at.Error({{"optimizer", -1}, {"weight_decay", -1}}, "must be >= 0");
  }
  if (!(opt->initial_accumulator() >= 0)) {
    return at.Error({{"optimizer", -1}, {"initial_accumulator", -1}}, "must be >= 0");
  }
  for (const auto& [name, value] : {std::pair{"clip_value", opt->clip_value()},
                                    std::pair{"clip_gradient_norm", opt->clip_gradient_norm()}}) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return at.Error({{"optimizer", -1}, {name, -1}}, absl::StrCat("must be finite and >= 0 (0: no clipping), got ", value));
    }
  }
  if (opt->momentum_lookahead() && opt->kind() != v1::MOMENTUM && opt->kind() != v1::ADAM) {
    return at.Error({{"optimizer", -1}, {"momentum_lookahead", -1}},
                    absl::StrCat("needs an optimizer with momentum (MOMENTUM or ADAM); ",
                                 v1::OptimizerKind_Name(opt->kind()), " has none"));
  }
  return ValidateSchedule(opt->mutable_schedule(), at);
}


absl::Status ValidateAndFill(v1::JobConfig& c, const Locator& at) {
  if (c.name().empty()) c.set_name("segps");
  for (auto* part : {&ValidateCluster, &ValidateCheckpointAndWire, &ValidateTrainingDefaults, &ValidateModel,
                     &ValidateChainTraining, &ValidateBalance, &ValidateBudget, &ValidateOptimizer,
                     &ValidateDataSource, &ValidateDataFiles}) {
    SEGPS_RETURN_IF_ERROR(part(c, at));
  }
  return absl::OkStatus();
}

}  // namespace

bool TensorsOnly(const v1::ModelConfig& model) {
  return std::all_of(model.segments().begin(), model.segments().end(),
                     [](const v1::SegmentConfig& segment) { return DeclaredByTensors(segment); });
}

absl::StatusOr<v1::JobConfig> ParseConfig(absl::string_view text, absl::string_view source_name) {
  v1::JobConfig config;
  TextFormat::Parser parser;
  CollectErrors errors;
  TextFormat::ParseInfoTree tree;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, " ", errors.first(), ParseErrorHint(*v1::JobConfig::descriptor(), errors.first())));
  }
  Locator at(&tree, std::string(source_name));
  absl::Status status = ValidateAndFill(config, at);
  if (!status.ok()) return status;
  return config;
}

absl::StatusOr<v1::JobConfig> LoadConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, ": cannot be opened"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<v1::JobConfig> config = ParseConfig(text.str(), path);
  if (!config.ok()) return config;
  // Data files are named relative to the config file, wherever it is read from.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  auto* data = config->mutable_data();
  for (std::string* file : {data->mutable_train_x(), data->mutable_train_y(), data->mutable_test_x(),
                            data->mutable_test_y(), data->mutable_train_csv(), data->mutable_test_csv(),
                            data->mutable_train_ids(), data->mutable_test_ids()}) {
    if (!file->empty() && (*file)[0] != '/') *file = dir + *file;
  }
  auto* security = config->mutable_security();
  for (std::string* file : {security->mutable_ca_cert(), security->mutable_cert(), security->mutable_key(),
                            security->mutable_token_file()}) {
    if (!file->empty() && (*file)[0] != '/') *file = dir + *file;
  }
  std::string* checkpoint_dir = config->mutable_checkpoint()->mutable_dir();
  if (!checkpoint_dir->empty() && (*checkpoint_dir)[0] != '/') *checkpoint_dir = dir + *checkpoint_dir;
  return config;
}

int SegmentIndex(const v1::ModelConfig& model, const std::string& name_or_index) {
  for (int k = 0; k < model.segments_size(); ++k) {
    if (model.segments(k).name() == name_or_index || std::to_string(k) == name_or_index) return k;
  }
  return -1;
}

uint32_t PushesInFlight(const v1::JobConfig& config, int segment) {
  if (config.training().pushes_in_flight() > 0) return config.training().pushes_in_flight();
  const int32_t s = StalenessOf(config, segment);
  if (s < 0) return 8;
  return static_cast<uint32_t>(std::min(s + 1, 8));
}

uint32_t MinShare(const v1::TrainingConfig& training) {
  const double share = std::ceil(double{training.balance().min_share()} * training.batch_size() - 1e-9);
  return std::max<uint32_t>(1, static_cast<uint32_t>(share));
}

}  // namespace segps
