// CSV files of numeric columns, one of them the label (data.source: CSV).
#ifndef SEGPS_WORKER_DATA_CSV_H_
#define SEGPS_WORKER_DATA_CSV_H_

#include <string>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"
#include "worker/data/dataset.h"

namespace segps {

// Reads the CSV table at `path` into memory, as the config's data section
// describes it (delimiter, header, label_column). A bad field fails naming
// the file, line and column; nothing is returned then.
absl::StatusOr<Dataset> ReadCsv(const std::string& path, const v1::JobConfig& config);

}  // namespace segps

#endif  // SEGPS_WORKER_DATA_CSV_H_
