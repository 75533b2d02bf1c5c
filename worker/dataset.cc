#include "worker/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "worker/numpy_random.h"

namespace segps {
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

absl::Status WriteNpy(const std::string& path, const char* descr, const void* data, size_t bytes,
                      const std::vector<uint64_t>& shape) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6) + version (2) + header length (2) + header, padded to 64 bytes with a newline.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t len = static_cast<uint16_t>(header.size());
  const unsigned char len_le[2] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>(len >> 8)};
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(len_le, 1, 2, f) == 2 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainTest> LoadFashionMnist(const std::string& dir) {
  TrainTest out;
  SEGPS_RETURN_IF_ERROR(ReadIdx(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz", &out.train));
  SEGPS_RETURN_IF_ERROR(ReadIdx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz", &out.test));
  return out;
}

absl::StatusOr<TrainTest> LoadData(const v1::JobConfig& config) {
  switch (config.data().source()) {
    case v1::SYNTHETIC_SEED:
      return SyntheticSeed(config);
    case v1::SYNTHETIC_TEACHER:
      return SyntheticTeacher(config);
    case v1::FASHION_MNIST:
      return LoadFashionMnist(config.data().path());
    default:
      return absl::InvalidArgumentError("data.source is not set");
  }
}

Range WorkerSlice(const v1::JobConfig& config, size_t train_size, int segment, uint32_t rank) {
  Range seg{0, train_size};
  if (config.data().split() == v1::BY_SEGMENT) {
    seg = BalancedRange(train_size, config.model().segments_size(), segment);
  }
  Range mine = BalancedRange(seg.count, WorkersOf(config, segment), rank);
  mine.offset += seg.offset;
  return mine;
}

std::vector<uint32_t> EpochOrder(Range slice, uint64_t seed, int segment, uint32_t rank,
                                 uint32_t epoch) {
  std::vector<uint32_t> order(slice.count);
  for (uint64_t i = 0; i < slice.count; ++i) order[i] = static_cast<uint32_t>(slice.offset + i);
  uint64_t state = Mix64(seed ^ Mix64(static_cast<uint64_t>(segment) << 32 | rank) ^ Mix64(epoch + 1));
  for (uint64_t i = slice.count; i > 1; --i) {
    state = Mix64(state);
    // Multiply-shift maps 64 random bits onto [0, i) without modulo bias worth noting.
    const uint64_t j = static_cast<uint64_t>((static_cast<unsigned __int128>(state) * i) >> 64);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

void GatherBatch(const Dataset& data, const std::vector<uint32_t>& order, size_t begin, size_t rows,
                 float* x, int32_t* y) {
  const size_t width = static_cast<size_t>(data.width);
  for (size_t r = 0; r < rows; ++r) {
    const uint32_t row = order[begin + r];
    std::copy_n(&data.x[row * width], width, x + r * width);
    y[r] = data.y[row];
  }
}

absl::Status ExportNpy(const Dataset& data, const std::string& dir, const std::string& name) {
  SEGPS_RETURN_IF_ERROR(WriteNpy(dir + "/" + name + "_x.npy", "<f4", data.x.data(),
                                 data.x.size() * sizeof(float), {data.size(), static_cast<uint64_t>(data.width)}));
  return WriteNpy(dir + "/" + name + "_y.npy", "<i4", data.y.data(), data.y.size() * sizeof(int32_t),
                  {data.size()});
}

absl::Status WriteNpyFloat32(const std::string& path, const float* data,
                             const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return WriteNpy(path, "<f4", data, n * sizeof(float), shape);
}

}  // namespace segps
