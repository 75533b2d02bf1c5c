// One server's range of one segment: the parameter values, the optimizer
// state for them, and the stale-synchronous-parallel clocks of the segment's
// workers as this server sees them.
//
// Clocks. A worker's clock counts its steps. Its push for step k carries
// clock k; the shard applies a worker's pushes in clock order, each at most
// once, and next_clock(w) is the clock it expects next. A push may come in
// chunks (consecutive sub-ranges from the start of the range): each chunk is
// applied at most once and in order, and the step counts once its last
// chunk is applied. The segment clock is
// the minimum next_clock over live workers. A pull for clock c with staleness
// bound s returns once every live worker has pushed every step older than
// c - s (s = -1: never waits), for the elements pulled: a chunk of the range
// is ready as soon as the chunks of those steps covering it have landed.
//
// Liveness. A worker is live while it renews its lease (any call) within the
// lease period. When a lease runs out the worker stops counting towards the
// segment clock, so a crashed worker cannot hold the others back; its later
// calls fail with FAILED_PRECONDITION until it registers again.
//
// Waits hold no thread. A pull behind the bound, or a push that arrived
// ahead of its predecessor, is parked in the shard with its completion and
// resumed by whichever call releases it (a push, a leave, a registration)
// or failed by Tick once its deadline passes. Time comes from the options'
// Clock, and Tick is what moves leases and deadlines on: the server calls it
// every few milliseconds, a test after stepping a FakeClock.
//
// Checkpoints. With checkpoint_every = E, the shard takes a consistent cut
// at every segment clock that is a multiple of E: a push of clock c >= the
// next multiple waits until every live worker has pushed every clock below
// it, the values and optimizer state are copied (under the lock: a memory
// copy), and the copy goes to on_checkpoint, which writes it elsewhere. At
// staleness 0 no push waits for it. When the segment's last worker leaves,
// the final state is cut too. Restore replaces the state with a
// checkpoint's: every registration is dropped, and each rank the checkpoint
// held is kept as a placeholder at its clock (live for one lease from the
// next push), so that the segment waits for it and it rejoins there.
//
// Starting. The segment's first registration keeps a placeholder at clock
// 0 for each other configured rank (live for one lease from the segment's
// first push: peers that wait for a stage to load its data do not count
// against it): a worker started a moment after its peers starts where they
// do, instead of at the clock they reached without it. With
// hold_for_joiners (staleness 0) a push of clock c also waits while a
// worker that registered at c (or a placeholder there) has not yet pulled:
// its step computes on exactly the updates below c.
//
// Rejoining. A registration of a rank that the shard still knows (a
// placeholder, an expired lease, a replaced worker) continues at that
// rank's next clock: nothing it pushed is applied twice or lost.
//
// Thread safety: every method is safe to call concurrently. One mutex guards
// the whole shard, so applies, pulls and clock changes of one segment on one
// server are serialised while other segments proceed independently (a large
// apply may run on the apply pool's threads too, within the caller's hold).
// Completions run after the mutex is released, on the thread of the call
// that made them ready, exactly once each.
#ifndef SEGPS_SERVER_SEGMENT_SHARD_H_
#define SEGPS_SERVER_SEGMENT_SHARD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/balance.h"
#include "common/clock.h"
#include "common/shard_map.h"
#include "common/sync.h"
#include "common/tensor_wire.h"
#include "segps/v1/parameter_server.pb.h"
#include "server/apply_pool.h"
#include "server/checkpoint.h"
#include "server/clock_table.h"
#include "server/cut_policy.h"
#include "server/optimizer.h"
#include "server/parked_calls.h"
#include "server/replica_log.h"
#include "server/share_planner.h"

