#include "worker/train/run_history.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "worker/model/evaluator.h"
#include "worker/data/npy.h"

namespace segps {
namespace {

std::string Base(const std::string& dir, const std::string& segment, uint32_t rank) {
  return absl::StrCat(dir, "/", segment, ".", rank);
}

}  // namespace

absl::Status WriteHistory(const std::string& dir, const v1::WorkerHistory& history,
                          const std::vector<std::vector<float>>& test_probabilities, uint32_t classes) {
  const std::string base = Base(dir, history.segment(), history.rank());
  SEGPS_RETURN_IF_ERROR(WriteFileAtomically(base + ".json", ToJson(history) + "\n"));
  if (test_probabilities.empty()) return absl::OkStatus();
  std::vector<float> all;
  for (const auto& epoch : test_probabilities) all.insert(all.end(), epoch.begin(), epoch.end());
  const uint64_t rows = test_probabilities[0].size() / classes;
  return WriteNpy(base + ".test_probs.npy", "<f4", all.data(), all.size() * sizeof(float),
                  {test_probabilities.size(), rows, classes});
}

absl::StatusOr<v1::RunHistory> ReadHistory(const std::string& dir, const v1::JobConfig& config,
                                           const Dataset& test) {
  v1::RunHistory out;
  const auto& model = config.model();
  const uint64_t classes = model.num_classes();
  // probs[k]: segment k's rank 0 probabilities [epochs x rows x classes],
  // the first of epoch first[k]; the ensemble's epochs are [from, to].
  std::vector<std::vector<float>> probs(model.segments_size());
  std::vector<uint64_t> first(model.segments_size());
  uint64_t from = 1, to = UINT64_MAX;
  for (int k = 0; k < model.segments_size(); ++k) {
    for (uint32_t r = 0; r < model.segments(k).workers(); ++r) {
      const std::string base = Base(dir, model.segments(k).name(), r);
      std::ifstream in(base + ".json");
      if (!in) {
        if (r == 0) to = 0;  // without every segment's probabilities, no ensemble history
        continue;
      }
      std::stringstream text;
      text << in.rdbuf();
      v1::WorkerHistory* history = out.add_workers();
      if (!google::protobuf::util::JsonStringToMessage(text.str(), history).ok()) {
        return absl::InvalidArgumentError(absl::StrCat(base, ".json: not a worker history"));
      }
      if (r != 0) continue;
      absl::StatusOr<NpyHeader> h = ReadNpyHeader(base + ".test_probs.npy");
      if (!h.ok() || h->kind != 'f' || h->item_bytes != 4 || h->shape.size() != 3 || h->shape[1] != test.size() ||
          h->shape[2] != classes || history->first_scored_epoch() == 0) {
        to = 0;  // without every segment's probabilities, no ensemble history
        continue;
      }
      absl::StatusOr<MappedRegion> data = MappedRegion::Map(base + ".test_probs.npy", h->data_offset,
                                                            h->elements() * sizeof(float));
      if (!data.ok()) return data.status();
      probs[k].resize(h->elements());
      std::memcpy(probs[k].data(), data->data(), data->size());
      first[k] = history->first_scored_epoch();
      from = std::max(from, first[k]);
      to = std::min(to, first[k] + h->shape[0] - 1);
    }
  }
  if (to == UINT64_MAX) to = 0;
  const uint64_t per_epoch = test.size() * classes;
  std::vector<float> ensemble(per_epoch);
  for (uint64_t e = from; e <= to; ++e) {
    std::vector<double> sum(per_epoch, 0.0);
    for (size_t k = 0; k < probs.size(); ++k) {
      const float* p = probs[k].data() + (e - first[k]) * per_epoch;
      for (uint64_t i = 0; i < per_epoch; ++i) sum[i] += p[i] / model.segments_size();
    }
    for (uint64_t i = 0; i < per_epoch; ++i) ensemble[i] = static_cast<float>(sum[i]);
    v1::EnsembleEpoch* record = out.add_ensemble();
    record->set_epoch(static_cast<uint32_t>(e));
    record->set_test_accuracy(SecondStat(ScoreRows(model, ensemble, test.y)));
  }
  return out;
}

}  // namespace segps
