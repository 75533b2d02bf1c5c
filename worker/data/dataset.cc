#include "worker/data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "worker/data/categorical.h"
#include "worker/data/csv.h"
#include "worker/data/npy.h"
#include "worker/data/numpy_random.h"
#include "worker/data/synthetic_ctr.h"

namespace segps {

// The features of an .npy array [n, width] as a data set's rows: row i of the
// set is file row rows[i] (identity when `rows` is empty; always ascending),
// readable while it lies within the mapped window.
class FeatureFile {
 public:
  FeatureFile(std::string path, NpyHeader header, std::vector<uint64_t> rows)
      : path_(std::move(path)), header_(std::move(header)), rows_(std::move(rows)),
        ascending_(std::is_sorted(rows_.begin(), rows_.end())) {
    row_bytes_ = header_.shape[1] * header_.item_bytes;
  }
  const std::string& path() const { return path_; }

  // The same file with data-set row i at this one's row order[i] (data.shuffle).
  template <typename Index>
  std::shared_ptr<FeatureFile> Reordered(const std::vector<Index>& order) const {
    std::vector<uint64_t> rows(order.size());
    for (size_t i = 0; i < order.size(); ++i) rows[i] = FileRow(order[i]);
    return std::make_shared<FeatureFile>(path_, header_, std::move(rows));
  }

  // Whether data-set rows `rows` are exactly the window mapped now.
  bool Maps(Range rows) const {
    if (rows.count == 0) return region_.size() == 0;
    const auto [first, last] = Bounds(rows);
    return region_.size() > 0 && first_ == first && end_ == last + 1;
  }

  // Maps the file rows that data-set rows [rows.offset, rows.end()) live in.
  absl::Status Map(Range rows) {
    region_.Reset();
    first_ = end_ = 0;
    if (rows.count == 0) return absl::OkStatus();
    const auto [first, last] = Bounds(rows);
    absl::StatusOr<MappedRegion> region =
        MappedRegion::Map(path_, header_.data_offset + first * row_bytes_, (last + 1 - first) * row_bytes_);
    if (!region.ok()) return region.status();
    region_ = *std::move(region);
    first_ = first;
    end_ = last + 1;
    return absl::OkStatus();
  }

  uint64_t FileRow(size_t i) const { return rows_.empty() ? i : rows_[i]; }

  // The first and last file rows that data-set rows `rows` (not empty) live in.
  std::pair<uint64_t, uint64_t> Bounds(Range rows) const {
    if (ascending_) return {FileRow(rows.offset), FileRow(rows.end() - 1)};
    const auto [low, high] = std::minmax_element(rows_.begin() + rows.offset, rows_.begin() + rows.end());
    return {*low, *high};
  }

  // Row i's values times `scale`, into out[width]. REQUIRES: mapped.
  void Read(size_t i, float scale, float* out) const {
    const uint64_t row = FileRow(i);
    const char* p = region_.data() + (row - first_) * row_bytes_;
    const size_t width = header_.shape[1];
    switch (header_.kind == 'f' ? header_.item_bytes : -1) {
      case 4:
        std::memcpy(out, p, width * sizeof(float));
        if (scale != 1) {
          for (size_t j = 0; j < width; ++j) out[j] *= scale;
        }
        break;
      case 8:
        for (size_t j = 0; j < width; ++j) {
          double v;
          std::memcpy(&v, p + j * sizeof(double), sizeof(double));
          out[j] = static_cast<float>(v) * scale;
        }
        break;
      default:  // uint8
        for (size_t j = 0; j < width; ++j) out[j] = static_cast<float>(static_cast<uint8_t>(p[j])) * scale;
    }
  }