namespace segps {

struct ShardOptions {
  int segment = 0;
  Range range;
  int32_t staleness = 0;           // -1: unbounded
  uint32_t max_clock_ahead = 8;    // how far a push or pull may run ahead of next_clock
  absl::Duration lease = absl::Seconds(3);
  // Worker pulls return values moved on by the optimizer's drift over the
  // updates expected before the puller's gradient lands (see Pull).
  bool momentum_lookahead = false;
  // Threads a large push's update is split over (null: the handler's only).
  // Must outlive the shard.
  ApplyPool* apply_pool = nullptr;
  Clock* clock = Clock::Real();  // must outlive the shard
  // Synchronous training (staleness 0, set by the server): a push of clock
  // c waits while a worker that joined at c (or a placeholder there) has
  // not pulled yet, so that its step sees only the clocks below c.
  bool hold_for_joiners = false;
  // The ranks the segment is configured with. Its first registration keeps
  // a placeholder at clock 0 for each other rank, live for one lease, so
  // that workers started moments apart all start at clock 0 (0: none).
  uint32_t ranks = 0;
  // Calls one worker may have parked at once (a worker has a pull and a
  // few pushes or chunks in flight); more are refused with
  // RESOURCE_EXHAUSTED, so no caller can fill a server's memory with them.
  uint32_t max_waiting_per_worker = 64;
  // Cut a checkpoint at multiples of this segment clock (0: never), unless
  // the last one is less than checkpoint_interval old.
  uint32_t checkpoint_every = 0;
  absl::Duration checkpoint_interval;
  // Balanced training (training.balance): pushes are weighted by their
  // samples against batch_size (0: unweighted). On the segment's deciding
  // server (server 0), `balance` is set: the shares start at `initial`, and
  // at every multiple of every_clocks of the segment clock T new ones are
  // decided from the workers' reported throughput, in effect from T + lead.
  uint32_t batch_size = 0;
  using Balance = SharePlanner::Options;
  std::optional<Balance> balance;
  // The server's embedding rows budget, shared by its shards; must outlive
  // the shard (null: no tables).
  RowBudget* row_budget = nullptr;
  // Takes each cut, under the shard's lock: it must only hand it on.
  std::function<void(std::shared_ptr<const ShardState>)> on_checkpoint;
  // cluster.replicas: where every push applied and every state replaced
  // goes, under the shard's lock and in order, for the range's backups; a
  // push's result names the record its acknowledgement waits for
  // (PushResult::replica_seq). Must outlive the shard (null: one copy).
  ReplicaLog* replicas = nullptr;
  // Whether on_checkpoint can take the cut at `clock` now; false while the
  // segment's previous cut still waits for the disk. The due cut then
  // waits, and the pushes at or past it with it (call CutRoomMade when
  // room is made): no cut clock is ever skipped, so every server holds
  // the same clocks and a recovery finds one they share. Null: always.
  std::function<bool(uint64_t clock)> cut_room;
};

// What Register decided.
struct Registered {
  uint64_t start_clock = 0;
  std::optional<uint64_t> rank_clock;  // the rank's own next clock, when the shard knew it
  bool partial = false;  // the rank's step rank_clock is partly applied
  uint64_t generation = 0;
};

class SegmentShard {
 public:
  // `initial` holds range.count values; `tables` are the segment's
  // embedding tables (server/embedding_table.h).
  SegmentShard(const ShardOptions& options, std::vector<float> initial, std::unique_ptr<Optimizer> optimizer,
               EmbeddingTables tables = {});

  // Registers worker `id` as `rank`, replacing any earlier registration of
  // that rank (their ids go to `replaced`). Returns the clock the worker
  // starts at: `join_clock` if given, else the segment clock, or the rank's
  // own next clock if the shard knew the rank and it is further (or no
  // other worker is live: peers that finished do not skip its steps).
  // Without a join_clock that start is a proposal: a rank the shard knew
  // stays at its own clock until a registration with join_clock (the
  // servers' agreement) moves it. A join_clock below the rank's clock only
  // lets the worker pull from there: its pushes below the rank's clock are
  // acknowledged, not applied again.
  // A rank held by another live registration (within its lease, and
  // connected: not every stream that carried its calls has ended) is
  // refused with UNAVAILABLE naming it, unless that registration is
  // `replaces` (the caller's own, checked by the caller).
  absl::StatusOr<Registered> Register(uint64_t id, uint32_t rank, std::optional<uint64_t> join_clock,
                                      std::vector<uint64_t>* replaced = nullptr,
                                      std::optional<uint64_t> replaces = std::nullopt);
  // A stream began (`open`) or ended carrying the calls of worker `id`.
  void Streamed(uint64_t id, bool open);
  // The furthest clock a join_clock may name: the highest any rank reached
  // here, plus how far a push may run ahead (another server may have taken
  // that many more of a rank's pushes). Beyond it, joining would skip steps
  // no worker computed.
  uint64_t FurthestJoin();

