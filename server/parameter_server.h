// The parameter server's core, independent of the transport: validates every
// request against the config and the shard map, and routes it to the
// segment's shard. The gRPC service (grpc_service.h) is a thin adapter.
//
// Thread safety: all methods may be called concurrently; shards lock
// themselves, nothing here locks the whole store.
#ifndef SEGPS_SERVER_PARAMETER_SERVER_H_
#define SEGPS_SERVER_PARAMETER_SERVER_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/shard_map.h"
#include "common/shared_region.h"
#include "common/sync.h"
#include "common/tensor_wire.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/parameter_server.pb.h"
#include "server/apply_pool.h"
#include "server/checkpoint.h"
#include "server/checkpoint_report.h"
#include "server/replica_log.h"
#include "server/replica_range.h"
#include "server/segment_shard.h"
#include "server/server_metrics.h"

namespace segps {

struct ServerOptions {
  ServerMetrics* metrics = nullptr;  // when given, must outlive the server
  // Threads a push's update is split over.
  int apply_threads = 1;
  // Time for leases and deadlines; must outlive the server.
  Clock* clock = Clock::Real();
  // How often a thread of the server's own moves leases and deadlines on
  // (Tick). Zero: no thread (tests with a FakeClock call Tick themselves).
  absl::Duration tick = absl::Milliseconds(10);
  // Overrides the config's checkpoint.dir (segps-server --checkpoint_dir).
  std::string checkpoint_dir;
  // Whether calls carry tokens (Security::tokens), and the servers' key for
  // sealing rank states (Security::state_key): where calls are
  // authenticated, a Rollback is taken only on states sealed with it.
  bool authenticated = false;
  std::string state_key;
};

class ParameterServer {
 public:
  // `config` must come from LoadConfig. Allocates and initialises this
  // server's ranges of every segment, or, with a checkpoint directory that
  // holds checkpoints of this server, restores each segment's newest valid
  // one (refusing, with both fingerprints, one of another job).
  static absl::StatusOr<std::unique_ptr<ParameterServer>> Create(const v1::JobConfig& config, uint32_t index,
                                                                 const ServerOptions& options = {});
  ~ParameterServer();

  // Each call validates its request; a rejected call changes nothing.
  // `caller` is who the transport says the call came from (Caller::identity:
  // empty when calls are not authenticated): a registration is bound to the
  // caller that made it, and calls on it from another get NOT_FOUND.
  absl::Status Register(const v1::RegisterRequest& request, v1::RegisterResponse* response,
                        const std::string& caller = "");
  // A PushStream or PullStream carries calls of registration `id` (whose
  // `secret` and `caller` are checked as its calls' are; false if they do
  // not match), or it ended. A registration whose streams have all ended
  // lost its worker (a killed process's connections close): its rank is
  // free for another at once, not only once its lease lapses.
  bool StreamOpened(uint32_t segment, uint64_t id, const std::string& secret, const std::string& caller);
  void StreamClosed(uint32_t segment, uint64_t id);

  // Pull and Push complete through `done`, exactly once: at once, or when
  // the staleness bound (or a push's predecessor) allows, or with
  // UNAVAILABLE at `deadline` (the client's deadline, capped by
  // cluster.pull_wait_ms). No thread waits meanwhile. `response` must stay
  // valid until `done` runs; it is filled but for values' data, which goes
  // with its wire dtype to `read` (under the shard's lock) once the request
  // is valid and the bound allows.
  using ReadValues = absl::AnyInvocable<void(absl::Span<const float> values, v1::DType dtype)>;
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  void Pull(const v1::PullRequest& request, absl::Time deadline, ReadValues read, v1::PullResponse* response,
            Done done, const std::string& caller = "");
  // Push reads the gradient's data from `data` (kept until `done`), not
  // from the request. With request.pull, the push and the pull of the same
  // elements for clock + 1 are one operation on the shard; the values go to
  // `read` as Pull's.
  void Push(const v1::PushRequest& request, Payload data, absl::Time deadline, ReadValues read,
            v1::PushResponse* response, Done done, const std::string& caller = "");
  // Blocking forms for whole messages (values' data in the responses,
  // gradient's in the request), for tools and tests on the real clock.
  absl::Status Pull(const v1::PullRequest& request, absl::Time deadline, v1::PullResponse* response,
                    const std::string& caller = "");
  absl::Status Push(const v1::PushRequest& request, absl::Time deadline, v1::PushResponse* response,
                    const std::string& caller = "");
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response,
                         const std::string& caller = "");
  // The rank's steps applied here go in `response`, when given.
  absl::Status Leave(const v1::LeaveRequest& request, const std::string& caller = "",
                     v1::LeaveResponse* response = nullptr);
  void Stats(const v1::StatsRequest& request, v1::StatsResponse* response);
  void Stats(v1::StatsResponse* response) { Stats(v1::StatsRequest(), response); }
  absl::Status Rollback(const v1::RollbackRequest& request, v1::RollbackResponse* response,
                        const std::string& caller = "");

