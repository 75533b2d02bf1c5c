#include "common/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/support/subprocess.h"

namespace segps {
namespace {

std::string Written(const std::string& dir) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f};
  EXPECT_TRUE(WriteSafetensors(dir + "/t.safetensors", {{"seg/dense_0/kernel", {2, 3}, a, {}}, {"seg/dense_0/bias", {1}, b, {}}},
                               {{"note", "a \"quoted\"\nline"}})
                  .ok());
  return ReadFile(dir + "/t.safetensors");
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const std::string dir = MakeTempDir();
  const std::string bytes = Written(dir);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  EXPECT_EQ(header % 8, 0u);  // data stays 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + header + 7 * sizeof(float));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(dir + "/t.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("note"), "a \"quoted\"\nline");
  const SafetensorsFile copy = *file;  // tensors stay readable through a copy
  EXPECT_EQ(*copy.Float32("seg/dense_0/bias", {1}), (std::vector<float>{-1.5f}));
  EXPECT_EQ(*file->Float32("seg/dense_0/kernel", {2, 3}), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(*file->Float32("seg/dense_0/bias", {1}), (std::vector<float>{-1.5f}));
  absl::StatusOr<std::vector<float>> wrong = file->Float32("seg/dense_0/kernel", {3, 2});
  EXPECT_NE(std::string(wrong.status().message()).find("tensor seg/dense_0/kernel is F32 [2, 3]; expected F32 [3, 2]"),
            std::string::npos)
      << wrong.status();
  EXPECT_EQ(file->Float32("nope", {1}).status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, RefusesEachCorruptFileNamingTheProblem) {
  const std::string dir = MakeTempDir();
  const std::string good = Written(dir);
  uint64_t header = 0;
  std::memcpy(&header, good.data(), 8);
  const std::string json = good.substr(8, header);
  auto with_header = [&](std::string h) {
    h.append((8 - h.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    const uint64_t n = h.size();
    std::memcpy(out.data(), &n, 8);
    return out + h + good.substr(8 + header);
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string h = json;
    h.replace(h.find(from), from.size(), to);
    return with_header(h);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good.substr(0, 5), "shorter than its 8-byte header length"},
      {good.substr(0, good.size() - 4), "tensor seg/dense_0/bias: data ends at 28, past the file's 24"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + good.substr(8), "exceeds the file"},
      {with_header("[1, 2]"), "the header is not a JSON object"},
      {with_header("{\"x\": "), "the header is not a JSON object"},
      {replaced("\"F32\"", "\"F99\""), "unknown dtype \"F99\""},
      {replaced("[2,3]", "[2,4]"), "holds 24 bytes, but its dtype and shape need 32"},
      {replaced("[2,3]", "[2,-3]"), "shape holds something other than a whole number"},
      {replaced("[0,24]", "[0,2.5]"), "data_offsets is not [begin, end]"},
      {replaced("[0,24]", "[4,28]"), "two tensors' data overlap"},
      {replaced("\"note\":\"", "\"note\":7,\"x\":\""), "__metadata__ value note is not a string"},
      {with_header(json + "x"), "the header is not a JSON object"},
      {replaced("\"F32\"", "\"F\\q32\""), "the header is not a JSON object"},  // a bad escape
      {replaced("{\"dtype\"", "{\"a\":" + std::string(40, '[') + std::string(40, ']') + ",\"dtype\""),
       "the header is not a JSON object"},  // nested too deep
      {replaced("\"seg/dense_0/bias\"", "\"seg/dense_0/kernel\""), "\"seg/dense_0/kernel\" appears twice"},
  };
  for (const auto& [bytes, message] : cases) {
    WriteFile(dir + "/bad.safetensors", bytes);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(dir + "/bad.safetensors");
    ASSERT_FALSE(file.ok()) << message;
    EXPECT_NE(std::string(file.status().message()).find(message), std::string::npos) << file.status();
    EXPECT_NE(std::string(file.status().message()).find("bad.safetensors"), std::string::npos);
  }
}

TEST(WriteFileAtomically, ReplacesTheFileAndLeavesNoTemporary) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "old").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "new").ok());
  EXPECT_EQ(ReadFile(dir + "/f"), "new");
  EXPECT_FALSE(WriteFileAtomically("/nonexistent/dir/f", "x").ok());
}

}  // namespace
}  // namespace segps
