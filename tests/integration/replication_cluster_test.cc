// Replicated ranges (cluster.replicas) between server processes on
// loopback: after training, every backup's copy of a range equals its
// primary's range bit for bit; a paused backup holds its primary's pushes
// until it resumes, and the job then ends with the copies equal.
#include <signal.h>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "tests/support/process_cluster.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

// 3 servers, each range on 2 of them; two segments, two workers each, staleness 2.
std::string Job(const std::string& dir, int epochs) {
  const std::string path = dir + "/job.pbtxt";
  WriteFile(path, absl::StrFormat(R"pb(
    seed: 7
    cluster { num_servers: 3 replicas: 2 lease_ms: 10000 }
    model {
      input_width: 50
      num_classes: 10
      segments { name: "relu64" layers { units: 64 activation: RELU } layers { units: 10 activation: SOFTMAX } }
      segments { name: "tanh32" layers { units: 32 activation: TANH } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { kind: ADAM learning_rate: 0.003 }
    training { batch_size: 64 epochs: %d staleness: 2 workers_per_segment: 2 }
    data { source: SYNTHETIC_TEACHER data_seed: 1 train_samples: 8000 test_samples: 1000 teacher_hidden: 32 }
  )pb", epochs));
  return path;
}

v1::StatsResponse Stats(const std::string& address) {
  auto stub = v1::ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::StatsRequest request;
  request.set_digests(true);
  v1::StatsResponse stats;
  const grpc::Status status = stub->Stats(&context, request, &stats);
  EXPECT_TRUE(status.ok()) << address << ": " << status.error_message();
  return stats;
}

// Every range of every segment: its primary's digest and its backup's.
void ExpectCopiesEqual(const ProcessCluster& cluster) {
  std::map<std::pair<uint32_t, uint32_t>, std::string> primaries, backups;
  for (size_t i = 0; i < cluster.addresses().size(); ++i) {
    const v1::StatsResponse stats = Stats(cluster.addresses()[i]);
    for (const v1::SegmentStats& segment : stats.segments()) primaries[{segment.segment(), i}] = segment.digest();
    for (const v1::ReplicaStats& copy : stats.replicas()) {
      EXPECT_GT(copy.seq(), 0u);
      EXPECT_EQ((copy.range() + 1) % 3, i) << "server " << i << " backs range " << copy.range();
      backups[{copy.segment(), copy.range()}] = copy.digest();
    }
  }
  ASSERT_EQ(primaries.size(), 6u);
  ASSERT_EQ(backups.size(), 6u);
  for (const auto& [key, digest] : primaries) {
    EXPECT_FALSE(digest.empty());
    EXPECT_EQ(backups[key], digest) << "segment " << key.first << " range " << key.second;
  }
}

std::vector<std::unique_ptr<Subprocess>> StartWorkers(const ProcessCluster& cluster) {
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (const char* segment : {"relu64", "tanh32"}) {
    for (int rank = 0; rank < 2; ++rank) workers.push_back(cluster.StartWorker(segment, rank));
  }
  return workers;
}

void ExpectFinished(std::vector<std::unique_ptr<Subprocess>>& workers) {
  for (auto& worker : workers) {
    std::optional<int> status = worker->Wait(absl::Seconds(300));
    EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  }
}

TEST(ReplicatedCluster, EveryBackupHoldsItsPrimarysRangeBitForBitAfterTraining) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, 2), dir, 3, /*checkpoints=*/false, /*tokens=*/false, /*replicated=*/true);
  std::vector<std::unique_ptr<Subprocess>> workers = StartWorkers(cluster);
  ExpectFinished(workers);
  ExpectCopiesEqual(cluster);
  EXPECT_GT(cluster.EnsembleAccuracy(), 0.85);
}

TEST(ReplicatedCluster, APausedBackupHoldsItsPrimarysPushesUntilItResumes) {
  const std::string dir = MakeTempDir();
  ProcessCluster cluster(Job(dir, 6), dir, 3, /*checkpoints=*/false, /*tokens=*/false, /*replicated=*/true);
  std::vector<std::unique_ptr<Subprocess>> workers = StartWorkers(cluster);
  // Training is under way once server 1 took a record of server 0's.
  const absl::Time start = absl::Now();
  auto seq_on_1 = [&] {
    uint64_t seq = 0;
    const v1::StatsResponse stats = Stats(cluster.addresses()[1]);
    for (const v1::ReplicaStats& copy : stats.replicas()) seq += copy.seq();
    return seq;
  };
  while (seq_on_1() < 4 && absl::Now() - start < absl::Seconds(60)) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(cluster.ServerPid(1) > 0);
  kill(cluster.ServerPid(1), SIGSTOP);
  // Server 0's pushes now wait for their backup: seen in its waiting calls.
  bool waited = false;
  for (absl::Time until = absl::Now() + absl::Seconds(5); !waited && absl::Now() < until;) {
    waited = Stats(cluster.addresses()[0]).waiting_for_backups() > 0;
    if (!waited) absl::SleepFor(absl::Milliseconds(20));
  }
  kill(cluster.ServerPid(1), SIGCONT);
  EXPECT_TRUE(waited) << "no push waited on server 0 while its backup was paused";
  ExpectFinished(workers);
  ExpectCopiesEqual(cluster);
}

}  // namespace
}  // namespace segps
