// The step-at-a-time session the Python package wraps
// (worker/client/segment_session.h), against real segps-server processes:
// a segment declared by its tensors, pulled and pushed by its caller. The
// Python tests (tests/python/) drive it through the binding; these run it
// under the sanitizers too, where the binding is not built.
#include "worker/client/segment_session.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

// Two tensors (12 and 3 elements) of one segment over 2 servers, SGD.
std::string Job(int staleness) {
  return absl::StrCat(R"pb(
name: "session"
cluster { num_servers: 2 }
optimizer { kind: SGD learning_rate: 0.5 }
training { staleness: )pb",
                      staleness, R"pb( }
model { segments { name: "net"
  tensors { name: "w" shape: 4 shape: 3 }
  tensors { name: "b" shape: 3 constant: 0.25 } } }
)pb");
}

class SegmentSessionTest : public ::testing::Test {
 protected:
  void Start(int staleness) {
    const std::string dir = MakeTempDir();
    WriteFile(dir + "/job.pbtxt", Job(staleness));
    absl::StatusOr<v1::JobConfig> config = LoadConfig(dir + "/job.pbtxt");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    servers_ = StartServers(dir + "/job.pbtxt", 2);
    ASSERT_TRUE(servers_.ok()) << servers_.Output();
  }
  std::unique_ptr<SegmentSession> Open(std::optional<std::string> rank) {
    absl::StatusOr<std::unique_ptr<SegmentSession>> session =
        SegmentSession::Open(config_, servers_.addresses, "", std::move(rank));
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *std::move(session) : nullptr;
  }

  v1::JobConfig config_;
  ServerProcesses servers_;
};

TEST_F(SegmentSessionTest, EachStepAppliesTheCallersGradientOnTheServers) {
  Start(0);
  std::unique_ptr<SegmentSession> session = Open("0");
  ASSERT_NE(session, nullptr);
  ASSERT_EQ(session->size(), 15u);
  ASSERT_EQ(session->tensors().size(), 2u);
  std::vector<float> values(15), expected;
  ASSERT_TRUE(session->Pull(absl::MakeSpan(values)).ok());
  for (int i = 12; i < 15; ++i) EXPECT_EQ(values[i], 0.25f);  // constant: 0.25
  for (int step = 0; step < 6; ++step) {
    std::vector<float> gradient(15);
    for (int i = 0; i < 15; ++i) gradient[i] = 0.125f * static_cast<float>((i + step) % 5) - 0.25f;
    expected = values;
    for (int i = 0; i < 15; ++i) expected[i] -= 0.5f * gradient[i];
    ASSERT_TRUE(session->Push(gradient).ok());
    absl::StatusOr<uint64_t> at = session->Pull(absl::MakeSpan(values));
    ASSERT_TRUE(at.ok()) << at.status();
    EXPECT_EQ(values, expected) << "step " << step;  // staleness 0: the step's push is in
  }
  EXPECT_EQ(session->clock(), 6u);
  ASSERT_TRUE(session->Close().ok());
  EXPECT_EQ(session->steps(), 6u);
  EXPECT_TRUE(session->Close().ok());  // idempotent
  absl::Status closed = session->Pull(absl::MakeSpan(values)).status();
  EXPECT_EQ(closed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(closed.message(), "pull: the session of net is closed");
}

TEST_F(SegmentSessionTest, MisuseIsRefusedAndChangesNothing) {
  Start(1);
  std::unique_ptr<SegmentSession> session = Open("auto");
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->rank(), 0u);
  std::vector<float> values(15), gradient(15, 1.0f), small(14);
  absl::Status early = session->Push(gradient);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(early.message(), "push: pull the parameters of clock 0 first: a gradient is of the parameters it was "
                             "computed on");
  EXPECT_EQ(session->Pull(absl::MakeSpan(small)).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(session->Pull(absl::MakeSpan(values)).ok());
  EXPECT_EQ(session->Push(small).code(), absl::StatusCode::kInvalidArgument);
  std::unique_ptr<SegmentSession> reader = Open(std::nullopt);
  ASSERT_NE(reader, nullptr);
  std::vector<float> read(15);
  ASSERT_TRUE(reader->Pull(absl::MakeSpan(read)).ok());
  EXPECT_EQ(read, values);  // nothing was applied
  EXPECT_EQ(reader->Push(gradient).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SegmentSession::Open(config_, servers_.addresses, "other", "0").status().message(),
            "segment 'other' names no segment of the config: one of net");
  EXPECT_EQ(SegmentSession::Open(config_, servers_.addresses, "net", "1").status().message(),
            "rank must be 'auto' or in [0, 1) for segment net, got '1'");
}

// Staleness 2: up to 3 pushes in flight while the caller pulls on, and the
// heartbeat thread beside it; the servers end with every push applied.
TEST_F(SegmentSessionTest, PushesInFlightWithinTheBoundAllLand) {
  Start(2);
  std::unique_ptr<SegmentSession> session = Open("0");
  ASSERT_NE(session, nullptr);
  std::vector<float> values(15), initial(15), gradient(15, 0.01f);
  ASSERT_TRUE(session->Pull(absl::MakeSpan(initial)).ok());
  ASSERT_TRUE(session->Push(gradient).ok());
  for (int step = 1; step < 200; ++step) {
    absl::StatusOr<uint64_t> at = session->Pull(absl::MakeSpan(values));
    ASSERT_TRUE(at.ok()) << at.status();
    EXPECT_GE(*at + 3, session->clock()) << "the bound: no more than s + 1 clocks behind";
    ASSERT_TRUE(session->Push(gradient).ok());
  }
  ASSERT_TRUE(session->Close().ok());
  EXPECT_EQ(session->steps(), 200u);
  std::unique_ptr<SegmentSession> reader = Open(std::nullopt);
  ASSERT_NE(reader, nullptr);
  ASSERT_TRUE(reader->Pull(absl::MakeSpan(values)).ok());
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(values[i], initial[i] - 200 * 0.5f * 0.01f, 1e-4) << i;
}

}  // namespace
}  // namespace segps
