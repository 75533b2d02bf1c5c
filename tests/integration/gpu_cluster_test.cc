// One GPU worker and one CPU worker training the same segment against the
// same servers reach the teacher config's bar. Skips without a usable GPU.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <regex>

#include "tests/support/subprocess.h"
#include "worker/model/backend.h"

namespace segps {
namespace {

TEST(GpuCluster, MixedGpuAndCpuWorkersReachTheTeacherBar) {
  absl::StatusOr<std::unique_ptr<Backend>> gpu = CreateBackend("cuda:0");
  if (!gpu.ok()) GTEST_SKIP() << "no usable GPU: " << gpu.status().message();
  gpu->reset();
  const std::string config = std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/teacher.pbtxt";
  ServerProcesses servers = StartServers(config, 2);
  ASSERT_TRUE(servers.ok()) << servers.Output();
  const std::string addresses = servers.Joined();
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (const char* segment : {"relu64", "tanh128"}) {
    for (int rank = 0; rank < 2; ++rank) {
      // Rank 0 of every segment on the GPU, rank 1 on the CPU.
      workers.push_back(Subprocess::Start({BinaryPath("segps-worker"), "--config", config, "--segment", segment,
                                           "--rank", std::to_string(rank), "--servers", addresses, "--device",
                                           rank == 0 ? "cuda:0" : "cpu"}));
    }
  }
  for (auto& w : workers) {
    std::optional<int> status = w->Wait(absl::Minutes(5));
    ASSERT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << w->output();
  }
  EXPECT_NE(workers[0]->output().find("on cuda:0"), std::string::npos) << workers[0]->output();
  const std::string report = MakeTempDir() + "/report.json";
  std::unique_ptr<Subprocess> eval = Subprocess::Start(
      {BinaryPath("segps-eval"), "--config", config, "--servers", addresses, "--report", report});
  std::optional<int> status = eval->Wait(absl::Minutes(2));
  ASSERT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << eval->output();
  std::smatch m;
  const std::string json = ReadFile(report);
  ASSERT_TRUE(std::regex_search(json, m, std::regex("\"ensemble\": \\{\"name\": \"ensemble\", \"accuracy\": ([0-9.]+)")));
  EXPECT_GT(std::stod(m[1]), 0.90) << json;
}

}  // namespace
}  // namespace segps
