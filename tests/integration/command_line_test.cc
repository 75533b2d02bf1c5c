// Every segps binary's --help lists its own flags with their defaults (not
// Abseil's, which --helpfull adds), run as a user would run it.
#include "common/command_line.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

struct Binary {
  const char* name;
  const char* own_flag;  // a flag the binary itself defines
};
// How the test's name shows its parameter (not its bytes).
void PrintTo(const Binary& binary, std::ostream* os) { *os << binary.name; }

class HelpTest : public ::testing::TestWithParam<Binary> {};

TEST_P(HelpTest, ListsTheBinarysOwnFlagsWithTheirDefaults) {
  std::unique_ptr<Subprocess> help = Subprocess::Start({BinaryPath(GetParam().name), "--help"});
  ASSERT_TRUE(help->Wait(absl::Seconds(30)).has_value());
  const std::string out = help->output();
  EXPECT_NE(out.find(absl::StrCat(GetParam().name, ": ")), std::string::npos) << "no usage line:\n" << out;
  EXPECT_NE(out.find(absl::StrCat("    --", GetParam().own_flag, " (")), std::string::npos) << out;
  EXPECT_NE(out.find("default: "), std::string::npos) << out;
  EXPECT_EQ(out.find("No flags matched"), std::string::npos) << out;
  EXPECT_EQ(out.find("--flagfile"), std::string::npos) << "Abseil's own flags belong to --helpfull:\n" << out;
}

INSTANTIATE_TEST_SUITE_P(Binaries, HelpTest,
                         ::testing::Values(Binary{"segps-server", "config"}, Binary{"segps-worker", "config"},
                                           Binary{"segps-eval", "config"}, Binary{"segps-local", "config"},
                                           Binary{"segps-checkpoint", "dir"}, Binary{"segps-data", "out"},
                                           Binary{"segps-export", "onnx"}, Binary{"segps-predict", "model"},
                                           Binary{"segps-health", "address"}, Binary{"segps-k8s", "data_pvc"}),
                         [](const ::testing::TestParamInfo<Binary>& info) {
                           std::string name = info.param.name;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST(SourcePath, NamesAFlagsFileWithinTheSourceTree) {
  EXPECT_EQ(SourcePath("/home/ci/segps/server/main.cc"), "server/main.cc");
  EXPECT_EQ(SourcePath("work/main/deploy/local/launcher.cc"), "deploy/local/launcher.cc");
  EXPECT_EQ(SourcePath("/src/worker/tools/eval_main.cc"), "worker/tools/eval_main.cc");
  EXPECT_EQ(SourcePath("server/main.cc"), "server/main.cc");
  EXPECT_EQ(SourcePath("./absl/flags/parse.cc"), "./absl/flags/parse.cc");
}

}  // namespace
}  // namespace segps