  // Replaces values, optimizer state and clocks with `state`, as described
  // above, if the segment is still at `generation` (nullopt: whatever it
  // is). Returns whether it did; `dropped` gets the ids of the
  // registrations dropped, whose parked calls fail with NOT_FOUND.
  bool Restore(const ShardState& state, std::optional<uint64_t> generation, std::vector<uint64_t>* dropped);
  // Replaces values, optimizer state and clocks with a backup's copy of the
  // range (cluster.replicas; checked by the caller against the range): as
  // Restore, but each rank is held at its own position in the copy, so that
  // nothing a backup acknowledged is lost.
  void TakeBack(const v1::RangeState& copy);
  // Failover's hand-back (server/failover.h): the range's state now, as a
  // record. Every registration ends with it, and every call from then on
  // is answered UNAVAILABLE with `why`: nothing changes the range after.
  v1::ReplicaRecord HandOver(const std::string& why);
  uint64_t generation();
  // Rank `rank`'s next clock here, and whether that step is partly
  // applied (a rank with no worker yet: the clock the segment restored or
  // started at).
  std::pair<uint64_t, bool> RankPosition(uint32_t rank);
  // Whether the segment holds exactly its checkpoint of `clock`: restored
  // (or rolled back) there, no push begun since, and every rank at `clock`.
  // A rollback to it would change nothing but drop registrations.
  bool AtRest(uint64_t clock);

  // Reads elements [first, first + count) of the range through `read` and
  // completes once the staleness bound allows a worker at `clock` to compute
  // (id 0: a reader, which never waits). UNAVAILABLE when `deadline` passes
  // first, naming the worker it waited for. With momentum_lookahead a
  // worker gets the values the optimizer's drift would reach after the
  // updates expected before its gradient for `clock` lands: its own steps
  // not yet applied, times the live workers (peers step at about its pace).
  // With `read_rows`, the pull also reads embedding rows from the tables
  // (count may then be 0: rows only, at the segment clock's bound).
  void Pull(uint64_t id, uint64_t clock, uint64_t first, uint64_t count, absl::Time deadline, ReadRange read,
            PullDone done, ReadRows read_rows = nullptr);

  // Applies `grad` (finite values, checked by the caller; it must stay valid
  // until `done` runs) to the elements from `first` of the range, as the
  // worker's step `clock` or a chunk of it. A push or chunk that arrives
  // ahead of its predecessor waits for it until `deadline`. With `read`, the
  // same operation then pulls the same elements for clock + 1 (as Pull, into
  // the result's `pulled`): a synchronous step's round trip.
  // `info.samples` scales the update's learning rate by samples /
  // batch_size (0 samples: the step counts, the values stay).
  // `rows` (a step's first message only; kept valid until `done`): the
  // step's embedding row gradients, applied with it or not at all (a row
  // that would turn non-finite, or more rows than the server's budget,
  // refuses the whole push).
  void Push(uint64_t id, uint64_t clock, uint64_t first, const DenseView* grad, absl::Time deadline,
            ReadRange read, PushDone done, const PushInfo& info = {},
            const std::vector<RowGradients>* rows = nullptr);

  // The deciding server of a balanced segment: the shares from `clock` on
  // (a registration's start clock). Nullopt elsewhere.
  std::optional<v1::SharePlan> PlanFrom(uint64_t clock);

  // Expires leases and fails the waits whose deadline has passed, at the
  // clock's time. A waiting worker's lease is renewed: it is alive.
  void Tick();
  // The disk took the segment's previous cut: a cut that waited is taken
  // now, and the pushes held behind it go on.
  void CutRoomMade();

