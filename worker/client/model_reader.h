// What the tools (segps-eval, segps-export) read of a trained model: each
// server's Stats and each segment's parameters, every range from its
// primary, as a reader (no registration, no staleness wait).
//
// With cluster.replicas >= 2 a server out of reach (its calls UNAVAILABLE
// or past their deadline) is stood in for by a live backup of its range:
// the backup that took its ranges over (server/failover.h) answers for it
// (calls naming it in the segps-server header); otherwise the backup's copy
// gives the server's segments' clocks and update counts (ReplicaStats) and
// its range's values (PullRequest.copy_of). The stand-in
// is said once per server, in the log. Where no holder of a range answers,
// every holder is asked again, backing off from 100 ms to 1 s, for twice
// cluster.rpc_deadline_ms (a server restarting); then the read fails,
// naming the server.
//
// Thread safety: one caller at a time.
#ifndef SEGPS_WORKER_CLIENT_MODEL_READER_H_
#define SEGPS_WORKER_CLIENT_MODEL_READER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/shard_map.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/parameter_server.grpc.pb.h"

namespace segps {

class ModelReader {
 public:
  // Reads the job `config` from the servers at `addresses` (every server's, in index order).
  static absl::StatusOr<std::unique_ptr<ModelReader>> Connect(const v1::JobConfig& config,
                                                              const std::vector<std::string>& addresses);

  // Every server's Stats, in index order. For a server out of reach, its
  // stand-in's copies: the segments' names, clocks and update counts, no
  // workers, and the stand-in's incarnation.
  absl::StatusOr<std::vector<v1::StatsResponse>> Stats();
  // Every segment's parameters.
  absl::StatusOr<std::vector<std::vector<float>>> Pull();
  // The servers read from a stand-in so far.
  const std::set<uint32_t>& out_of_reach() const { return out_of_reach_; }

 private:
  ModelReader(const v1::JobConfig& config, ShardMap map, std::vector<std::string> addresses,
              std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs);
  // `attempt` at each holder of range i (its primary first; a backup as
  // the server that took range i over (`taken_over`), then as a copy)
  // until one answers; all again while every failure is transient.
  template <typename T>
  absl::StatusOr<T> FromHolders(uint32_t i,
                                absl::FunctionRef<absl::StatusOr<T>(uint32_t holder, bool taken_over)> attempt);
  // Server i's Stats, or its stand-in's view of it.
  absl::StatusOr<v1::StatsResponse> StatsOf(uint32_t i);
  // Server `holder`'s values of range `range` of `segment` into `out`
  // (its own range, or its copy of another's).
  absl::Status PullRange(uint32_t holder, bool taken_over, int segment, uint32_t range, absl::Span<float> out);
  // Says once that server i's range is read from server `from`.
  void StandIn(uint32_t i, uint32_t from, bool taken_over, const std::string& why);

  const v1::JobConfig config_;
  const ShardMap map_;
  const std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
  const absl::Duration deadline_;
  std::set<uint32_t> out_of_reach_;  // servers found out of reach, read from a stand-in since
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_MODEL_READER_H_
