// Categorical ids of a data set (model.categorical_fields), which embedding
// tables look up: read from a .npy array, every id checked against the
// vocab of the tables that look its column up, so that a bad id is refused
// naming the file, row and field before anything reaches the servers.
#ifndef SEGPS_WORKER_DATA_CATEGORICAL_H_
#define SEGPS_WORKER_DATA_CATEGORICAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"

namespace segps {

// The ids of `path`, an int64 or int32 array [rows, model.categorical_fields]
// (the samples of `x_path`), row-major; each in [0, FieldVocab) of its
// column where a table looks the column up, else >= 0.
absl::StatusOr<std::vector<uint64_t>> ReadIds(const std::string& path, uint64_t rows, const v1::ModelConfig& model,
                                              const std::string& x_path);

}  // namespace segps

#endif  // SEGPS_WORKER_DATA_CATEGORICAL_H_
