#include "worker/client/region_rows.h"

#include <cstring>

namespace segps {

std::shared_ptr<char> PlaceRowReplies(RegionArena& arena, const v1::SegmentConfig& config,
                                      std::vector<v1::Rows>* asked, std::vector<RowPlace>* places) {
  auto bytes_of = [&config](const v1::Rows& r) {
    return r.ids().size() / sizeof(uint64_t) * config.embeddings(static_cast<int>(r.table())).dim() * sizeof(float);
  };
  size_t bytes = 0;
  for (const v1::Rows& r : *asked) bytes += bytes_of(r);
  std::shared_ptr<char> block = bytes == 0 ? nullptr : arena.Allocate(bytes);
  if (block == nullptr) return nullptr;
  const uint64_t offset = *arena.OffsetOf(block.get());
  places->assign(config.embeddings_size(), RowPlace());
  size_t at = 0;
  for (v1::Rows& r : *asked) {
    r.set_values_region_offset(offset + at);
    (*places)[r.table()] = {block.get() + at, offset + at};
    at += bytes_of(r);
  }
  return block;
}

void PlacedRows::Reply(std::shared_ptr<RegionArena> from, const v1::SegmentConfig& config, size_t i,
                       std::vector<v1::Rows>* asked) {
  if (from == nullptr) return;
  arena = std::move(from);
  if (std::shared_ptr<char> block = PlaceRowReplies(*arena, config, asked, &places[i])) {
    blocks.push_back(std::move(block));
  }
}

void PlacedRows::Retire() const {
  for (const std::shared_ptr<char>& block : blocks) arena->Retire(block.get());
}

}  // namespace segps
