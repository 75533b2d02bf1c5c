// The parameter server's core, independent of the transport: validates every
// request against the config and the shard map, and routes it to the
// segment's shard. The gRPC service (grpc_service.h) is a thin adapter.
//
// Thread safety: all methods may be called concurrently; shards lock
// themselves, nothing here locks the whole store.
#ifndef SEGPS_SERVER_PARAMETER_SERVER_H_
#define SEGPS_SERVER_PARAMETER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shard_map.h"
#include "common/tensor_wire.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/parameter_server.pb.h"
#include "server/apply_pool.h"
#include "server/segment_shard.h"
#include "server/server_metrics.h"

namespace segps {

class ParameterServer {
 public:
  // `config` must come from LoadConfig. Allocates and initialises this
  // server's ranges of every segment. `metrics`, when given, must outlive
  // the server. A push's update is split over up to `apply_threads`.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> Create(const v1::JobConfig& config,
                                                                 uint32_t index,
                                                                 ServerMetrics* metrics = nullptr,
                                                                 int apply_threads = 1);

  // Each call validates its request; a rejected call changes nothing.
  // `deadline` bounds any wait (the client's deadline, capped by
  // cluster.pull_wait_ms).
  absl::Status Register(const v1::RegisterRequest& request, v1::RegisterResponse* response);
  //
  // Pull fills `response` but for values' data: it hands the values and
  // their wire dtype to `read` (under the shard's lock) once the request is
  // valid and the staleness bound allows.
  using ReadValues = absl::FunctionRef<void(absl::Span<const float> values, v1::DType dtype)>;
  absl::Status Pull(const v1::PullRequest& request, absl::Time deadline, ReadValues read,
                    v1::PullResponse* response);
  // Push reads the gradient's data from `data`, not from the request. With
  // request.pull, the values for clock + 1 go to `read` as Pull's.
  absl::Status Push(const v1::PushRequest& request, const Payload& data, absl::Time deadline, ReadValues read,
                    v1::PushResponse* response);
  // The same for whole messages (values' data in the responses, gradient's in the request).
  absl::Status Pull(const v1::PullRequest& request, absl::Time deadline, v1::PullResponse* response);
  absl::Status Push(const v1::PushRequest& request, absl::Time deadline, v1::PushResponse* response);
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response);
  absl::Status Leave(const v1::LeaveRequest& request);
  void Stats(v1::StatsResponse* response);

  uint32_t index() const { return index_; }
  const v1::JobConfig& config() const { return config_; }
  const ShardMap& shard_map() const { return map_; }
  absl::Duration max_wait() const { return max_wait_; }
  SegmentShard& shard(int segment) { return *shards_[segment]; }

 private:
  ParameterServer(v1::JobConfig config, uint32_t index, ShardMap map, ServerMetrics* metrics);
  absl::StatusOr<SegmentShard*> ShardFor(uint32_t segment, const char* call);
  absl::Status Reject(uint32_t segment, absl::Status status);

  const v1::JobConfig config_;
  const uint32_t index_;
  const ShardMap map_;
  const std::string model_fingerprint_;
  const absl::Duration max_wait_;
  ServerMetrics* const metrics_;  // may be null
  std::unique_ptr<ApplyPool> apply_pool_;  // null with one apply thread; outlives the shards
  std::vector<std::unique_ptr<SegmentShard>> shards_;
  std::unique_ptr<std::atomic<uint64_t>[]> rejected_;
  std::atomic<uint64_t> next_worker_id_{1};
};

}  // namespace segps

#endif  // SEGPS_SERVER_PARAMETER_SERVER_H_
