// Training and test data for workers and the evaluator: the sources a config
// can name, how the training set is split over segments and workers, and the
// order a worker visits its slice in each epoch.
#ifndef SEGPS_WORKER_DATASET_H_
#define SEGPS_WORKER_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/shard_map.h"
#include "segps/v1/config.pb.h"

namespace segps {

// Row-major float inputs [size x width] and integer labels in [0, classes).
struct Dataset {
  int width = 0;
  int classes = 0;
  std::vector<float> x;
  std::vector<int32_t> y;
  size_t size() const { return y.size(); }
};

struct TrainTest {
  Dataset train;
  Dataset test;
};

// Builds the config's data (data.source), deterministically.
absl::StatusOr<TrainTest> LoadData(const v1::JobConfig& config);

// Reads Fashion-MNIST IDX files (gzip) from `dir`: pixels scaled to [0, 1].
absl::StatusOr<TrainTest> LoadFashionMnist(const std::string& dir);

// The rows of the training set that worker `rank` of `segment` trains on:
// the segment's share (by data.split), cut evenly over its workers.
Range WorkerSlice(const v1::JobConfig& config, size_t train_size, int segment, uint32_t rank);

// The slice's row indices in the order epoch `epoch` visits them: a
// Fisher-Yates shuffle keyed by (seed, segment, rank, epoch).
std::vector<uint32_t> EpochOrder(Range slice, uint64_t seed, int segment, uint32_t rank,
                                 uint32_t epoch);

// Steps per epoch for a slice: the last batch may be partial (as in Keras).
inline uint64_t StepsPerEpoch(uint64_t slice_size, uint32_t batch) {
  return (slice_size + batch - 1) / batch;
}

// Copies rows order[begin, begin + rows) of `data` into x [rows x width] and y [rows].
void GatherBatch(const Dataset& data, const std::vector<uint32_t>& order, size_t begin, size_t rows,
                 float* x, int32_t* y);

// Writes a dataset as NAME_x.npy (float32 [n, width]) and NAME_y.npy (int32 [n]) in `dir`.
absl::Status ExportNpy(const Dataset& data, const std::string& dir, const std::string& name);

// Writes a float32 vector as a 1-D .npy file.
absl::Status WriteNpyFloat32(const std::string& path, const float* data,
                             const std::vector<uint64_t>& shape);

}  // namespace segps

#endif  // SEGPS_WORKER_DATASET_H_