  // Same-host shared memory (cluster.shared_memory): from now on a
  // Register from this host names `socket` (a RegionListener's), and
  // AttachRegion gives the registration an offer names its region: later
  // tensors of its calls may lie there (TensorSlice.region_offset). Call
  // before serving.
  void OfferRegions(std::string socket);
  absl::Status AttachRegion(const v1::RegionOffer& offer, std::shared_ptr<SharedRegion> region);

  // cluster.replicas (server/replicas.cc; docs/replication.md). The logs
  // of this server's ranges, on their way to their backups (none with one
  // copy), and the ranges it backs.
  const std::vector<std::unique_ptr<ReplicaLog>>& replica_logs() const { return logs_; }
  ReplicaRange* copy(int segment, uint32_t range);
  // Backup `backup`'s link opened: each of this server's ranges it backs
  // starts from its whole state.
  void SyncReplicas(uint32_t backup);
  // A primary's hello, sealed where calls are authenticated (the primary's
  // side), and checked (the backup's): the job, the ring and the seal.
  v1::ReplicaHello Hello(uint32_t backup) const;
  absl::Status CheckHello(const v1::ReplicaHello& hello) const;
  // A peer server's hello to this one, on `call`: the job and the seal.
  absl::Status CheckPeer(const v1::ReplicaHello& hello, const char* call) const;
  // A record from server `from`: taken by this server's copy of its
  // range, which `from` must be the primary of; an error names what is
  // wrong and changes nothing. A push's gradient bytes are `gradient`.
  absl::Status TakeReplica(uint32_t from, const v1::ReplicaRecord& record, const Payload& gradient);
  // Started again without its ranges: workers are refused (UNAVAILABLE)
  // from BeginTakeBack until EndTakeBack, and meanwhile each range of this
  // server may be taken back from a backup's copy (`copy`, a Fetch reply:
  // checked against the range; none where the backup holds no state).
  void BeginTakeBack() { taking_back_ = true; }
  absl::Status TakeBack(int segment, const v1::ReplicaRecord& copy);
  void EndTakeBack() { taking_back_ = false; }
  // Failover (server/failover.h): this server serves a primary's ranges
  // taken over by one of its backups, alone: its pushes wait for no backup.
  void ServeAlone();
  // Hands every range over to the primary's new run: each segment's
  // state, after which every call is refused (UNAVAILABLE, `why`).
  std::vector<v1::ReplicaRecord> HandOver(const std::string& why);
  // A backup's answer to Fetch: its copy of the caller's range, the caller
  // checked as a Replicate stream's sender.
  absl::StatusOr<v1::ReplicaRecord> Fetch(const v1::FetchRequest& request) const;
  // A reader's Pull of this server's copy of another server's range
  // (PullRequest.copy_of): the values go to `read`, as Pull's.
  absl::Status ReadCopy(const v1::PullRequest& request, ReadValues& read, v1::PullResponse* response);

  // Writes the checkpoints cut so far (tests; shutdown).
  void FlushCheckpoints();

  // Moves every shard's leases and deadlines on to the clock's time.
  void Tick();
  // Answers every waiting call with UNAVAILABLE and waits no more (shutdown),
  // until Reopen (the same server served on a new listener).
  void Drain();
  void Reopen();
  // Calls waiting in the shards now.
  size_t Waiting();

  uint32_t index() const { return index_; }
  uint64_t incarnation() const { return incarnation_; }
  CheckpointStore* checkpoints() const { return store_.get(); }  // null without a checkpoint dir
  const v1::JobConfig& config() const { return config_; }
  const ShardMap& shard_map() const { return map_; }
  absl::Duration max_wait() const { return max_wait_; }
  Clock* clock() const { return clock_; }
  SegmentShard& shard(int segment) { return *shards_[segment]; }

