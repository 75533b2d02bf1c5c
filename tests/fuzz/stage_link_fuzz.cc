// libFuzzer target for the messages a pipeline stage takes from its
// neighbours (worker/train/link_messages.h): an input's first byte picks
// the message (even: Activations as the next stage checks them; odd:
// Gradients as the previous stage decodes their values), the rest is its
// protobuf encoding as it arrives on the link. Whatever a check accepts
// must be what the stage relies on (sizes, finite values, labels within
// the classes); anything else aborts.
//
// Built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/run.sh;
// in every other build it is linked with replay_main.cc and replays the
// committed corpus (tests/fuzz/corpus/stage_link) as a unit test.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/tensor_wire.h"
#include "worker/train/link_messages.h"

namespace segps {
namespace {

constexpr uint64_t kWidth = 3;
constexpr uint32_t kClasses = 4;

const LinkEnd& End() {
  static const LinkEnd* end = new LinkEnd{"model", 1, 0, kWidth, kClasses, "stage 0 (in) replica 0"};
  return *end;
}

void Require(bool holds) {
  if (!holds) std::abort();
}

void Activations(const std::string& bytes) {
  v1::Activations m;
  if (!m.ParseFromString(bytes)) return;
  absl::StatusOr<MicroBatch> batch = CheckActivations(m, End());
  if (!batch.ok() || batch->done) return;
  Require(batch->rows > 0 && batch->rows <= batch->batch_rows);
  Require(batch->values.size() == uint64_t{batch->rows} * kWidth && batch->labels.size() == batch->rows);
  for (float v : batch->values) Require(std::isfinite(v));
  for (int32_t label : batch->labels) Require(label >= 0 && static_cast<uint32_t>(label) < kClasses);
}

void Gradients(const std::string& bytes) {
  v1::Gradients m;
  if (!m.ParseFromString(bytes)) return;
  absl::StatusOr<std::vector<float>> values = LinkValues(m.values(), 2 * kWidth, "Exchange gradients");
  if (!values.ok()) return;
  Require(values->size() == 2 * kWidth);
  for (float v : *values) Require(std::isfinite(v));
}

std::string Seed(char kind, const google::protobuf::MessageLite& message) {
  return std::string(1, kind) + message.SerializeAsString();
}

}  // namespace

// Seeds: a good micro-batch, the last message, a label out of range, a
// good gradient.
std::vector<std::pair<std::string, std::string>> FuzzSeeds() {
  v1::Activations good;
  good.set_model_fingerprint("model");
  good.set_batch_rows(4);
  good.set_rows(2);
  EncodeFloat32(std::vector<float>{1, 2, 3, 4, 5, 6}, 0, good.mutable_values());
  const int32_t labels[2] = {0, 3};
  good.set_labels(std::string(reinterpret_cast<const char*>(labels), sizeof(labels)));
  v1::Activations done;
  done.set_model_fingerprint("model");
  done.set_done(true);
  v1::Activations bad_label = good;
  const int32_t bad[2] = {0, 4};
  bad_label.set_labels(std::string(reinterpret_cast<const char*>(bad), sizeof(bad)));
  v1::Gradients gradient;
  EncodeFloat32(std::vector<float>{0.5f, -1, 2, 0, 1, 3}, 0, gradient.mutable_values());
  return {{"activations", Seed(0, good)},
          {"done", Seed(0, done)},
          {"bad_label", Seed(0, bad_label)},
          {"gradients", Seed(1, gradient)}};
}

}  // namespace segps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool routed = (segps::RouteProtobufLogs(), true);  // as segps-worker does
  (void)routed;
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    segps::Activations(bytes);
  } else {
    segps::Gradients(bytes);
  }
  return 0;
}
