#include "worker/data/categorical.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/embedding.h"
#include "worker/data/npy.h"

namespace segps {

absl::StatusOr<std::vector<uint64_t>> ReadIds(const std::string& path, uint64_t rows, const v1::ModelConfig& model,
                                              const std::string& x_path) {
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat(path, ": ", what)); };
  absl::StatusOr<NpyHeader> h = ReadNpyHeader(path);
  if (!h.ok()) return h.status();
  const uint64_t fields = model.categorical_fields();
  if (h->kind != 'i' || (h->item_bytes != 8 && h->item_bytes != 4)) {
    return bad(absl::StrCat("ids have dtype '", h->descr, "'; they must be int64 or int32"));
  }
  if (h->shape.size() != 2 || h->shape[0] != rows || h->shape[1] != fields) {
    return bad(absl::StrCat("ids have shape [", absl::StrJoin(h->shape, ", "), "]; they must be [", rows, ", ", fields,
                            "] (the samples of ", x_path, ", model.categorical_fields)"));
  }
  absl::StatusOr<MappedRegion> region = MappedRegion::Map(path, h->data_offset, rows * fields * h->item_bytes);
  if (!region.ok()) return region.status();
  std::vector<uint64_t> vocab(fields);
  for (uint64_t f = 0; f < fields; ++f) vocab[f] = FieldVocab(model, static_cast<uint32_t>(f));
  std::vector<uint64_t> ids(rows * fields);
  for (uint64_t i = 0; i < rows * fields; ++i) {
    int64_t id = 0;
    if (h->item_bytes == 8) {
      std::memcpy(&id, region->data() + i * 8, 8);
    } else {
      int32_t narrow = 0;
      std::memcpy(&narrow, region->data() + i * 4, 4);
      id = narrow;
    }
    const uint64_t field = i % fields;
    if (id < 0 || (vocab[field] > 0 && static_cast<uint64_t>(id) >= vocab[field])) {
      return bad(absl::StrCat("row ", i / fields, ", field ", field, ": id ", id, " is outside [0, ", vocab[field],
                              ") (the vocab of the tables that look field ", field, " up)"));
    }
    ids[i] = static_cast<uint64_t>(id);
  }
  return ids;
}

}  // namespace segps
