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

// A table of a merged checkpoint (segps-checkpoint merge): every server's
// rows, `width` floats each: the table's values, or with optimizer slots the
// row as stored (values, then each slot).
struct MergedTable {
  std::vector<uint64_t> ids;
  std::vector<float> rows;
  uint64_t width = 0;
};

// segps-checkpoint merge: adds the tables of one server's file of segment
// `segment` (its safetensors and metadata, of a job with optimizer `kind`)
// to `tables`, by tensor base name; with `slots`, rows keep their optimizer
// slots. DATA_LOSS naming the table where the file's tensors disagree
// with its metadata.
absl::Status AddTableRows(const SafetensorsFile& file, const std::map<std::string, std::string>& metadata,
                          const std::string& segment, v1::OptimizerKind kind, bool slots,
                          std::map<std::string, MergedTable>* tables);
// Sorts each merged table by id, and adds its tensors ("BASE/ids" U64 [n],
// "BASE/rows" F32 [n, width]) and metadata ("segps.embeddings.BASE": "n
// width") to a merged file's. DATA_LOSS where two servers hold one id.
absl::Status AddMergedTables(std::map<std::string, MergedTable>* tables, std::vector<TensorToWrite>* tensors,
                             std::map<std::string, std::string>* metadata);
// segps-checkpoint split: server `server`'s rows of segment `segment`'s
// tables (of `config`) from a merged file; FAILED_PRECONDITION where the
// merge left out the optimizer slots the job's rows carry.
absl::Status SplitTables(const SafetensorsFile& merged, const v1::JobConfig& config, int segment, uint32_t server,
                         uint32_t num_servers, std::vector<TableState>* tables);

// The tables of segment `segment` read back from `file` (checked: shapes,
// ids ascending, below vocab, held by server `server` of `num_servers`,
// rows `stride` floats), or DATA_LOSS naming the file and table.
absl::Status ReadTables(const SafetensorsFile& file, const std::map<std::string, std::string>& metadata,
                        const v1::JobConfig& config, int segment, uint32_t server, uint32_t num_servers,
                        std::vector<TableState>* tables);

}  // namespace segps

#endif  // SEGPS_SERVER_CHECKPOINT_TABLES_H_
