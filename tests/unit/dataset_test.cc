#include "worker/data/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "tests/support/subprocess.h"
#include "worker/data/npy.h"
#include "worker/data/numpy_random.h"

namespace segps {
namespace {

std::map<std::string, std::vector<std::string>> ReadFixture() {
  std::ifstream in(std::string(SEGPS_SOURCE_DIR) + "/tests/fixtures/numpy_seed42.txt");
  std::map<std::string, std::vector<std::string>> fields;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (parts.empty()) continue;
    fields[parts[0]] = std::vector<std::string>(parts.begin() + 1, parts.end());
  }
  return fields;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

v1::JobConfig SeedConfig() {
  return *LoadConfig(std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/seed.pbtxt");
}

// The block-at-a-time generator continues std::mt19937's sequence across
// refills (the bit-identical data below checks the first 1.2 million draws
// end to end; this names the first draw that differs).
TEST(NumpyLegacyRandom, DrawsStdMt19937Sequence) {
  for (uint32_t seed : {0u, 42u, 4294967295u}) {
    NumpyLegacyRandom ours(seed);
    std::mt19937 reference(seed);
    for (int i = 0; i < 5 * 624 + 7; ++i) ASSERT_EQ(ours.Next(), reference()) << "seed " << seed << " draw " << i;
  }
}

TEST(SyntheticSeed, BitIdenticalToNumpy) {
  auto fixture = ReadFixture();
  ASSERT_FALSE(fixture.empty()) << "fixture missing";
  TrainTest data = *LoadData(SeedConfig());
  ASSERT_EQ(data.train.size(), 10000u);
  ASSERT_EQ(data.test.size(), 2000u);
  auto check_row = [&](const char* key, const Dataset& d, size_t row) {
    const auto& hex = fixture[key];
    ASSERT_EQ(hex.size(), 50u) << key;
    for (size_t j = 0; j < 50; ++j) {
      uint32_t expected = 0;
      ASSERT_TRUE(absl::SimpleHexAtoi(hex[j], &expected));
      EXPECT_EQ(Bits(d.x[row * 50 + j]), expected) << key << " column " << j;
    }
  };
  check_row("x_first_row", data.train, 0);
  check_row("x_last_row", data.train, 9999);
  check_row("xt_first_row", data.test, 0);
  check_row("xt_last_row", data.test, 1999);
  auto check_labels = [&](const char* key, const Dataset& d, size_t first) {
    const auto& labels = fixture[key];
    ASSERT_EQ(labels.size(), 100u) << key;
    for (size_t i = 0; i < 100; ++i) EXPECT_EQ(std::to_string(d.y[first + i]), labels[i]) << key << " " << i;
  };
  check_labels("y_first", data.train, 0);
  check_labels("y_last", data.train, 9900);
  check_labels("yt_first", data.test, 0);
  check_labels("yt_last", data.test, 1900);
  double x_sum = 0;
  int64_t y_sum = 0;
  for (float v : data.train.x) x_sum += v;
  for (int32_t v : data.train.y) y_sum += v;
  EXPECT_NEAR(x_sum, std::stod(fixture["x_sum"][0]), 1e-3);
  EXPECT_EQ(y_sum, std::stoll(fixture["y_sum"][0]));
}

TEST(Split, BySegmentAndWorkerCoversEverySampleOnce) {
  v1::JobConfig config = SeedConfig();
  for (uint32_t workers : {1u, 2u, 3u, 7u}) {
    for (auto* seg : {config.mutable_model()->mutable_segments(0), config.mutable_model()->mutable_segments(1)}) {
      seg->set_workers(workers);
    }
    for (size_t n : {10000ul, 10001ul, 13ul}) {
      std::vector<int> seen(n, 0);
      for (int k = 0; k < 2; ++k) {
        for (uint32_t r = 0; r < workers; ++r) {
          Range slice = WorkerSlice(config, n, k, r);
          for (uint64_t i = slice.offset; i < slice.end(); ++i) seen[i]++;
        }
      }
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "sample " << i << " workers " << workers;
    }
  }
  // The walk-through: segment 1 gets the first 5000 samples, segment 2 the rest.
  config = SeedConfig();
  EXPECT_EQ(WorkerSlice(config, 10000, 0, 0).offset, 0u);
  EXPECT_EQ(WorkerSlice(config, 10000, 0, 0).count, 5000u);
  EXPECT_EQ(WorkerSlice(config, 10000, 1, 0).offset, 5000u);
}

// A file sorted by class, cut by segment: each half misses the other's
// classes, and says so; with split SAME, or classes spread, nothing to say.
TEST(Split, ASegmentWhoseRowsLackClassesIsWarnedAbout) {
  v1::JobConfig config = SeedConfig();
  Dataset sorted;
  sorted.classes = 10;
  for (int32_t c = 0; c < 10; ++c) sorted.y.insert(sorted.y.end(), 100, c);
  const std::optional<std::string> first = MissingClassesWarning(config, sorted, 0);
  ASSERT_TRUE(first.has_value());
  EXPECT_NE(first->find("segment1: its training rows [0, 500) of 1000 have no sample of classes 5, 6, 7, 8, 9"),
            std::string::npos)
      << *first;
  EXPECT_NE(first->find("data.split: SAME"), std::string::npos) << *first;
  EXPECT_NE(MissingClassesWarning(config, sorted, 1)->find("classes 0, 1, 2, 3, 4,"), std::string::npos);
  Dataset spread = sorted;
  for (size_t i = 0; i < spread.y.size(); ++i) spread.y[i] = static_cast<int32_t>(i % 10);
  EXPECT_FALSE(MissingClassesWarning(config, spread, 0).has_value());
  config.mutable_data()->set_split(v1::SAME);
  EXPECT_FALSE(MissingClassesWarning(config, sorted, 0).has_value());
}

TEST(Split, SameGivesEverySegmentTheWholeSet) {
  v1::JobConfig config = SeedConfig();
  config.mutable_data()->set_split(v1::SAME);
  config.mutable_model()->mutable_segments(1)->set_workers(2);
  EXPECT_EQ(WorkerSlice(config, 100, 0, 0).count, 100u);
  EXPECT_EQ(WorkerSlice(config, 100, 1, 0).count + WorkerSlice(config, 100, 1, 1).count, 100u);
}

TEST(EpochOrder, IsAPermutationThatChangesPerEpochAndIsDeterministic) {
  Range slice{100, 500};
  std::vector<uint32_t> a = EpochOrder(slice, 1, 0, 0, 0);
  std::vector<uint32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < 500; ++i) ASSERT_EQ(sorted[i], 100 + i);
  EXPECT_EQ(a, EpochOrder(slice, 1, 0, 0, 0));
  EXPECT_NE(a, EpochOrder(slice, 1, 0, 0, 1));
  EXPECT_NE(a, EpochOrder(slice, 1, 0, 1, 0));
}

TEST(Teacher, EveryClassOccursAndLabelsAreDeterministic) {
  v1::JobConfig config = *LoadConfig(std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/teacher.pbtxt");
  TrainTest data = *LoadData(config);
  EXPECT_EQ(data.train.size(), config.data().train_samples());
  std::vector<int> counts(10, 0);
  for (int32_t y : data.train.y) counts[y]++;
  for (int c = 0; c < 10; ++c) EXPECT_GT(counts[c], 0) << "class " << c << " never occurs";
  TrainTest again = *LoadData(config);
  EXPECT_EQ(data.train.y, again.train.y);
}

TEST(FashionMnist, LoadsTheDebianPackage) {
  absl::StatusOr<TrainTest> data = LoadFashionMnist("/usr/share/datasets/fashion-mnist");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train.size(), 60000u);
  EXPECT_EQ(data->test.size(), 10000u);
  EXPECT_EQ(data->train.width, 784);
  float lo = 1, hi = 0;
  for (float v : data->train.x) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  EXPECT_EQ(data->train.y[0], 9);  // the first training image is an ankle boot
}

TEST(FashionMnist, MissingDirectorySaysWhatToInstall) {
  absl::StatusOr<TrainTest> data = LoadFashionMnist("/nonexistent");
  ASSERT_FALSE(data.ok());
  EXPECT_NE(std::string(data.status().message()).find("dataset-fashion-mnist"), std::string::npos);
}

TEST(ExportNpy, WritesAValidHeaderAndThePayload) {
  Dataset d;
  d.width = 3;
  d.classes = 2;
  d.x = {1, 2, 3, 4, 5, 6};
  d.y = {0, 1};
  char dir[] = "/tmp/segps_npy_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_TRUE(ExportNpy(d, dir, "train").ok());
  std::ifstream in(std::string(dir) + "/train_x.npy", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(1, 5), "NUMPY");
  const size_t header = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  EXPECT_EQ((10 + header) % 64, 0u);
  EXPECT_NE(bytes.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_EQ(bytes.size(), 10 + header + 6 * sizeof(float));
  float last;
  std::memcpy(&last, bytes.data() + bytes.size() - 4, 4);
  EXPECT_EQ(last, 6.0f);
}

// --- The user's own data: NPY and CSV ---

std::string TempDir() {
  char dir[] = "/tmp/segps_data_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

template <typename T>
void WriteArray(const std::string& path, const char* descr, const std::vector<T>& values,
                const std::vector<uint64_t>& shape) {
  ASSERT_TRUE(WriteNpy(path, descr, values.data(), values.size() * sizeof(T), shape).ok()) << path;
}

// A job of 3 features and 4 classes on `data` (a data { ... } body).
absl::StatusOr<v1::JobConfig> FileJob(const std::string& data) {
  return ParseConfig(absl::StrCat(R"(
    cluster { num_servers: 1 }
    model { input_width: 3 num_classes: 4
            segments { name: "s" layers { units: 4 activation: SOFTMAX } } }
    optimizer { kind: SGD }
    data { )", data, " }"), "job.pbtxt");
}

std::vector<float> Row(const Dataset& d, size_t i) {
  std::vector<float> row(d.width);
  d.CopyRow(i, row.data());
  return row;
}

// Loads `data` and maps every row; the first error either gives.
absl::Status LoadAndCheck(const std::string& data) {
  absl::StatusOr<v1::JobConfig> config = FileJob(data);
  if (!config.ok()) return config.status();
  absl::StatusOr<TrainTest> loaded = LoadData(*config);
  if (!loaded.ok()) return loaded.status();
  absl::Status status = CheckAllRows(loaded->train);
  return status.ok() ? CheckAllRows(loaded->test) : status;
}

TEST(NpyData, ReadsFloat32Float64AndUint8InputsAndAnyIntegerLabels) {
  const std::string dir = TempDir();
  WriteArray<float>(dir + "/x32.npy", "<f4", {0.5f, 1, 2, 3, 4, 5}, {2, 3});
  WriteArray<double>(dir + "/x64.npy", "<f8", {0.5, 1, 2, 3, 4, 5}, {2, 3});
  WriteArray<uint8_t>(dir + "/x8.npy", "|u1", {0, 51, 255, 1, 2, 3}, {2, 3});
  WriteArray<int64_t>(dir + "/y64.npy", "<i8", {3, 0}, {2});
  WriteArray<uint8_t>(dir + "/y8.npy", "|u1", {1, 2}, {2});
  for (const char* x : {"x32", "x64"}) {
    absl::StatusOr<v1::JobConfig> config = FileJob(absl::StrCat("source: NPY train_x: \"", dir, "/", x,
                                                                ".npy\" train_y: \"", dir, "/y64.npy\" test_x: \"",
                                                                dir, "/", x, ".npy\" test_y: \"", dir, "/y8.npy\""));
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<TrainTest> data = LoadData(*config);
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_TRUE(data->train.MapRows({0, 2}).ok());
    EXPECT_EQ(Row(data->train, 1), (std::vector<float>{3, 4, 5})) << x;
    EXPECT_EQ(data->train.y, (std::vector<int32_t>{3, 0}));
    EXPECT_EQ(data->test.y, (std::vector<int32_t>{1, 2}));
  }
  absl::StatusOr<TrainTest> pixels = LoadData(*FileJob(absl::StrCat(
      "source: NPY train_x: \"", dir, "/x8.npy\" train_y: \"", dir, "/y64.npy\" test_x: \"", dir,
      "/x8.npy\" test_y: \"", dir, "/y64.npy\"")));
  ASSERT_TRUE(pixels.ok()) << pixels.status();
  ASSERT_TRUE(pixels->train.MapRows({0, 2}).ok());
  EXPECT_EQ(Row(pixels->train, 0), (std::vector<float>{0, 51 * (1.0f / 255), 255 * (1.0f / 255)}));
}

TEST(NpyData, MapsOnlyTheRowsAskedFor) {
  const std::string dir = TempDir();
  std::vector<float> x(3 * 5000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  WriteArray<float>(dir + "/x.npy", "<f4", x, {5000, 3});
  WriteArray<int32_t>(dir + "/y.npy", "<i4", std::vector<int32_t>(5000, 1), {5000});
  absl::StatusOr<TrainTest> data = LoadData(*FileJob(absl::StrCat(
      "source: NPY train_x: \"", dir, "/x.npy\" train_y: \"", dir, "/y.npy\" test_fraction: 0.1")));
  ASSERT_TRUE(data.ok()) << data.status();
  // The file's bytes of those rows, and no more than a page either side.
  auto mapped_bytes = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    uint64_t total = 0;
    while (std::getline(maps, line)) {
      if (line.find("/x.npy") == std::string::npos) continue;
      uint64_t lo = 0, hi = 0;
      std::vector<std::string> range = absl::StrSplit(line.substr(0, line.find(' ')), '-');
      absl::SimpleHexAtoi(range[0], &lo);
      absl::SimpleHexAtoi(range[1], &hi);
      total += hi - lo;
    }
    return total;
  };
  ASSERT_TRUE(data->train.MapRows({1000, 2000}).ok());
  // Row r of the file holds 3r, 3r+1, 3r+2: the first feature names the file row.
  const uint64_t first = static_cast<uint64_t>(Row(data->train, 1000)[0]) / 3;
  const uint64_t last = static_cast<uint64_t>(Row(data->train, 2999)[0]) / 3;
  EXPECT_GE(last - first + 1, 2000u);
  EXPECT_LT(last - first + 1, 2400u);  // the held-out rows in between, about a tenth
  EXPECT_GE(mapped_bytes(), (last - first + 1) * 12);
  EXPECT_LE(mapped_bytes(), (last - first + 1) * 12 + 2 * 4096);
  ASSERT_TRUE(data->train.MapRows({0, 0}).ok());
  EXPECT_EQ(mapped_bytes(), 0u);
}

// Mapping the window already mapped is free, but a window that failed its
// check is never taken for a checked one.
TEST(NpyData, AWindowThatFailedItsCheckFailsAgain) {
  const std::string dir = TempDir();
  WriteArray<float>(dir + "/x.npy", "<f4", {1, 2, 3, 4, std::nanf(""), 6}, {2, 3});
  WriteArray<int32_t>(dir + "/y.npy", "<i4", {0, 1}, {2});
  absl::StatusOr<TrainTest> data = LoadData(*FileJob(absl::StrCat(
      "source: NPY train_x: \"", dir, "/x.npy\" train_y: \"", dir, "/y.npy\" test_x: \"", dir,
      "/x.npy\" test_y: \"", dir, "/y.npy\"")));
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(data->train.MapRows({0, 1}).ok());
  ASSERT_TRUE(data->train.MapRows({0, 1}).ok());  // the same window again
  EXPECT_EQ(Row(data->train, 0), (std::vector<float>{1, 2, 3}));
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_NE(std::string(data->train.MapRows({0, 2}).message()).find("row 1 column 1: feature is nan"),
              std::string::npos)
        << "attempt " << attempt;
  }
}

TEST(NpyData, TestFractionHoldsOutASeededSplitInFileOrder) {
  const std::string dir = TempDir();
  std::vector<float> x(3 * 1000);
  std::vector<int32_t> y(1000);
  for (size_t i = 0; i < 1000; ++i) x[3 * i] = static_cast<float>(i), y[i] = static_cast<int32_t>(i % 4);
  WriteArray<float>(dir + "/x.npy", "<f4", x, {1000, 3});
  WriteArray<int32_t>(dir + "/y.npy", "<i4", y, {1000});
  auto load = [&](int seed) {
    TrainTest data = *LoadData(*FileJob(absl::StrCat("source: NPY train_x: \"", dir, "/x.npy\" train_y: \"", dir,
                                                     "/y.npy\" test_fraction: 0.25 data_seed: ", seed)));
    EXPECT_TRUE(CheckAllRows(data.train).ok());
    EXPECT_TRUE(data.train.MapRows({0, data.train.size()}).ok());
    EXPECT_TRUE(data.test.MapRows({0, data.test.size()}).ok());
    std::vector<int> train, test;
    for (size_t i = 0; i < data.train.size(); ++i) {
      train.push_back(static_cast<int>(Row(data.train, i)[0]));
      EXPECT_EQ(data.train.y[i], train.back() % 4);
    }
    for (size_t i = 0; i < data.test.size(); ++i) test.push_back(static_cast<int>(Row(data.test, i)[0]));
    return std::pair{train, test};
  };
  auto [train, test] = load(1);
  EXPECT_EQ(train.size(), 750u);
  EXPECT_EQ(test.size(), 250u);
  EXPECT_TRUE(std::is_sorted(train.begin(), train.end()));
  std::set<int> all(train.begin(), train.end());
  all.insert(test.begin(), test.end());
  EXPECT_EQ(all.size(), 1000u);  // disjoint, and every row is somewhere
  EXPECT_EQ(load(1).second, test);
  EXPECT_NE(load(2).second, test);
}

// data.shuffle: a file sorted by class, held out and shuffled, read from
// the file (NPY, mapped a window at a time) and from memory (the same rows
// as CSV) alike: the training rows are a seeded permutation of the file's
// (each row once, with its label), the test set keeps its order, and every
// segment of a BY_SEGMENT split now has every class.
TEST(NpyData, ShuffleDealsTheRowsInASeededOrderFromFilesAndMemoryAlike) {
  const std::string dir = TempDir();
  std::vector<float> x(3 * 400);
  std::vector<int32_t> y(400);
  std::string csv = "a,b,c,label\n";
  for (size_t i = 0; i < 400; ++i) {
    x[3 * i] = static_cast<float>(i);
    y[i] = static_cast<int32_t>(i / 100);  // sorted by class
    absl::StrAppend(&csv, i, ",0,0,", y[i], "\n");
  }
  WriteArray<float>(dir + "/x.npy", "<f4", x, {400, 3});
  WriteArray<int32_t>(dir + "/y.npy", "<i4", y, {400});
  Write(dir + "/t.csv", csv);
  auto rows = [&](const std::string& data) {
    absl::StatusOr<v1::JobConfig> config = FileJob(data + " test_fraction: 0.25");
    EXPECT_TRUE(config.ok()) << config.status();
    TrainTest loaded = *LoadData(*config);
    EXPECT_TRUE(CheckAllRows(loaded.train).ok());
    EXPECT_TRUE(loaded.train.MapRows({0, loaded.train.size()}).ok());
    EXPECT_TRUE(loaded.test.MapRows({0, loaded.test.size()}).ok());
    std::vector<int> train, test;
    for (size_t i = 0; i < loaded.train.size(); ++i) {
      train.push_back(static_cast<int>(Row(loaded.train, i)[0]));
      EXPECT_EQ(loaded.train.y[i], train.back() / 100) << "row " << train.back() << " lost its label";
    }
    for (size_t i = 0; i < loaded.test.size(); ++i) test.push_back(static_cast<int>(Row(loaded.test, i)[0]));
    v1::JobConfig two = *config;
    *two.mutable_model()->add_segments() = two.model().segments(0);
    two.mutable_model()->mutable_segments(1)->set_name("t");
    const bool warned = MissingClassesWarning(two, loaded.train, 0).has_value() ||
                        MissingClassesWarning(two, loaded.train, 1).has_value();
    return std::tuple{train, test, warned};
  };
  const std::string npy = absl::StrCat("source: NPY train_x: \"", dir, "/x.npy\" train_y: \"", dir, "/y.npy\"");
  const std::string table = absl::StrCat("source: CSV train_csv: \"", dir, "/t.csv\"");
  const auto [in_order, test, warned] = rows(npy);
  EXPECT_TRUE(std::is_sorted(in_order.begin(), in_order.end()));
  EXPECT_TRUE(warned) << "a class-sorted file cut in two";
  const auto [shuffled, shuffled_test, shuffled_warned] = rows(npy + " shuffle: true");
  EXPECT_FALSE(std::is_sorted(shuffled.begin(), shuffled.end()));
  EXPECT_EQ(std::multiset<int>(shuffled.begin(), shuffled.end()), std::multiset<int>(in_order.begin(), in_order.end()));
  EXPECT_EQ(shuffled_test, test) << "the test set keeps its order";
  EXPECT_FALSE(shuffled_warned) << "every segment has every class";
  EXPECT_EQ(std::get<0>(rows(npy + " shuffle: true")), shuffled) << "the same order in every process";
  EXPECT_EQ(std::get<0>(rows(table + " shuffle: true")), shuffled) << "files and tables alike";
  EXPECT_NE(std::get<0>(rows(npy + " shuffle: true data_seed: 2")), shuffled);
}

// data.validation_fraction: a seeded share of the training rows held out
// (after any shuffle), both parts in the order they had, together the
// training rows; the test set is untouched.
TEST(NpyData, AValidationShareIsHeldOutOfTheTrainingRows) {
  const std::string dir = TempDir();
  std::vector<float> x(3 * 400);
  std::vector<int32_t> y(400);
  for (size_t i = 0; i < 400; ++i) x[3 * i] = static_cast<float>(i), y[i] = static_cast<int32_t>(i % 4);
  WriteArray<float>(dir + "/x.npy", "<f4", x, {400, 3});
  WriteArray<int32_t>(dir + "/y.npy", "<i4", y, {400});
  auto load = [&](const std::string& more) {
    TrainTest data = *LoadData(*FileJob(absl::StrCat("source: NPY train_x: \"", dir, "/x.npy\" train_y: \"", dir,
                                                     "/y.npy\" test_fraction: 0.25 ", more)));
    std::vector<std::vector<int>> parts;
    for (const Dataset* d : {&data.train, &data.validation, &data.test}) {
      EXPECT_TRUE(d->MapRows({0, d->size()}).ok());
      parts.emplace_back();
      for (size_t i = 0; i < d->size(); ++i) {
        parts.back().push_back(static_cast<int>(Row(*d, i)[0]));
        EXPECT_EQ(d->y[i], parts.back().back() % 4);
      }
    }
    return parts;
  };
  const std::vector<std::vector<int>> none = load(""), held = load("validation_fraction: 0.2");
  EXPECT_TRUE(none[1].empty());
  ASSERT_EQ(held[0].size(), 240u);
  ASSERT_EQ(held[1].size(), 60u);
  EXPECT_EQ(held[2], none[2]) << "the test set is untouched";
  EXPECT_TRUE(std::is_sorted(held[0].begin(), held[0].end()));
  EXPECT_TRUE(std::is_sorted(held[1].begin(), held[1].end()));
  std::vector<int> joined = held[0];
  joined.insert(joined.end(), held[1].begin(), held[1].end());
  std::sort(joined.begin(), joined.end());
  EXPECT_EQ(joined, none[0]) << "together, the training rows, each once";
  EXPECT_EQ(load("validation_fraction: 0.2"), held);
  EXPECT_NE(load("validation_fraction: 0.2 data_seed: 2")[1], held[1]);
  const std::vector<std::vector<int>> shuffled = load("validation_fraction: 0.2 shuffle: true");
  EXPECT_FALSE(std::is_sorted(shuffled[0].begin(), shuffled[0].end())) << "held out after the shuffle";
  EXPECT_EQ(shuffled[1].size(), 60u);
}

TEST(NpyData, EachMalformedInputGetsItsMessage) {
  const std::string dir = TempDir();
  WriteArray<float>(dir + "/x.npy", "<f4", {1, 2, 3, 4, 5, 6}, {2, 3});
  WriteArray<int32_t>(dir + "/y.npy", "<i4", {0, 1}, {2});
  WriteArray<int32_t>(dir + "/x_int.npy", "<i4", {1, 2, 3, 4, 5, 6}, {2, 3});
  WriteArray<float>(dir + "/x_flat.npy", "<f4", {1, 2, 3, 4, 5, 6}, {6});
  WriteArray<float>(dir + "/x_wide.npy", "<f4", {1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  WriteArray<float>(dir + "/x_nan.npy", "<f4", {1, 2, 3, 4, std::nanf(""), 6}, {2, 3});
  WriteArray<float>(dir + "/x_inf.npy", "<f4", {1, 2, 3, 4, 5, INFINITY}, {2, 3});
  WriteArray<int32_t>(dir + "/y3.npy", "<i4", {0, 1, 2}, {3});
  WriteArray<int32_t>(dir + "/y_range.npy", "<i4", {0, 4}, {2});
  WriteArray<int32_t>(dir + "/y_neg.npy", "<i4", {-1, 0}, {2});
  WriteArray<float>(dir + "/y_float.npy", "<f4", {0, 1}, {2});
  WriteArray<uint64_t>(dir + "/y_huge.npy", "<u8", {0, 1ull << 40}, {2});
  WriteArray<int8_t>(dir + "/y_neg8.npy", "|i1", {1, -3}, {2});
  WriteArray<float>(dir + "/x_empty_rows.npy", "<f4", {}, {0, 3});
  Write(dir + "/empty.npy", "");
  Write(dir + "/text.npy", "a,b,c\n1,2,3\n");
  const std::string x = ReadFile(dir + "/x.npy");
  Write(dir + "/x_truncated.npy", x.substr(0, x.size() - 5));
  std::string fortran = x;
  fortran.replace(fortran.find("False"), 5, "True ");
  Write(dir + "/x_fortran.npy", fortran);
  std::string big = x;
  big.replace(big.find("<f4"), 3, ">f4");
  Write(dir + "/x_big.npy", big);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"x_int.npy", "x_int.npy: inputs have dtype '<i4'; they must be float32, float64 or uint8"},
      {"x_flat.npy", "x_flat.npy: inputs have 1 dimensions; they must have shape [n, 3]"},
      {"x_wide.npy", "x_wide.npy: rows have 4 features, but model.input_width is 3"},
      {"x_nan.npy", "x_nan.npy: row 1 column 1: feature is nan"},
      {"x_inf.npy", "x_inf.npy: row 1 column 2: feature is inf"},
      {"x_empty_rows.npy", "x_empty_rows.npy: holds no samples"},
      {"empty.npy", "empty.npy: empty file"},
      {"text.npy", "text.npy: not a .npy file"},
      {"x_truncated.npy", "(truncated or not a .npy file)"},
      {"x_fortran.npy", "x_fortran.npy: is in Fortran order"},
      {"x_big.npy", "x_big.npy: dtype '>f4' is big-endian"},
      {"missing.npy", "missing.npy: cannot open"},
  };
  for (const auto& [file, message] : cases) {
    absl::Status status = LoadAndCheck(absl::StrCat("source: NPY train_x: \"", dir, "/", file, "\" train_y: \"", dir,
                                                    "/y.npy\""));
    EXPECT_NE(std::string(status.message()).find(message), std::string::npos) << file << ": " << status;
  }
  const std::vector<std::pair<std::string, std::string>> label_cases = {
      {"y3.npy", "y3.npy: 3 labels for the 2 samples of"},
      {"y_range.npy", "y_range.npy: row 1: label 4 is outside [0, 4)"},
      {"y_neg.npy", "y_neg.npy: row 0: label -1 is outside [0, 4)"},
      {"y_float.npy", "y_float.npy: labels have dtype '<f4'; they must be integers"},
      {"y_huge.npy", "y_huge.npy: row 1: label 1099511627776 is outside [0, 4)"},
      {"y_neg8.npy", "y_neg8.npy: row 1: label -3 is outside [0, 4)"},
  };
  for (const auto& [file, message] : label_cases) {
    absl::Status status = LoadAndCheck(absl::StrCat("source: NPY train_x: \"", dir, "/x.npy\" train_y: \"", dir, "/",
                                                    file, "\""));
    EXPECT_NE(std::string(status.message()).find(message), std::string::npos) << file << ": " << status;
  }
}

TEST(CsvData, ReadsLabelsByNameOrIndexWithAnyDelimiter) {
  const std::string dir = TempDir();
  Write(dir + "/named.csv", "a,label,b,c\n1,3,2,3\r\n4,0,5,6\n\n");
  Write(dir + "/plain.csv", "1;2;3;2\n4;5;6;1\n");
  absl::StatusOr<TrainTest> named = LoadData(*FileJob(absl::StrCat(
      "source: CSV train_csv: \"", dir, "/named.csv\" test_csv: \"", dir, "/named.csv\" label_column: \"label\"")));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->train.x, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(named->train.y, (std::vector<int32_t>{3, 0}));
  absl::StatusOr<TrainTest> by_index = LoadData(*FileJob(absl::StrCat(
      "source: CSV train_csv: \"", dir, "/named.csv\" test_csv: \"", dir, "/named.csv\" label_column: \"1\"")));
  ASSERT_TRUE(by_index.ok()) << by_index.status();
  EXPECT_EQ(by_index->test.y, named->test.y);
  absl::StatusOr<TrainTest> plain = LoadData(*FileJob(absl::StrCat(
      "source: CSV train_csv: \"", dir, "/plain.csv\" test_csv: \"", dir, "/plain.csv\" header: false delimiter: \";\"")));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->train.x, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(plain->train.y, (std::vector<int32_t>{2, 1}));  // default: the last column
}

TEST(CsvData, EachMalformedRowNamesFileLineAndColumn) {
  const std::string dir = TempDir();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a,b,c,label\n1,2,3,0\n1,2,0\n", "bad.csv: line 3: 3 fields, but the header has 4"},
      {"a,b,c,label\n1,2,3,0\n1,x2,3,0\n", "bad.csv: line 3 column 2 (\"b\"): 'x2' is not a number"},
      {"a,b,c,label\n1,nan,3,0\n", "bad.csv: line 2 column 2 (\"b\"): 'nan' is not finite"},
      {"a,b,c,label\n1,2,inf,0\n", "bad.csv: line 2 column 3 (\"c\"): 'inf' is not finite"},
      {"a,b,c,label\n1,1e39,3,0\n", "bad.csv: line 2 column 2 (\"b\"): '1e39' is not finite as a float32"},
      {"a,b,c,label\n1,2,3,4\n", "bad.csv: line 2 column 4 (\"label\"): label '4' is not a class in [0, 4)"},
      {"a,b,c,label\n1,2,3,1.5\n", "label '1.5' is not a class in [0, 4)"},
      {"a,b,label\n1,2,0\n", "bad.csv: line 1: 2 feature columns (3 columns, one the label), but model.input_width is 3"},
      {"", "bad.csv: empty file"},
      {"a,b,c,label\n", "bad.csv: holds no data rows"},
  };
  for (const auto& [text, message] : cases) {
    Write(dir + "/bad.csv", text);
    absl::Status status = LoadAndCheck(absl::StrCat("source: CSV train_csv: \"", dir, "/bad.csv\""));
    EXPECT_NE(std::string(status.message()).find(message), std::string::npos) << text << ": " << status;
  }
  Write(dir + "/bad.csv", "a,b,c,label\n1,2,3,0\n");
  absl::Status status = LoadAndCheck(absl::StrCat("source: CSV train_csv: \"", dir, "/bad.csv\" label_column: \"y\""));
  EXPECT_NE(std::string(status.message()).find("data.label_column \"y\" is neither a column name"), std::string::npos)
      << status;
  EXPECT_NE(std::string(status.message()).find("The names: a, b, c, label."), std::string::npos) << status;
  status = LoadAndCheck(absl::StrCat("source: CSV train_csv: \"", dir, "/bad.csv\" label_column: \"lable\""));
  EXPECT_NE(std::string(status.message()).find("Did you mean \"label\"?"), std::string::npos) << status;
}

TEST(Standardize, TakesTrainingStatisticsOnlyAndTreatsFilesAndTablesAlike) {
  const std::string dir = TempDir();
  // Feature 0 has mean 2 and std 1 over the training rows; feature 2 is constant.
  Write(dir + "/train.csv", "a,b,c,y\n1,10,7,0\n3,30,7,1\n");
  Write(dir + "/test.csv", "a,b,c,y\n5,20,7,2\n");
  WriteArray<float>(dir + "/train_x.npy", "<f4", {1, 10, 7, 3, 30, 7}, {2, 3});
  WriteArray<float>(dir + "/test_x.npy", "<f4", {5, 20, 7}, {1, 3});
  WriteArray<int32_t>(dir + "/train_y.npy", "<i4", {0, 1}, {2});
  WriteArray<int32_t>(dir + "/test_y.npy", "<i4", {2}, {1});
  absl::StatusOr<TrainTest> csv = LoadData(*FileJob(absl::StrCat("source: CSV normalize: STANDARDIZE train_csv: \"",
                                                                 dir, "/train.csv\" test_csv: \"", dir, "/test.csv\"")));
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(csv->train.mean, (std::vector<float>{2, 20, 7}));
  EXPECT_EQ(csv->train.std, (std::vector<float>{1, 10, 1}));
  EXPECT_EQ(csv->test.mean, csv->train.mean);
  EXPECT_EQ(Row(csv->train, 0), (std::vector<float>{-1, -1, 0}));
  EXPECT_EQ(Row(csv->test, 0), (std::vector<float>{3, 0, 0}));
  absl::StatusOr<TrainTest> npy = LoadData(*FileJob(absl::StrCat(
      "source: NPY normalize: STANDARDIZE train_x: \"", dir, "/train_x.npy\" train_y: \"", dir,
      "/train_y.npy\" test_x: \"", dir, "/test_x.npy\" test_y: \"", dir, "/test_y.npy\"")));
  ASSERT_TRUE(npy.ok()) << npy.status();
  ASSERT_TRUE(npy->test.MapRows({0, 1}).ok());
  EXPECT_EQ(npy->train.mean, csv->train.mean);
  EXPECT_EQ(Row(npy->test, 0), Row(csv->test, 0));
}

}  // namespace
}  // namespace segps