 private:
  const std::string path_;
  const NpyHeader header_;
  const std::vector<uint64_t> rows_;
  const bool ascending_;  // rows_ in file order: a range's bounds are its ends
  uint64_t row_bytes_ = 0;
  MappedRegion region_;
  uint64_t first_ = 0, end_ = 0;  // file rows mapped
};

absl::Status Dataset::MapRows(Range rows) const {
  // Mapped and checked already (the test set, scored after every epoch).
  if (file == nullptr || file->Maps(rows)) return absl::OkStatus();
  SEGPS_RETURN_IF_ERROR(file->Map(rows));
  std::vector<float> row(width);
  for (uint64_t i = rows.offset; i < rows.end(); ++i) {
    file->Read(i, scale, row.data());
    for (int j = 0; j < width; ++j) {
      if (!std::isfinite(row[j])) {
        (void)file->Map({0, 0});  // so that the bad window is never taken for a checked one
        return absl::InvalidArgumentError(absl::StrCat(file->path(), ": row ", file->FileRow(i), " column ", j,
                                                       ": feature is ", row[j], "; every feature must be finite"));
      }
    }
  }
  return absl::OkStatus();
}

void Dataset::Standardize(std::vector<float> with_mean, std::vector<float> with_std) {
  for (size_t i = 0; i < x.size(); ++i) {  // in memory: standardised as held; a file, as read
    const size_t j = i % static_cast<size_t>(width);
    x[i] = (x[i] - with_mean[j]) / with_std[j];
  }
  mean = std::move(with_mean);
  std = std::move(with_std);
}

void Dataset::CopyRow(size_t i, float* out) const {
  if (file == nullptr) {
    std::copy_n(&x[i * static_cast<size_t>(width)], width, out);
    return;
  }
  file->Read(i, scale, out);
  if (!mean.empty()) {
    for (int j = 0; j < width; ++j) out[j] = (out[j] - mean[j]) / std[j];
  }
}

namespace {

// The walk-through's recipe: x = rand(N, W).astype(float32), y = randint(C, size=N),
// then the test set from the next draws of the same stream.
TrainTest SyntheticSeed(const v1::JobConfig& config) {
  const auto& data = config.data();
  const int width = static_cast<int>(config.model().input_width());
  const int classes = static_cast<int>(config.model().num_classes());
  NumpyLegacyRandom rng(data.data_seed());
  TrainTest out;
  for (auto [set, n] : {std::pair{&out.train, data.train_samples()}, std::pair{&out.test, data.test_samples()}}) {
    set->width = width;
    set->classes = classes;
    set->x.resize(static_cast<size_t>(n) * width);
    for (float& v : set->x) v = static_cast<float>(rng.Rand());
    set->y.resize(n);
    for (int32_t& v : set->y) v = static_cast<int32_t>(rng.RandInt(classes));
  }
  return out;
}

constexpr double kTeacherMargin = 0.25;

// Gaussian inputs labelled by argmax of a fixed random tanh network, with a
// share of labels replaced at random. A student of similar size can learn it.
TrainTest SyntheticTeacher(const v1::JobConfig& config) {
  const auto& data = config.data();
  const int width = static_cast<int>(config.model().input_width());
  const int classes = static_cast<int>(config.model().num_classes());
  const int hidden = static_cast<int>(data.teacher_hidden());
  std::mt19937_64 rng(Mix64(data.data_seed()));
  auto uniform = [&rng] { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); };
  auto normal = [&] {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  std::vector<double> w1(static_cast<size_t>(width) * hidden), w2(static_cast<size_t>(hidden) * classes);
  for (double& w : w1) w = normal() / std::sqrt(width);
  for (double& w : w2) w = normal() / std::sqrt(hidden);
  TrainTest out;
  std::vector<double> h(hidden);
  for (auto [set, n] : {std::pair{&out.train, data.train_samples()}, std::pair{&out.test, data.test_samples()}}) {
    set->width = width;
    set->classes = classes;
    set->x.resize(static_cast<size_t>(n) * width);
    set->y.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      float* x = &set->x[static_cast<size_t>(i) * width];
      for (int j = 0; j < width; ++j) x[j] = static_cast<float>(normal());
      for (int k = 0; k < hidden; ++k) {
        double z = 0;
        for (int j = 0; j < width; ++j) z += x[j] * w1[static_cast<size_t>(j) * hidden + k];
        h[k] = std::tanh(z);
      }
      // Redraw samples that sit on a teacher boundary: the top two logits
      // must differ by a margin, so that the classes are learnable.
      double top = -1e300, second = -1e300;
      int best = 0;
      for (int c = 0; c < classes; ++c) {
        double z = 0;
        for (int k = 0; k < hidden; ++k) z += h[k] * w2[static_cast<size_t>(k) * classes + c];
        if (z > top) {
          second = top, top = z, best = c;
        } else if (z > second) {
          second = z;
        }
      }
      if (top - second < kTeacherMargin) {
        --i;
        continue;
      }
      const bool noisy = uniform() < data.label_noise();
      const int random_label = static_cast<int>(rng() % classes);
      set->y[i] = noisy ? random_label : best;
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadGzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (install the Debian package "
                                            "dataset-fashion-mnist or set data.path)"));
  }
  std::string bytes;
  char chunk[1 << 16];
  int n;
  while ((n = gzread(file, chunk, sizeof(chunk))) > 0) bytes.append(chunk, n);
  int err = 0;
  const char* message = gzerror(file, &err);
  const bool failed = n < 0 || (err != Z_OK && err != Z_STREAM_END);
  std::string error = failed ? message : "";
  gzclose(file);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": gzip read failed: ", error));
  return bytes;
}

