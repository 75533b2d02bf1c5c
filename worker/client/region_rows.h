// Embedding rows through the same-host region (cluster.shared_memory): a
// pull's rows are asked into a block of the client's region, so that the
// messages carry ids and the block's places (Rows.values_region_offset),
// not the values. (A push's row gradients are encoded into the region in
// the first place: EncodeRows with the client's PushStorage.)
//
// A caller holds the block until its exchange is over, and retires it
// (RegionArena::Retire) if a request was sent again or cut off.
#ifndef SEGPS_WORKER_CLIENT_REGION_ROWS_H_
#define SEGPS_WORKER_CLIENT_REGION_ROWS_H_

#include <memory>
#include <vector>

#include "segps/v1/config.pb.h"
#include "segps/v1/parameter_server.pb.h"
#include "worker/client/ps_client.h"
#include "worker/client/region_arena.h"

namespace segps {

// Asks the rows of `asked` (one server's part of a pull: ids) into a new
// block of `arena`: each Rows names its place, recorded per table in
// `places`. None (nothing changed) when the arena has no room.
std::shared_ptr<char> PlaceRowReplies(RegionArena& arena, const v1::SegmentConfig& config,
                                      std::vector<v1::Rows>* asked, std::vector<RowPlace>* places);

// A pull's rows asked into the client's region, per server: each table's
// place, and the blocks, held until the exchange is over.
struct PlacedRows {
  explicit PlacedRows(size_t servers) : places(servers) {}
  // Asks server i's rows `asked` into a block of `arena`, if it has room.
  void Reply(std::shared_ptr<RegionArena> from, const v1::SegmentConfig& config, size_t i,
             std::vector<v1::Rows>* asked);
  // The blocks are never handed out again (a request sent again or cut off).
  void Retire() const;

  std::vector<std::vector<RowPlace>> places;
  std::shared_ptr<RegionArena> arena;
  std::vector<std::shared_ptr<char>> blocks;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_REGION_ROWS_H_
