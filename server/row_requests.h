// The embedding rows of a Pull or Push (v1::Rows), checked before a shard
// sees them: every byte comes from a client, so a table index, an id out
// of range or held by another server, a repeated id, a size that does not
// match, or a value that is not finite is refused naming the call, table
// and row, and nothing changes.
#ifndef SEGPS_SERVER_ROW_REQUESTS_H_
#define SEGPS_SERVER_ROW_REQUESTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/shared_region.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/parameter_server.pb.h"
#include "server/parked_calls.h"

namespace segps {

// Rows of segment `segment` for server `server` of `num_servers`, from a
// request's `rows` field: with values (a push's gradients) or without (a
// pull's ids). Values may lie in the caller's shared `region` (null where
// it handed over none) instead: a push's are copied out of it before they
// are checked. `call` names the method in errors.
absl::StatusOr<std::vector<RowGradients>> ParseRows(const v1::SegmentConfig& config, int segment, uint32_t server,
                                                    uint32_t num_servers,
                                                    const google::protobuf::RepeatedPtrField<v1::Rows>& rows,
                                                    bool values, const SharedRegion* region, const char* call);

// Bytes of values that rows (checked by ParseRows) have in a shared region.
size_t RegionRowBytes(const v1::SegmentConfig& config, const google::protobuf::RepeatedPtrField<v1::Rows>& rows);

// Reads `asked` from `tables` into `out`: one Rows each, ids and values
// (or the place in the caller's region they were written to).
void ReadTableRows(const EmbeddingTables& tables, const std::vector<RowGradients>& asked,
              google::protobuf::RepeatedPtrField<v1::Rows>* out);

}  // namespace segps

#endif  // SEGPS_SERVER_ROW_REQUESTS_H_
