// segps-k8s as a user runs it: what it refuses (naming the fix, writing
// nothing) and the choices its flags make. tests/k8s/check.sh checks what
// it writes against the API schemas and runs an overlay's pods.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/support/subprocess.h"

namespace segps {
namespace {

const std::string kConfigs = std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/";

struct Outcome {
  bool ok = false;
  std::string output;
};

Outcome SegpsK8s(std::vector<std::string> args) {
  args.insert(args.begin(), BinaryPath("segps-k8s"));
  std::unique_ptr<Subprocess> p = Subprocess::Start(args);
  std::optional<int> status = p->Wait(absl::Seconds(60));
  return {status.has_value() && ExitedOk(*status), p->output()};
}

TEST(SegpsK8s, RefusesDataBesideTheConfigWithoutADataVolumeNamingTheFieldAndWritesNothing) {
  const std::string out = MakeTempDir() + "/overlay";
  Outcome run = SegpsK8s({"--config", kConfigs + "teacher_npy.pbtxt", "--out", out});
  EXPECT_FALSE(run.ok);
  EXPECT_NE(run.output.find("data.train_x is \"train_x.npy\", a file beside the config"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("--data_pvc NAME or --data_host_path PATH"), std::string::npos) << run.output;
  EXPECT_FALSE(std::filesystem::exists(out)) << "it wrote " << out;
}

TEST(SegpsK8s, RefusesTwoDataVolumesABadClaimNameAndAnUnknownGpuSegment) {
  Outcome both = SegpsK8s({"--config", kConfigs + "teacher_npy.pbtxt", "--out", MakeTempDir(), "--data-pvc", "a",
                       "--data-host-path", "/srv/data"});
  EXPECT_FALSE(both.ok);
  EXPECT_NE(both.output.find("give --data_pvc or --data_host_path, not both"), std::string::npos) << both.output;
  Outcome claim = SegpsK8s({"--config", kConfigs + "teacher_npy.pbtxt", "--out", MakeTempDir(), "--data-pvc", "My_Data"});
  EXPECT_FALSE(claim.ok);
  EXPECT_NE(claim.output.find("--data_pvc 'My_Data' is no claim name Kubernetes takes"), std::string::npos)
      << claim.output;
  Outcome gpu = SegpsK8s({"--config", kConfigs + "teacher.pbtxt", "--out", MakeTempDir(), "--gpu-segments", "relu64,nope"});
  EXPECT_FALSE(gpu.ok);
  EXPECT_NE(gpu.output.find("--gpu_segments: no segment nope"), std::string::npos) << gpu.output;
}

// Dashes and underscores name the same flags; a claim of the user's for
// the model replaces the overlay's own, and a host path serves the data.
TEST(SegpsK8s, FlagsWithDashesOrUnderscoresWriteTheSameOverlay) {
  const std::string a = MakeTempDir(), b = MakeTempDir();
  ASSERT_TRUE(SegpsK8s({"--config", kConfigs + "teacher_npy.pbtxt", "--out", a, "--data-host-path", "/srv/data",
                        "--model-pvc", "my-models"}).ok);
  ASSERT_TRUE(SegpsK8s({"--config", kConfigs + "teacher_npy.pbtxt", "--out", b, "--data_host_path=/srv/data",
                        "--model_pvc=my-models"}).ok);
  for (const char* file : {"kustomization.yaml", "job.pbtxt", "workers.yaml", "eval.yaml"}) {
    EXPECT_EQ(ReadFile(a + "/" + file), ReadFile(b + "/" + file)) << file;
  }
  EXPECT_FALSE(std::filesystem::exists(a + "/model-volume.yaml"));
  EXPECT_NE(ReadFile(a + "/eval.yaml").find("claimName: \"my-models\""), std::string::npos);
  EXPECT_NE(ReadFile(a + "/workers.yaml").find("hostPath: {path: \"/srv/data\", type: Directory}"), std::string::npos);
  EXPECT_NE(ReadFile(a + "/job.pbtxt").find("train_x: \"/data/train_x.npy\""), std::string::npos);
}

// --image and --gpu-image replace the manifests' images everywhere, the
// base's servers included, through kustomize's image override.
TEST(SegpsK8s, ImagesAreReplacedEverywhereByKustomize) {
  const std::string out = MakeTempDir();
  ASSERT_TRUE(SegpsK8s({"--config", kConfigs + "teacher.pbtxt", "--out", out, "--gpu-segments", "0", "--image",
                        "registry.example:5000/segps:v2", "--gpu-image", "registry.example:5000/segps-cuda@sha256:ab12"})
                  .ok);
  const std::string kustomization = ReadFile(out + "/kustomization.yaml");
  EXPECT_NE(kustomization.find("images:\n  - name: segps\n    newName: \"registry.example:5000/segps\"\n"
                               "    newTag: \"v2\"\n  - name: segps-cuda\n"
                               "    newName: \"registry.example:5000/segps-cuda\"\n    digest: \"sha256:ab12\"\n"),
            std::string::npos)
      << kustomization;
  const std::string workers = ReadFile(out + "/workers.yaml");
  EXPECT_NE(workers.find("image: segps-cuda:latest"), std::string::npos) << "the placeholder kustomize replaces";
  // The default images need no override.
  const std::string plain = MakeTempDir();
  ASSERT_TRUE(SegpsK8s({"--config", kConfigs + "teacher.pbtxt", "--out", plain}).ok);
  EXPECT_EQ(ReadFile(plain + "/kustomization.yaml").find("images:"), std::string::npos);
}

}  // namespace
}  // namespace segps
