// Jobs with workers on the GPU reach their CPU runs' accuracy bars: GPU and
// CPU workers training the same segments, a chain of stages, and the
// Fashion-MNIST job. Skips without a usable GPU, or fails under
// SEGPS_REQUIRE_GPU=1 (tests/gpu/check.sh).
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <regex>

#include "tests/support/gpu.h"
#include "tests/support/subprocess.h"
#include "worker/model/backend.h"

namespace segps {
namespace {

TEST(GpuCluster, MixedGpuAndCpuWorkersReachTheTeacherBar) {
  SEGPS_REQUIRE_GPU_OR_SKIP(CreateBackend("cuda:0").status());
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

// segps-local with every worker on the GPU: the job's exit, its workers'
// device and the report's ensemble accuracy.
void ExpectLocalJobOnTheGpuReaches(const std::string& config_name, double bar, absl::Duration timeout) {
  SEGPS_REQUIRE_GPU_OR_SKIP(CreateBackend("cuda:0").status());
  const std::string dir = MakeTempDir();
  std::unique_ptr<Subprocess> job =
      Subprocess::Start({BinaryPath("segps-local"), "--config", std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/" + config_name,
                         "--device", "cuda:0", "--report", dir + "/report.json",
                         "--verbose"});  // the workers' registrations name their device
  std::optional<int> status = job->Wait(timeout);
  ASSERT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << job->output();
  EXPECT_NE(job->output().find("on cuda:0"), std::string::npos) << job->output();
  EXPECT_GT(EnsembleAccuracy(ReadFile(dir + "/report.json")), bar) << job->output();
}

TEST(GpuCluster, ATeacherChainOfThreeStagesOnTheGpuReachesItsBar) {
  ExpectLocalJobOnTheGpuReaches("teacher_chain.pbtxt", 0.90, absl::Minutes(5));
}

TEST(GpuCluster, TheFashionMnistJobOnTheGpuReachesItsBar) {
  ExpectLocalJobOnTheGpuReaches("fashion_mnist.pbtxt", 0.88, absl::Minutes(10));
}

}  // namespace
}  // namespace segps