 private:
  ParameterServer(v1::JobConfig config, uint32_t index, ShardMap map, const ServerOptions& options);
  // The options of segment k's shard on this server.
  ShardOptions ShardOptionsFor(int k);
  // Makes segment k's shard, restored from its newest checkpoint if there is one.
  absl::Status AddShard(int k);
  // The checkpoint writer (with a store) and the ticker (every `tick`, if positive).
  void StartThreads(absl::Duration tick);
  // The replica logs and copies (with cluster.replicas >= 2).
  absl::Status AddReplicas();
  // With StatsRequest.digests.
  void FillReplicaStats(bool digests, v1::StatsResponse* response);
  absl::StatusOr<SegmentShard*> ShardFor(uint32_t segment, const char* call);
  absl::Status Reject(uint32_t segment, absl::Status status);
  absl::Status CheckFingerprints(const v1::RegisterRequest& request) const;
  // The rank a registration takes: the one it names (in range), or with
  // any_rank the lowest free one.
  absl::StatusOr<uint32_t> RankFor(const v1::RegisterRequest& request, SegmentShard* shard);
  // A push answered: its metrics.
  void ObservePush(uint32_t segment, absl::Time start, size_t bytes, const PushResult& result);
  // Early stopping: a registration's epoch length, for its segment's epoch cuts.
  absl::Status TakeEpochClocks(const v1::RegisterRequest& request, SegmentShard* shard);
  // Early stopping: Leave with end_at_clock ends the caller's segment at its
  // checkpoint of that clock (deleting the newer ones); asked again, it
  // answers alike.
  absl::Status EndSegment(const v1::LeaveRequest& request, v1::LeaveResponse* response);
  // This server's state of a rank as Register answers it, sealed.
  v1::SealedRankState Seal(uint32_t segment, uint32_t rank, const Registered& registered) const;
  // OK when a Rollback's states show that the servers disagree on the
  // rank: one from each server, sealed with the servers' key where calls
  // are authenticated, sealed within a lease, this server's current (of
  // its incarnation and the request's generation, the segment's).
  absl::Status CheckDisagreement(const v1::RollbackRequest& request) const;
  // A chain's rollback (RollbackRequest.chain): every stage's segment not
  // already at rest at the request's clock goes back to its checkpoint there.
  absl::Status RollbackChain(const v1::RollbackRequest& request, v1::RollbackResponse* response);
  // The clocks at which every segment of a chain has a checkpoint here.
  std::vector<uint64_t> ChainCheckpointClocks() const;
  // A chain: where rank `rank`'s lane stands here and the checkpoints
  // every stage holds (RegisterResponse.lane_clocks, chain_checkpoint_clocks).
  void DescribeLane(uint32_t rank, v1::RegisterResponse* response);
  // What a push says beside its gradient, once its values (`scanned`) and
  // its sample count are checked: an error that names what is wrong.
  absl::StatusOr<PushInfo> CheckPush(const v1::PushRequest& request, const DenseView::Values& scanned) const;
  // A reply's values slice: where the values lie in the caller's region,
  // if they do (counted in region_bytes_).
  void FillValues(uint32_t segment, Range chunk, v1::DType dtype, std::optional<uint64_t> region_offset,
                  v1::TensorSlice* values);
  // A push's embedding rows (none: `rows` stays empty), checked.
  absl::Status PushedRows(const v1::PushRequest& request, Range range, const SharedRegion* region,
                          std::vector<RowGradients>* rows) const;
  // A pull's embedding rows, checked: what reads them into `response` (or
  // the caller's `region`) under the shard's lock, and their bytes.
  absl::Status RowReader(const v1::PullRequest& request, std::shared_ptr<SharedRegion> region,
                         v1::PullResponse* response, ReadRows* read, size_t* bytes) const;
  void ObservePull(uint32_t segment, absl::Time start, size_t bytes, uint64_t staleness, absl::Duration blocked);

