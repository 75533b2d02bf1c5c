// CSV files of numeric columns, one of them the label (data.source: CSV).
#ifndef SEGPS_WORKER_DATA_CSV_H_
#define SEGPS_WORKER_DATA_CSV_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"
#include "worker/data/dataset.h"

namespace segps {

// Reads the CSV table at `path` into memory, as the config's data section
// describes it (delimiter, header, label_column). A bad field fails naming
// the file, line and column; nothing is returned then.
absl::StatusOr<Dataset> ReadCsv(const std::string& path, const v1::JobConfig& config);

// A table's features for inference (segps-predict): the columns `names`
// (the training's feature columns) found by the header's names, whatever
// else the table holds (its label, say); or, with no names, exactly
// `width` columns in order, after an optional header. Values times
// `scale`; labels all 0 (unused). A bad field fails naming the line and
// column; a missing feature column names it and the nearest.
absl::StatusOr<Dataset> ReadCsvFeatures(const std::string& path, char delimiter,
                                        const std::vector<std::string>& names, int width, float scale);

}  // namespace segps

#endif  // SEGPS_WORKER_DATA_CSV_H_
