// Parameter servers in the test's own process, each serving real gRPC on
// a loopback port of its own (port 0): the whole training path without
// process management.
#ifndef SEGPS_TESTS_SUPPORT_INPROCESS_CLUSTER_H_
#define SEGPS_TESTS_SUPPORT_INPROCESS_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "server/grpc_service.h"
#include "server/parameter_server.h"

namespace segps {

class InProcessCluster {
 public:
  explicit InProcessCluster(const v1::JobConfig& config, const ServerOptions& options = {}) {
    for (uint32_t i = 0; i < config.cluster().num_servers(); ++i) {
      servers_.push_back(*ParameterServer::Create(config, i, options));
      running_.push_back(*StartGrpcServer(servers_.back().get(), "127.0.0.1:0"));
      addresses_.push_back(running_.back()->address());
    }
  }
  const std::vector<std::string>& addresses() const { return addresses_; }
  // Stops server i's gRPC service at once (its open streams are cancelled).
  void StopServing(size_t i) { running_[i]->Shutdown(absl::ZeroDuration()); }
  // Pull calls server i served for segment k (each chunk counts).
  uint64_t Pulls(size_t i, int k) {
    v1::StatsResponse stats;
    servers_[i]->Stats(&stats);
    return stats.segments(k).pulls();
  }
  // Embedding rows server i stores (touched), over segment k's tables.
  uint64_t StoredRows(size_t i, int k) {
    v1::StatsResponse stats;
    servers_[i]->Stats(&stats);
    return stats.segments(k).embedding_rows();
  }
  // Segment k's parameters, stitched from every server's range.
  std::vector<float> Parameters(int k) {
    std::vector<float> all;
    for (auto& s : servers_) {
      std::vector<float> part = s->shard(k).Snapshot();
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }

 private:
  std::vector<std::unique_ptr<ParameterServer>> servers_;
  std::vector<std::unique_ptr<RunningServer>> running_;
  std::vector<std::string> addresses_;
};

}  // namespace segps

#endif  // SEGPS_TESTS_SUPPORT_INPROCESS_CLUSTER_H_