  const v1::JobConfig config_;
  const uint32_t index_;
  const ShardMap map_;
  const std::string model_fingerprint_;
  const absl::Duration max_wait_;
  ServerMetrics* const metrics_;  // may be null
  Clock* const clock_;
  const bool authenticated_;
  const std::string state_key_;
  uint64_t incarnation_ = 0;  // random, drawn at Create
  std::unique_ptr<CheckpointStore> store_;  // null without a checkpoint dir
  std::unique_ptr<ApplyPool> apply_pool_;  // null with one apply thread; outlives the shards
  RowBudget row_budget_{config_.cluster().embedding_rows_budget()};  // outlives the shards
  std::vector<std::unique_ptr<ReplicaLog>> logs_;  // per segment; outlive the shards
  std::vector<std::unique_ptr<SegmentShard>> shards_;
  std::map<std::pair<int, uint32_t>, std::unique_ptr<ReplicaRange>> copies_;  // by (segment, range)
  // Per segment (rejected_: one more, for unknown segments).
  std::unique_ptr<std::atomic<uint64_t>[]> rejected_, push_bytes_, pull_bytes_, region_bytes_;
  std::atomic<uint64_t> next_worker_id_{1};
  std::atomic<bool> taking_back_{false};
  std::atomic<bool> taken_back_{false};  // a range was taken back since the server started
  // OK when `secret` is the one worker `id` was registered with; else
  // NOT_FOUND naming `call`, whether the id is unknown or the secret wrong.
  // `segment`, when given, must be the registration's, and `caller` the
  // one that made it.
  // `region`, when given, gets the registration's shared region (null: none).
  absl::Status CheckRegistration(uint64_t id, const std::string& secret, const std::string& caller, const char* call,
                                 std::optional<uint32_t> segment = std::nullopt,
                                 std::shared_ptr<SharedRegion>* region = nullptr);
  // A push's gradient bytes in the caller's shared region, where it put
  // them there (`data` then empty), checked against the region.
  static absl::Status GradientInRegion(const v1::TensorSlice& gradient, const std::shared_ptr<SharedRegion>& region,
                                       Payload* data);
  // Where a reply asked for its values in the caller's region
  // (`reply_offset`), `read` writes them there instead: `bytes` of them,
  // checked against the region first.
  // A push's tensors: its gradient's bytes (`data`, taken from the region
  // where the request put them there) checked against this server's
  // `range`, and where its pulled values go (`read`, into the region at
  // `reply_offset` where the request asked).
  static absl::Status PushTensors(const v1::PushRequest& request, Range range,
                                  const std::shared_ptr<SharedRegion>& region, Payload* data, ReadValues* read,
                                  std::optional<uint64_t>* reply_offset);
  // The elements a Pull asks for of `range` (offset and count; count 0:
  // all of it), and its reply's dtype; `call` and `whose` name them in errors.
  static absl::StatusOr<Range> PulledChunk(const v1::PullRequest& request, Range range, const char* call,
                                           const char* whose);
  static absl::StatusOr<v1::DType> PulledDType(const v1::PullRequest& request, const char* call);
  static absl::Status ReplyInRegion(std::optional<uint64_t> reply_offset, size_t bytes,
                                    const std::shared_ptr<SharedRegion>& region, const char* call, ReadValues* read);
  void ForgetRegistrations(const std::vector<uint64_t>& ids);
  struct Secret {
    std::string bytes;
    uint32_t segment = 0;
    std::string caller;  // who registered it
    std::shared_ptr<SharedRegion> region;  // its shared region, if it handed one over
  };
  std::string region_socket_, host_;  // set by OfferRegions
  Mutex secrets_mu_;
  std::unordered_map<uint64_t, Secret> secrets_ ABSL_GUARDED_BY(secrets_mu_);
  // When each segment was last rolled back here: one rollback a segment
  // per kRollbackInterval, so that a caller with a registration cannot keep
  // undoing training.
  static constexpr absl::Duration kRollbackInterval = absl::Seconds(1);
  Mutex rollback_mu_;
  std::vector<absl::Time> rolled_back_at_ ABSL_GUARDED_BY(rollback_mu_);

  // The checkpoint writer: cuts wait here (the newest per segment) for a
  // thread of the server's own to write them.
  void WriteCheckpoints();
  Mutex writer_mu_;
  CondVar writer_wake_;
  // Cuts taken and not yet being written, oldest first: at most one a
  // segment, as a cut waits for room (ShardOptions::cut_room), besides a
  // segment's final one.
  std::deque<std::pair<int, std::shared_ptr<const ShardState>>> to_write_ ABSL_GUARDED_BY(writer_mu_);
  bool writing_ ABSL_GUARDED_BY(writer_mu_) = false;
  bool writer_stop_ ABSL_GUARDED_BY(writer_mu_) = false;
  std::thread writer_;  // joinable with a checkpoint dir
  CheckpointReport checkpoint_report_{static_cast<int>(index_), absl::Seconds(30)};

  Mutex ticker_mu_;
  CondVar ticker_wake_;
  bool ticker_stop_ ABSL_GUARDED_BY(ticker_mu_) = false;
  std::thread ticker_;  // joinable when options.tick > 0
};

}  // namespace segps

#endif  // SEGPS_SERVER_PARAMETER_SERVER_H_