  // Early stopping: the segment's clocks per epoch, alike for every rank
  // (INVALID_ARGUMENT naming both otherwise); its epoch ends are cut too.
  absl::Status SetEpochClocks(uint64_t epoch_clocks);
  // Early stopping: ends the segment at `state`, its checkpoint of the best
  // epoch's end. Every registration is dropped (their ids into `dropped`),
  // waiting and later calls are answered OUT_OF_RANGE with `why`, and the
  // state is cut as the segment's final one.
  void EndAt(const ShardState& state, const std::string& why, std::vector<uint64_t>* dropped);
  // The clock EndAt ended the segment at, once it did.
  std::optional<uint64_t> EndedAt();
  // Early stopping's epoch length (0: none given).
  uint64_t EpochClocks();
  // Fails every waiting call with UNAVAILABLE (`why`) and refuses to park
  // new ones: a server that is shutting down answers rather than waits.
  void Drain(const std::string& why);
  // Parks calls again after Drain.
  void Reopen();
  // Calls parked now (tests observe that a call waits).
  size_t Waiting();

  // The lowest rank below `ranks` that no live worker holds (a placeholder
  // holds none), if any.
  std::optional<uint32_t> FreeRank(uint32_t ranks);

  // Renews a lease; false when the worker is unknown here or no longer live.
  bool Renew(uint64_t id);
  // Removes a worker: the steps of its rank applied here (its next clock);
  // nothing when it is unknown here.
  std::optional<uint64_t> Leave(uint64_t id);

  // The shard's counters and workers as of the last Tick: reads, changes nothing.
  void FillStats(v1::SegmentStats* stats, google::protobuf::RepeatedPtrField<v1::WorkerStats>* workers);
  const ShardOptions& options() const { return options_; }

  // Copies the current values (tests, tools).
  std::vector<float> Snapshot();
  // The digest of values, optimizer state and update count that a backup's
  // copy of the range gives when it holds the same (ReplicaRange::Digest).
  std::string Digest();
  // Backup `backup`'s link (re)opened: its records start again from the
  // range's whole state (ReplicaLog::Restart). Nothing without replicas.
  void SyncReplica(uint32_t backup);

 private:
  using Worker = ClockTable::Worker;


  using Completions = std::vector<absl::AnyInvocable<void() &&>>;

