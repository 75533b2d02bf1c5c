// A run's per-epoch history on disk: each worker writes its own
// (segps-worker --history_dir), the evaluator gathers them into the run's
// report (segps-eval --history_dir) and adds the ensemble's test accuracy
// after each epoch from the segments' saved test-set probabilities.
#ifndef SEGPS_WORKER_TRAIN_RUN_HISTORY_H_
#define SEGPS_WORKER_TRAIN_RUN_HISTORY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/report.pb.h"
#include "worker/data/dataset.h"

namespace segps {

// Writes DIR/SEGMENT.RANK.json and, if `test_probabilities` holds one
// [test rows x classes] array per epoch, DIR/SEGMENT.RANK.test_probs.npy.
absl::Status WriteHistory(const std::string& dir, const v1::WorkerHistory& history,
                          const std::vector<std::vector<float>>& test_probabilities, uint32_t classes);

// Every worker history of the config's segments found in `dir` (a worker
// that wrote none is left out), and the ensemble's test accuracy on `test`
// for each epoch at which every segment's rank 0 saved its probabilities.
absl::StatusOr<v1::RunHistory> ReadHistory(const std::string& dir, const v1::JobConfig& config,
                                           const Dataset& test);

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_RUN_HISTORY_H_