uint32_t BigEndian32(const std::string& b, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(b[at])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(b[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(b[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(b[at + 3]));
}

absl::Status ReadIdx(const std::string& images_path, const std::string& labels_path, Dataset* out) {
  absl::StatusOr<std::string> images = ReadGzip(images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<std::string> labels = ReadGzip(labels_path);
  if (!labels.ok()) return labels.status();
  if (images->size() < 16 || BigEndian32(*images, 0) != 0x00000803) {
    return absl::DataLossError(absl::StrCat(images_path, ": not an IDX3 ubyte image file"));
  }
  if (labels->size() < 8 || BigEndian32(*labels, 0) != 0x00000801) {
    return absl::DataLossError(absl::StrCat(labels_path, ": not an IDX1 ubyte label file"));
  }
  const uint32_t n = BigEndian32(*images, 4), rows = BigEndian32(*images, 8), cols = BigEndian32(*images, 12);
  if (BigEndian32(*labels, 4) != n) {
    return absl::DataLossError(absl::StrCat(labels_path, ": ", BigEndian32(*labels, 4),
                                            " labels for ", n, " images"));
  }
  const size_t pixels = static_cast<size_t>(rows) * cols;
  if (images->size() != 16 + n * pixels || labels->size() != 8 + n) {
    return absl::DataLossError(absl::StrCat(images_path, ": truncated"));
  }
  out->width = static_cast<int>(pixels);
  out->classes = 10;
  out->x.resize(n * pixels);
  for (size_t i = 0; i < n * pixels; ++i) {
    out->x[i] = static_cast<uint8_t>((*images)[16 + i]) / 255.0f;
  }
  out->y.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    out->y[i] = static_cast<uint8_t>((*labels)[8 + i]);
    if (out->y[i] > 9) return absl::DataLossError(absl::StrCat(labels_path, ": label ", out->y[i], " at ", i));
  }
  return absl::OkStatus();
}

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Training rows and held-out test rows: exactly round(fraction * n) rows (at
// least one, and one fewer than n at most) chosen by a seeded shuffle, both
// lists ascending so that a slice of training rows is a window of the file.
void HoldOut(uint64_t n, float fraction, uint64_t seed, std::vector<uint64_t>* train, std::vector<uint64_t>* test) {
  const uint64_t k = std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(fraction * static_cast<double>(n))),
                                          1, n - 1);
  std::vector<uint64_t> order(n);
  for (uint64_t i = 0; i < n; ++i) order[i] = i;
  uint64_t state = Mix64(seed ^ 0x7465737473706c74ull);
  for (uint64_t i = 0; i < k; ++i) {  // a partial Fisher-Yates: order[0, k) is the sample
    state = Mix64(state);
    const uint64_t j = i + static_cast<uint64_t>((static_cast<unsigned __int128>(state) * (n - i)) >> 64);
    std::swap(order[i], order[j]);
  }
  std::vector<bool> held(n, false);
  for (uint64_t i = 0; i < k; ++i) held[order[i]] = true;
  train->clear();
  test->clear();
  for (uint64_t i = 0; i < n; ++i) (held[i] ? test : train)->push_back(i);
}

// An .npy file of inputs: [n > 0, width] of float32, float64 or uint8.
absl::StatusOr<NpyHeader> FeatureHeader(const std::string& path, int width) {
  absl::StatusOr<NpyHeader> h = ReadNpyHeader(path);
  if (!h.ok()) return h.status();
  const bool readable = (h->kind == 'f' && (h->item_bytes == 4 || h->item_bytes == 8)) ||
                        (h->kind == 'u' && h->item_bytes == 1);
  if (!readable) {
    return Bad(path, absl::StrCat("inputs have dtype '", h->descr, "'; they must be float32, float64 or uint8"));
  }
  if (h->shape.size() != 2) {
    return Bad(path, absl::StrCat("inputs have ", h->shape.size(), " dimensions; they must have shape [n, ", width,
                                  "] (samples, features)"));
  }
  if (h->shape[0] == 0) return Bad(path, "holds no samples (shape [0, ...])");
  if (h->shape[1] != static_cast<uint64_t>(width)) {
    return Bad(path, absl::StrCat("rows have ", h->shape[1], " features, but model.input_width is ", width));
  }
  if (h->shape[0] > std::numeric_limits<uint32_t>::max()) {
    return Bad(path, absl::StrCat(h->shape[0], " samples; at most 2^32 - 1 are supported"));
  }
  return h;
}

// Every label of an .npy file of [rows] integers, checked against [0, classes);
// or (`regression`) every target, of [rows] numbers finite as float32, as
// TargetBits.
absl::StatusOr<std::vector<int32_t>> ReadLabels(const std::string& path, uint64_t rows, int classes, bool regression,
                                                const std::string& x_path) {
  absl::StatusOr<NpyHeader> h = ReadNpyHeader(path);
  if (!h.ok()) return h.status();
  const bool floats = h->kind == 'f' && (h->item_bytes == 4 || h->item_bytes == 8);
  if (regression ? !floats : h->kind != 'i' && h->kind != 'u' && h->kind != 'b') {
    return Bad(path, absl::StrCat("labels have dtype '", h->descr, "'; they must be ",
                                  regression ? "float32 or float64 (model.loss MSE)" : "integers"));
  }
  if (h->shape.size() != 1) {
    return Bad(path, absl::StrCat("labels have ", h->shape.size(), " dimensions; they must have shape [n]"));
  }
  if (h->shape[0] != rows) {
    return Bad(path, absl::StrCat(h->shape[0], " labels for the ", rows, " samples of ", x_path,
                                  "; x and y must have the same length"));
  }
  absl::StatusOr<MappedRegion> region = MappedRegion::Map(path, h->data_offset, rows * h->item_bytes);
  if (!region.ok()) return region.status();
  std::vector<int32_t> labels(rows);
  // Signed labels are sign-extended from their width; unsigned ones read as they are.
  const bool is_signed = h->kind == 'i';
  const int shift = 64 - 8 * h->item_bytes;
  for (uint64_t i = 0; i < rows; ++i) {
    const char* at = region->data() + i * h->item_bytes;
    if (regression) {
      float f = 0;
      if (h->item_bytes == 4) {
        std::memcpy(&f, at, 4);
      } else {
        double d = 0;
        std::memcpy(&d, at, 8);
        f = static_cast<float>(d);
      }
      if (!std::isfinite(f)) return Bad(path, absl::StrCat("row ", i, ": target is not finite as a float32"));
      labels[i] = TargetBits(f);
      continue;
    }
    uint64_t raw = 0;
    std::memcpy(&raw, at, h->item_bytes);
    const int64_t value = static_cast<int64_t>(raw << shift) >> shift;
    if (is_signed ? value < 0 || value >= classes : raw >= static_cast<uint64_t>(classes)) {
      return Bad(path, absl::StrCat("row ", i, ": label ", is_signed ? absl::StrCat(value) : absl::StrCat(raw),
                                    " is outside [0, ", classes, ") (model.num_classes ", classes, ")"));
    }
    labels[i] = static_cast<int32_t>(raw);
  }
  return labels;
}

absl::StatusOr<TrainTest> LoadNpy(const v1::JobConfig& config) {
  const auto& data = config.data();
  const int width = static_cast<int>(config.model().input_width());
  const int classes = static_cast<int>(config.model().num_classes());
  const int fields = static_cast<int>(config.model().categorical_fields());
  struct Arrays {
    NpyHeader x;
    std::vector<int32_t> y;
    std::vector<uint64_t> ids;
  };
  auto read = [&](const std::string& x_path, const std::string& y_path,
                  const std::string& ids_path) -> absl::StatusOr<Arrays> {
    absl::StatusOr<NpyHeader> h = FeatureHeader(x_path, width);
    if (!h.ok()) return h.status();
    absl::StatusOr<std::vector<int32_t>> labels =
        ReadLabels(y_path, h->shape[0], classes, config.model().loss() == v1::MSE, x_path);
    if (!labels.ok()) return labels.status();
    Arrays arrays{*std::move(h), *std::move(labels), {}};
    if (fields > 0) {
      absl::StatusOr<std::vector<uint64_t>> ids = ReadIds(ids_path, arrays.x.shape[0], config.model(), x_path);
      if (!ids.ok()) return ids.status();
      arrays.ids = *std::move(ids);
    }
    return arrays;
  };
  // The set of file rows `rows` (all of them when empty).
  auto set = [&](const std::string& x_path, const Arrays& arrays, std::vector<uint64_t> rows) {
    Dataset out;
    out.width = width;
    out.classes = classes;
    out.scale = data.has_scale() ? data.scale() : (arrays.x.kind == 'u' ? 1.0f / 255.0f : 1.0f);
    out.fields = fields;
    if (rows.empty()) {
      out.y = arrays.y;
      out.ids = arrays.ids;
    } else {
      out.y.resize(rows.size());
      out.ids.resize(arrays.ids.empty() ? 0 : rows.size() * fields);
      for (size_t i = 0; i < rows.size(); ++i) {
        out.y[i] = arrays.y[rows[i]];
        if (!out.ids.empty()) std::copy_n(&arrays.ids[rows[i] * fields], fields, &out.ids[i * fields]);
      }
    }
    out.file = std::make_shared<FeatureFile>(x_path, arrays.x, std::move(rows));
    return out;
  };
  if (fields == 0 && !(data.train_ids().empty() && data.test_ids().empty())) {
    return absl::InvalidArgumentError(
        "data.train_ids / test_ids are given, but model.categorical_fields is 0: no table would look them up");
  }
  absl::StatusOr<Arrays> train = read(data.train_x(), data.train_y(), data.train_ids());
  if (!train.ok()) return train.status();
  TrainTest out;
  if (!data.test_x().empty()) {
    absl::StatusOr<Arrays> test = read(data.test_x(), data.test_y(), data.test_ids());
    if (!test.ok()) return test.status();
    out.train = set(data.train_x(), *train, {});
    out.test = set(data.test_x(), *test, {});
    return out;
  }
  if (train->y.size() < 2) return Bad(data.train_x(), "one sample cannot be split into training and test rows");
  std::vector<uint64_t> train_rows, test_rows;
  HoldOut(train->y.size(), data.test_fraction(), data.data_seed(), &train_rows, &test_rows);
  out.train = set(data.train_x(), *train, std::move(train_rows));
  out.test = set(data.train_x(), *train, std::move(test_rows));
  return out;
}

// The rows `rows` of `d`, in that order (a file-backed set maps the same
// file through a new row list).
template <typename Index>
Dataset Rows(const Dataset& d, const std::vector<Index>& rows) {
  Dataset out;  // every field of d's but its rows'
  out.width = d.width;
  out.classes = d.classes;
  out.regression = d.regression;
  out.mean = d.mean;
  out.std = d.std;
  out.scale = d.scale;
  out.columns = d.columns;
  out.fields = d.fields;
  auto take = [&](const auto& values, auto* into, size_t per_row) {
    if (values.empty()) return;
    into->resize(rows.size() * per_row);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy_n(&values[rows[i] * per_row], per_row, &(*into)[i * per_row]);
    }
  };
  take(d.y, &out.y, 1);
  take(d.x, &out.x, static_cast<size_t>(d.width));
  take(d.ids, &out.ids, static_cast<size_t>(d.fields));
  if (d.file != nullptr) out.file = d.file->Reordered(rows);
  return out;
}

absl::StatusOr<TrainTest> LoadCsv(const v1::JobConfig& config) {
  const auto& data = config.data();
  absl::StatusOr<Dataset> train = ReadCsv(data.train_csv(), config);
  if (!train.ok()) return train.status();
  TrainTest out;
  if (!data.test_csv().empty()) {
    absl::StatusOr<Dataset> test = ReadCsv(data.test_csv(), config);
    if (!test.ok()) return test.status();
    out.train = *std::move(train);
    out.test = *std::move(test);
    return out;
  }
  if (train->size() < 2) return Bad(data.train_csv(), "one sample cannot be split into training and test rows");
  std::vector<uint64_t> train_rows, test_rows;
  HoldOut(train->size(), data.test_fraction(), data.data_seed(), &train_rows, &test_rows);
  out.train = Rows(*train, train_rows);
  out.test = Rows(*train, test_rows);
  return out;
}

// Rows a window of a file-backed set holds: about 16 MiB of float32 features.
uint64_t WindowRows(const Dataset& data) {
  return std::max<uint64_t>(1, (16u << 20) / (sizeof(float) * std::max(1, data.width)));
}

// Mean and standard deviation of every feature over the training set, from
// sums shifted by the first row (exact enough without a second pass), then
// applied: in place to in-memory features, as they are read to file-backed ones.
absl::Status Standardize(TrainTest& data) {
  const Dataset& train = data.train;
  const int width = train.width;
  const uint64_t n = train.size();
  std::vector<double> shift(width), sum(width, 0.0), squares(width, 0.0);
  std::vector<float> row(width);
  const uint64_t window = WindowRows(train);
  for (uint64_t begin = 0; begin < n; begin += window) {
    const Range rows{begin, std::min(window, n - begin)};
    SEGPS_RETURN_IF_ERROR(train.MapRows(rows));
    for (uint64_t i = rows.offset; i < rows.end(); ++i) {
      train.CopyRow(i, row.data());
      for (int j = 0; j < width; ++j) {
        if (i == 0) shift[j] = row[j];
        const double d = row[j] - shift[j];
        sum[j] += d;
        squares[j] += d * d;
      }
    }
  }
  SEGPS_RETURN_IF_ERROR(train.MapRows({0, 0}));
  std::vector<float> mean(width), std(width);
  for (int j = 0; j < width; ++j) {
    const double m = sum[j] / n;
    const double var = std::max(0.0, squares[j] / n - m * m);
    mean[j] = static_cast<float>(shift[j] + m);
    std[j] = var > 0 ? static_cast<float>(std::sqrt(var)) : 1.0f;
  }
  for (Dataset* set : {&data.train, &data.test}) set->Standardize(mean, std);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainTest> LoadFashionMnist(const std::string& dir) {
  TrainTest out;
  SEGPS_RETURN_IF_ERROR(ReadIdx(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz", &out.train));
  SEGPS_RETURN_IF_ERROR(ReadIdx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz", &out.test));
  return out;
}

// data.shuffle, then data.validation_fraction: the training rows in an
// order drawn with `seed`, and a seeded share of them held out (both lists
// in the order they had), before anything splits them over segments.
void ShuffleAndHoldOut(const v1::DataConfig& data, TrainTest* sets) {
  if (data.shuffle()) {
    sets->train = Rows(sets->train, EpochOrder({0, sets->train.size()}, Mix64(data.data_seed() ^ 0x5368756666ull), 0, 0, 0));
  }
  if (data.validation_fraction() <= 0 || sets->train.size() < 2) return;
  std::vector<uint64_t> kept, held;
  HoldOut(sets->train.size(), data.validation_fraction(), Mix64(data.data_seed() ^ 0x76616c6964ull), &kept, &held);
  sets->validation = Rows(sets->train, held);
  sets->train = Rows(sets->train, kept);
}

absl::StatusOr<TrainTest> LoadData(const v1::JobConfig& config) {
  absl::StatusOr<TrainTest> data;
  switch (config.data().source()) {
    case v1::SYNTHETIC_SEED:
      data = SyntheticSeed(config);
      break;
    case v1::SYNTHETIC_TEACHER:
      data = SyntheticTeacher(config);
      break;
    case v1::FASHION_MNIST:
      data = LoadFashionMnist(config.data().path());
      break;
    case v1::NPY:
      data = LoadNpy(config);
      break;
    case v1::CSV:
      data = LoadCsv(config);
      break;
    case v1::SYNTHETIC_CTR:
      data = SyntheticCtr(config);
      break;
    default:
      return absl::InvalidArgumentError("data.source is not set");
  }
  if (!data.ok()) return data.status();
  if (config.data().normalize() == v1::STANDARDIZE) SEGPS_RETURN_IF_ERROR(Standardize(*data));
  ShuffleAndHoldOut(config.data(), &*data);
  for (Dataset* set : {&data->train, &data->test, &data->validation}) {
    set->regression = config.model().loss() == v1::MSE;
  }
  return data;
}

absl::Status CheckAllRows(const Dataset& data) {
  const uint64_t window = WindowRows(data);
  for (uint64_t begin = 0; begin < data.size(); begin += window) {
    SEGPS_RETURN_IF_ERROR(data.MapRows({begin, std::min<uint64_t>(window, data.size() - begin)}));
  }
  return data.MapRows({0, 0});
}

absl::StatusOr<Dataset> OpenNpyFeatures(const std::string& path, int width, float scale) {
  absl::StatusOr<NpyHeader> h = FeatureHeader(path, width);
  if (!h.ok()) return h.status();
  Dataset out;
  out.width = width;
  out.y.assign(h->shape[0], 0);
  out.scale = scale;
  out.file = std::make_shared<FeatureFile>(path, *std::move(h), std::vector<uint64_t>{});
  SEGPS_RETURN_IF_ERROR(out.MapRows({0, out.size()}));
  return out;
}

void GatherBatch(const Dataset& data, const std::vector<uint32_t>& order, size_t begin, size_t rows,
                 float* x, int32_t* y) {
  const size_t width = static_cast<size_t>(data.width);
  for (size_t r = 0; r < rows; ++r) {
    const uint32_t row = order[begin + r];
    data.CopyRow(row, x + r * width);
    y[r] = data.y[row];
  }
}

void GatherIds(const Dataset& data, const std::vector<uint32_t>& order, size_t begin, size_t rows, uint64_t* ids) {
  const size_t fields = static_cast<size_t>(data.fields);
  for (size_t r = 0; r < rows; ++r) {
    std::copy_n(data.ids.data() + order[begin + r] * fields, fields, ids + r * fields);
  }
}

absl::Status ExportNpy(const Dataset& data, const std::string& dir, const std::string& name) {
  std::vector<float> read;
  const std::vector<float>* x = &data.x;
  if (data.file != nullptr) {  // a tool's copy of a file-backed set, as the model sees it
    SEGPS_RETURN_IF_ERROR(data.MapRows({0, data.size()}));
    read.resize(data.size() * data.width);
    for (size_t i = 0; i < data.size(); ++i) data.CopyRow(i, &read[i * data.width]);
    x = &read;
  }
  SEGPS_RETURN_IF_ERROR(WriteNpy(dir + "/" + name + "_x.npy", "<f4", x->data(), x->size() * sizeof(float),
                                 {data.size(), static_cast<uint64_t>(data.width)}));
  SEGPS_RETURN_IF_ERROR(WriteNpy(dir + "/" + name + "_y.npy", "<i4", data.y.data(), data.y.size() * sizeof(int32_t),
                                 {data.size()}));
  if (data.fields == 0) return absl::OkStatus();
  // Categorical ids as int64, as data.train_ids takes them back.
  return WriteNpy(dir + "/" + name + "_ids.npy", "<i8", data.ids.data(), data.ids.size() * sizeof(uint64_t),
                  {data.size(), static_cast<uint64_t>(data.fields)});
}

absl::Status WriteNpyFloat32(const std::string& path, const float* data,
                             const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return WriteNpy(path, "<f4", data, n * sizeof(float), shape);
}

}  // namespace segps