  // The parts of Pull and Push, under the lock: each completes `waiter`
  // into `ready` or parks it.
  void StartPull(std::unique_ptr<Waiter> waiter, absl::Time now, Completions* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartPush(std::unique_ptr<Waiter> waiter, absl::Time now, Completions* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a worker may compute `clock` with elements [0, end) as they are.
  bool BoundAllows(uint64_t clock, uint64_t end) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the waiter's elements and completes it.
  void FinishPull(std::unique_ptr<Waiter> waiter, absl::Time now, Completions* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies a push whose turn it is (the worker's next clock and element),
  // or refuses one the optimizer does not admit (it could make the values
  // or the state infinite), changing nothing.
  absl::StatusOr<PushResult> Apply(Worker* w, const Waiter& push) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Computes a push's embedding rows as update `step` (nothing stored yet):
  // an error if one would not be finite or the budget cannot take the new ones.
  absl::Status UpdateRows(const std::vector<RowGradients>& rows, uint64_t step, float scale)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resumes every parked call the current state allows, until none is left.
  void Resume(absl::Time now, Completions* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails `waiter` with `status` into `ready`, taking it. A reference, so
  // that a caller may build `status` from the waiter in the same call:
  // arguments are evaluated in no fixed order, and a by-value parameter
  // could take the waiter first.
  static void Fail(std::unique_ptr<Waiter>&& waiter, absl::Status status, Completions* ready);
  // Fails the parked calls of worker `id` (replaced or gone).
  void FailWaitsOf(uint64_t id, Completions* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Marks workers whose lease ran out as not live (renewing waiting ones first).
  void ExpireLeases(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE if another live, connected registration holds `rank`.
  absl::Status Held(uint32_t rank, std::optional<uint64_t> replaces, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a worker, failing its parked calls; the worker after it.
  ClockTable::Workers::iterator Erase(ClockTable::Workers::iterator it, Completions* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The segment clock a pull for `clock` needs under the staleness bound.
  uint64_t Needed(uint64_t clock) const;
  absl::Status BehindBound(uint64_t clock) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool AppliedBefore(const Worker& w, const Waiter& push);
  // The answer to a push applied before (a retry).
  static PushResult Acknowledged(const Worker& w);
  static absl::Status Skipped(const Worker& w, const Waiter& push);
  // Why a parked push of `w` is still waiting at its deadline.
  absl::Status Late(const Worker& w, const Waiter& push) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes a push (applied now or before), or goes on to its pull.
  void AfterPush(std::unique_ptr<Waiter> waiter, Worker* w, const PushResult& result, absl::Time now,
                 Completions* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The range's whole state as a record for its backups.
  v1::ReplicaRecord StateRecord() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands an applied push (update `step`, rate times `scale`) to the backups.
  void Replicate(const Worker& w, const Waiter& push, uint64_t step, float scale)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decides new shares if the segment clock has reached the next decision.
  void MaybeRebalance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts a checkpoint if the segment clock has reached the next one.
  void MaybeCheckpoint(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Cut(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces the state with `state`'s: waiting calls fail with `gone`, and
  // every registration is dropped (their ids into `dropped`).
  void Replace(const ShardState& state, const absl::Status& gone, std::vector<uint64_t>* dropped,
               Completions* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `rank` at `clock`, live for one lease from `now`, until a worker registers it.
  Worker* AddPlaceholder(uint32_t rank, uint64_t clock, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With hold_for_joiners, whether `push` must wait for a peer that joined at its
  // clock (or a placeholder's rank) to pull that clock first, so that the
  // peer's step sees none of the clock's updates.
  bool WaitsForPeers(const Waiter& push) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `push` must wait for the checkpoint cut before its clock.
  bool WaitsForCut(const Waiter& push) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Updates expected before live worker `id`'s gradient for `clock` lands:
  // its steps not yet applied, times the live workers.
  uint64_t UpdatesAhead(uint64_t id, uint64_t clock) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Worker*> FindLive(uint64_t id, absl::Time now, const char* call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardOptions options_;

  Mutex mu_;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);
  std::vector<float> drifted_ ABSL_GUARDED_BY(mu_);  // a lookahead pull's values
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  EmbeddingTables tables_ ABSL_GUARDED_BY(mu_);
  // The workers, their clocks and which are live.
  ClockTable clocks_ ABSL_GUARDED_BY(mu_);
  uint64_t steps_begun_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pulls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration blocked_ ABSL_GUARDED_BY(mu_);
  // Parked pulls (and pushes' pulls) by the segment clock they need; parked pushes.
  ParkedCalls parked_ ABSL_GUARDED_BY(mu_);
  std::string draining_ ABSL_GUARDED_BY(mu_);  // why calls no longer wait, once set
  std::string ended_ ABSL_GUARDED_BY(mu_);     // why the segment stopped early, once it did
  std::string handed_over_ ABSL_GUARDED_BY(mu_);  // why the range is served elsewhere, once it is
  std::optional<uint64_t> ended_at_ ABSL_GUARDED_BY(mu_);
  CutPolicy cuts_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t restored_clock_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint64_t> restored_steps_ ABSL_GUARDED_BY(mu_);  // steps_begun_ as restored; unset: never
  uint64_t next_placeholder_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // a registration or a restore happened
  // The first push since the placeholders were placed (registrations began,
  // or a restore): their lease runs from it, not from when they were placed.
  std::optional<absl::Time> moved_at_ ABSL_GUARDED_BY(mu_);
  // The deciding server of a balanced segment: its shares.
  std::optional<SharePlanner> planner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace segps

#endif  // SEGPS_SERVER_SEGMENT_SHARD_H_
