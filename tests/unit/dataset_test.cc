#include "worker/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "worker/numpy_random.h"

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

}  // namespace
}  // namespace segps
