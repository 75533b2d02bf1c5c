// A checkpoint's embedding tables (ShardState::tables): per table, the ids
// of the rows this server stored, ascending, as U64 tensor
// "embeddings/SEGMENT/TABLE/ids" [n], and their values and optimizer slots
// as F32 tensor "embeddings/SEGMENT/TABLE/rows" [n, dim x (1 + slots)];
// metadata "segps.embeddings.TABLE" holds n and the row width. A table with
// no rows stored has the metadata only.
#ifndef SEGPS_SERVER_CHECKPOINT_TABLES_H_
#define SEGPS_SERVER_CHECKPOINT_TABLES_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/safetensors.h"
#include "segps/v1/config.pb.h"
#include "server/embedding_table.h"

namespace segps {

// Adds the tables of `state` (segment `segment` of `model`) to a file's
// tensors and metadata; `by_name` gets their bytes for the checksum.
void AddTableTensors(const v1::ModelConfig& model, int segment, const std::vector<TableState>& tables,
                     std::vector<TensorToWrite>* tensors, std::map<std::string, std::string>* metadata,
                     std::map<std::string, absl::string_view>* by_name);

// Whether a tensor name is a table's (not a part of the dense range).
bool IsTableTensor(const std::string& name);

// The tables of segment `segment` read back from `file` (checked: shapes,
// ids ascending, below vocab, held by server `server` of `num_servers`,
// rows `stride` floats), or DATA_LOSS naming the file and table.
absl::Status ReadTables(const SafetensorsFile& file, const std::map<std::string, std::string>& metadata,
                        const v1::JobConfig& config, int segment, uint32_t server, uint32_t num_servers,
                        std::vector<TableState>* tables);

}  // namespace segps

#endif  // SEGPS_SERVER_CHECKPOINT_TABLES_H_
