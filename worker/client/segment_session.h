// One worker's session with the servers for one segment, driven one step
// at a time by its caller rather than by the training engine: what the
// Python package (python/segps) wraps, for models whose forward and
// backward passes another framework computes.
//
// A step is Pull (the parameters once the staleness bound allows computing
// the session's clock), then Push (that clock's gradient, sent without
// waiting: at most PushesInFlight unacknowledged, as the C++ worker). As
// the engine does, a push starts the next clock's pull at once, into a
// buffer of the session's, so that it travels while the caller computes
// (at staleness 0 in the push's own messages, answered once every worker's
// step is applied); Pull then waits for it and copies it out. A
// server that restarted, was paused past the lease or dropped the
// registration is rejoined as the engine does (Rejoin, within
// cluster.recovery_timeout_ms); the session then continues at the clock
// the servers agree on. A step the servers lost (a push in flight, a
// server back at its checkpoint) is not replayed: the caller's next
// batches compute from where the servers are. A reader (no rank) pulls as
// an observer and may not push.
//
// Thread safety: one caller thread; a heartbeat thread renews the leases.
#ifndef SEGPS_WORKER_CLIENT_SEGMENT_SESSION_H_
#define SEGPS_WORKER_CLIENT_SEGMENT_SESSION_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "segps/v1/config.pb.h"
#include "worker/client/heartbeat_loop.h"
#include "worker/client/ps_client.h"

namespace segps {

class SegmentSession {
 public:
  // Connects to `servers` (host:port, in index order; empty: the config's
  // cluster.server_addresses) for segment `segment` (a name or an index;
  // empty: the config's only one):
  // registered as `rank` ("auto": the lowest free one), or a reader
  // without one (nullopt). The config's security block applies.
  static absl::StatusOr<std::unique_ptr<SegmentSession>> Open(v1::JobConfig config,
                                                              const std::vector<std::string>& servers,
                                                              const std::string& segment,
                                                              std::optional<std::string> rank);
  ~SegmentSession();

  // The segment's index in the config, its elements, and its tensors in
  // their flat order.
  int segment() const { return segment_; }
  uint64_t size() const { return map_.segment_size(segment_); }
  const std::vector<TensorLayout>& tensors() const { return map_.tensors(segment_); }
  const v1::JobConfig& config() const { return config_; }
  bool reader() const { return !rank_.has_value(); }
  uint32_t rank() const { return rank_.value_or(0); }
  // The clock the next Pull is for (the next Push after it).
  uint64_t clock() const { return clock_; }
  // Steps pushed and acknowledged, and recoveries, since Open.
  uint64_t steps() const { return steps_; }
  uint64_t recoveries() const { return recoveries_; }

  // The segment's parameters into `dest` (size() floats), once the bound
  // allows computing clock(); the clock they reflect. A reader never waits.
  absl::StatusOr<uint64_t> Pull(absl::Span<float> dest);
  // The gradient of clock() (size() floats), computed on the last Pull's
  // parameters; returns once it is encoded (the buffer is free again),
  // waiting only for pushes beyond the in-flight bound.
  absl::Status Push(absl::Span<const float> gradient);
  // Waits for the pushes in flight, then leaves every server. Idempotent;
  // the session refuses every call after it.
  absl::Status Close();

 private:
  SegmentSession(v1::JobConfig config, ShardMap map, int segment, std::unique_ptr<ParameterClient> client);
  absl::Status Join(std::optional<uint32_t> rank);
  // Waits for the oldest push in flight.
  absl::Status Settle();
  // After a recoverable failure: rejoins and continues where the servers
  // agree; any other failure is returned as it is, naming the segment.
  absl::Status Recover(const absl::Status& failure);
  absl::Status Usable(const char* call) const;
  // Waits for what is in flight (failed, applied or abandoned) and forgets it.
  void Abandon();

  const v1::JobConfig config_;
  const ShardMap map_;
  const int segment_;
  const std::string tag_;
  std::unique_ptr<ParameterClient> client_;
  std::optional<HeartbeatLoop> heartbeat_;
  std::optional<uint32_t> rank_;
  uint64_t clock_ = 0;
  bool pulled_ = false, closed_ = false;
  uint64_t steps_ = 0, recoveries_ = 0;
  std::deque<Completion<absl::Status>> in_flight_;
  // The pull of clock_ started with the last push (at staleness 0, that
  // push itself), landing in `spare_`.
  std::optional<Completion<PulledAt>> prefetch_;
  std::vector<float> spare_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_SEGMENT_SESSION_H_
