// Training and test data for workers and the evaluator: the sources a config
// can name (built-in sets, the user's .npy arrays and CSV tables), feature
// standardisation, how the training set is split over segments and workers,
// and the order a worker visits its slice in each epoch.
//
// A data set's features live in memory, or (NPY) in a file that is
// memory-mapped a window at a time: MapRows maps the rows a process is about
// to read, and checks them, so that a worker touches only its own slice.
#ifndef SEGPS_WORKER_DATA_DATASET_H_
#define SEGPS_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/casts.h"
#include "absl/status/statusor.h"
#include "common/shard_map.h"
#include "segps/v1/config.pb.h"

namespace segps {

class FeatureFile;

// Row-major float inputs [size x width] and integer labels in [0, classes),
// or (model.loss MSE, `regression`) one real-valued target a row.
//
// Thread safety: reading rows (CopyRow, GatherBatch) may run concurrently;
// MapRows must not overlap any other use of the same data set.
struct Dataset {
  int width = 0;
  int classes = 0;
  // loss: MSE: y holds each row's target as its float's bits (TargetOf), so
  // that targets move through shuffles and splits as labels do.
  bool regression = false;
  // In-memory features [size x width], standardised when `mean` is set;
  // empty when `file` holds them.
  std::vector<float> x;
  std::vector<int32_t> y;
  // File-backed features (NPY): readable only within the rows MapRows mapped.
  std::shared_ptr<FeatureFile> file;
  // Standardisation (data.normalize): feature j is (x * scale - mean[j]) /
  // std[j]. Empty: none.
  std::vector<float> mean, std;
  // The multiplier raw file values get as they are read (data.scale).
  float scale = 1;
  // A CSV table with a header: its feature columns' names, in order (what
  // an export records, so that segps-predict finds them by name).
  std::vector<std::string> columns;
  // Categorical ids [size x fields] (model.categorical_fields), in memory.
  int fields = 0;
  std::vector<uint64_t> ids;

  size_t size() const { return y.size(); }
  // Makes rows [rows.offset, rows.end()) readable, after which rows outside
  // them must not be read: a file-backed set maps the file's bytes of those
  // rows (only them) and checks that every value is finite, naming the file,
  // row and column of one that is not. In-memory sets: nothing to do.
  absl::Status MapRows(Range rows) const;
  // Standardises the features with these statistics (data.normalize).
  void Standardize(std::vector<float> mean, std::vector<float> std);
  // Row i's features, as the model sees them, into out[width].
  void CopyRow(size_t i, float* out) const;
};

// A regression target as Dataset::y keeps it, and back.
inline int32_t TargetBits(float target) { return absl::bit_cast<int32_t>(target); }
inline float TargetOf(int32_t bits) { return absl::bit_cast<float>(bits); }

struct TrainTest {
  Dataset train;
  Dataset test;
  // data.validation_fraction of the training rows, held out of `train`;
  // empty without one.
  Dataset validation;
};

// Builds the config's data (data.source), deterministically, checking every
// label and (in memory) every feature; with data.normalize STANDARDIZE, the
// statistics come from one pass over the whole training set. File-backed
// sets come back with no rows mapped.
absl::StatusOr<TrainTest> LoadData(const v1::JobConfig& config);

// Maps and checks every row of `data`, a window at a time: a whole-file check
// that needs no more memory than one window.
absl::Status CheckAllRows(const Dataset& data);

// The features of an .npy array [n, width] for inference (segps-predict):
// mapped whole and checked, read times `scale`, labels all 0 (unused).
absl::StatusOr<Dataset> OpenNpyFeatures(const std::string& path, int width, float scale);

// Reads Fashion-MNIST IDX files (gzip) from `dir`: pixels scaled to [0, 1].
absl::StatusOr<TrainTest> LoadFashionMnist(const std::string& dir);

// The rows of the training set that `segment` trains on (by data.split).
Range SegmentRows(const v1::JobConfig& config, size_t train_size, int segment);

// A warning for a segment whose training rows (data.split BY_SEGMENT: a
// contiguous part of the file) lack classes the training set has, as a
// file sorted by class gives; it names the segment, its rows and the
// classes, and says what to do. None otherwise.
std::optional<std::string> MissingClassesWarning(const v1::JobConfig& config, const Dataset& train, int segment);

// The rows of the training set that worker `rank` of `segment` trains on:
// the segment's rows, cut evenly over its workers. (Balanced training
// instead cuts every clock's samples of the segment's rows by the shares.)
Range WorkerSlice(const v1::JobConfig& config, size_t train_size, int segment, uint32_t rank);

// EpochOrder's `rank` for one order of a whole segment's rows, which every
// worker of a balanced segment shares.
constexpr uint32_t kWholeSegment = 0xFFFFFFFFu;

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
// Their ids, [rows x fields], into `ids`.
void GatherIds(const Dataset& data, const std::vector<uint32_t>& order, size_t begin, size_t rows, uint64_t* ids);

// Writes a dataset as NAME_x.npy (float32 [n, width]), NAME_y.npy (int32 [n])
// and, with categorical ids, NAME_ids.npy (int64 [n, fields]) in `dir`.
absl::Status ExportNpy(const Dataset& data, const std::string& dir, const std::string& name);

// Writes a float32 vector as a 1-D .npy file.
absl::Status WriteNpyFloat32(const std::string& path, const float* data,
                             const std::vector<uint64_t>& shape);

}  // namespace segps

#endif  // SEGPS_WORKER_DATA_DATASET_H_
