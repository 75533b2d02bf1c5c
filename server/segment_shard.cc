// SegmentShard: its workers, clocks and leases, registration and restore,
// checkpoint cuts and share decisions, stats. The data path (parked calls,
// pulls, pushes, applying updates) is in segment_shard_calls.cc.
#include "server/segment_shard.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/staleness.h"
#include "common/status_macros.h"
#include "server/replica_range.h"

namespace segps {

SegmentShard::SegmentShard(const ShardOptions& options, std::vector<float> initial,
                           std::unique_ptr<Optimizer> optimizer, EmbeddingTables tables)
    : options_(options),
      values_(std::move(initial)),
      optimizer_(std::move(optimizer)),
      tables_(std::move(tables)),
      parked_(options.segment, options.max_waiting_per_worker),
      cuts_(options.checkpoint_every, options.checkpoint_interval) {
  if (options_.balance.has_value()) planner_.emplace(options_.segment, *options_.balance);
  optimizer_->Bound(values_);
}

bool SegmentShard::WaitsForPeers(const Waiter& push) const {
  if (!options_.hold_for_joiners) return false;
  // The pusher itself counts as pulled (StartPush).
  return clocks_.AnyUnpulledAt(push.clock);
}

void SegmentShard::ExpireLeases(absl::Time now) {
  // A worker waiting on its peers is alive: its lease runs while it waits.
  for (uint64_t id : parked_.Waiting()) {
    ClockTable::Worker* w = clocks_.Find(id);
    if (w != nullptr && w->live) w->last_seen = now;
  }
  // A placeholder's lease runs from the segment's first push: until then
  // its peers have not gone on without it, however long they waited.
  const absl::Time moved = moved_at_.value_or(now);
  for (auto& [id, w] : clocks_.workers()) {
    const absl::Time seen = id >= kPlaceholder ? std::max(w.last_seen, moved) : w.last_seen;
    if (w.live && seen + options_.lease <= now) clocks_.SetLive(&w, false);
  }
}

ClockTable::Workers::iterator SegmentShard::Erase(ClockTable::Workers::iterator it, Completions* ready) {
  const uint64_t id = it->first;
  auto next = clocks_.Erase(it);
  FailWaitsOf(id, ready);
  return next;
}

uint64_t SegmentShard::Needed(uint64_t clock) const { return ClockNeeded(clock, options_.staleness); }

bool SegmentShard::BoundAllows(uint64_t clock, uint64_t end) const {
  const uint64_t needed = Needed(clock);
  return clocks_.SegmentClock() >= needed || clocks_.ClockOf(end, options_.range.count) >= needed;
}

absl::Status SegmentShard::BehindBound(uint64_t clock) const {
  return absl::UnavailableError(absl::StrCat(
      "Pull: segment ", options_.segment, " clock ", clocks_.SegmentClock(), " is below ", Needed(clock),
      " needed for clock ", clock, " with staleness ", options_.staleness, "; waiting for ", clocks_.Laggard()));
}

absl::StatusOr<SegmentShard::Worker*> SegmentShard::FindLive(uint64_t id, absl::Time now,
                                                             const char* call) {
  Worker* found = clocks_.Find(id);
  if (found == nullptr && !handed_over_.empty()) {
    return absl::UnavailableError(absl::StrCat(call, ": ", handed_over_));
  }
  if (found == nullptr && !ended_.empty()) return absl::OutOfRangeError(absl::StrCat(call, ": ", ended_));
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat(call, ": worker ", id, " is not registered for segment ",
                                            options_.segment, "; call Register first"));
  }
  Worker& w = *found;
  if (w.live && w.last_seen + options_.lease <= now) clocks_.SetLive(&w, false);
  if (!w.live) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, ": worker ", id, " (segment ", options_.segment, " rank ", w.rank,
                     ") lost its lease (no call for ", absl::FormatDuration(options_.lease),
                     "); register again to rejoin"));
  }
  w.last_seen = now;
  return &w;
}

void SegmentShard::Fail(std::unique_ptr<Waiter>&& failed, absl::Status status, Completions* ready) {
  const std::unique_ptr<Waiter> waiter = std::move(failed);
  if (waiter->pull_done) {
    ready->push_back([done = std::move(waiter->pull_done), status]() mutable { std::move(done)(std::move(status)); });
  } else {
    ready->push_back([done = std::move(waiter->push_done), status]() mutable { std::move(done)(std::move(status)); });
  }
}

void SegmentShard::FailWaitsOf(uint64_t id, Completions* ready) {
  ParkedCalls::Released calls = parked_.ReleaseOf(id);
  for (auto [waiters, call] : {std::pair{&calls.pulls, "Pull"}, std::pair{&calls.pushes, "Push"}}) {
    for (std::unique_ptr<Waiter>& waiter : *waiters) {
      Fail(std::move(waiter),
           absl::FailedPreconditionError(absl::StrCat(call, ": worker ", id, " was replaced or left while waiting")),
           ready);
    }
  }
}

absl::Status SegmentShard::Held(uint32_t rank, std::optional<uint64_t> replaces, absl::Time now) const {
  for (const auto& [id, w] : clocks_.workers()) {
    if (w.rank != rank || id >= kPlaceholder || !w.live || id == replaces) continue;
    if (w.streamed && w.streams == 0) continue;  // its connection is gone: the process died
    return absl::UnavailableError(absl::StrCat(
        "Register: rank ", rank, " of segment ", options_.segment, " is held by worker ", id,
        ", live (its last call ", absl::FormatDuration(now - w.last_seen), " ago, lease ",
        absl::FormatDuration(options_.lease), ") and connected; it is taken over when that worker leaves, "
        "disconnects or its lease lapses (two workers started with the same rank?)"));
  }
  return absl::OkStatus();
}

void SegmentShard::Streamed(uint64_t id, bool open) {
  MutexLock lock(&mu_);
  Worker* w = clocks_.Find(id);
  if (w == nullptr) return;  // replaced or gone meanwhile
  w->streamed = true;
  w->streams = open ? w->streams + 1 : std::max<uint32_t>(w->streams, 1) - 1;
}

absl::StatusOr<Registered> SegmentShard::Register(uint64_t id, uint32_t rank, std::optional<uint64_t> join_clock,
                                                  std::vector<uint64_t>* replaced,
                                                  std::optional<uint64_t> replaces) {
  Completions ready;
  Registered out;
  {
    MutexLock lock(&mu_);
    if (!handed_over_.empty()) return absl::UnavailableError(handed_over_);
    if (!ended_.empty()) return absl::OutOfRangeError(ended_);
    const absl::Time now = options_.clock->Now();
    ExpireLeases(now);
    SEGPS_RETURN_IF_ERROR(Held(rank, replaces, now));
    if (!started_) {
      started_ = true;
      for (uint32_t r = 0; r < options_.ranks; ++r) {
        if (r != rank) AddPlaceholder(r, 0, now)->never_held = true;
      }
    }
    // Taken before the rank's registrations go: a live one holds it back.
    const uint64_t segment_clock = clocks_.SegmentClock();
    std::optional<Worker> previous;  // the rank's furthest registration, if any
    for (auto it = clocks_.workers().begin(); it != clocks_.workers().end();) {
      if (it->second.rank != rank) {
        ++it;
        continue;
      }
      // A rank only held for its first worker is that worker's to start
      // afresh: reported as known here, it would look like a step applied
      // on this server and not on one where the worker registered first.
      if (!it->second.never_held && (!previous.has_value() || it->second.next_clock > previous->next_clock)) {
        previous = it->second;
      }
      if (replaced != nullptr) replaced->push_back(it->first);
      it = Erase(it, &ready);
    }
    Worker& w = clocks_.Add(id);
    w.rank = rank;
    uint64_t clock = 0;
    if (previous.has_value()) {
      out.rank_clock = previous->next_clock;
      out.partial = previous->applied != 0;
      // Peers that moved on without it set the pace; with none left (they
      // finished) the rank still owes its own steps.
      out.start_clock = join_clock.value_or(clocks_.live() == 0 ? previous->next_clock
                                                                : std::max(previous->next_clock, segment_clock));
      // Only a clock the servers agreed on (join_clock) moves the rank on:
      // a proposal recorded here would skip, on this server alone, steps
      // that another applied.
      clock = std::max(previous->next_clock, join_clock.value_or(0));
      w.applied = clock == previous->next_clock ? previous->applied : 0;
      w.step = previous->step;
    } else {
      out.start_clock = join_clock.value_or(segment_clock);
      clock = out.start_clock;
    }
    out.generation = generation_;
    // It may pull from its start, or from its own clock while the start is
    // only proposed.
    w.last_pull_clock = std::min(out.start_clock, clock);
    w.last_seen = now;
    clocks_.Start(&w, clock);
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
  return out;
}

uint64_t SegmentShard::FurthestJoin() {
  MutexLock lock(&mu_);
  return clocks_.Highest() + options_.max_clock_ahead;
}

bool SegmentShard::Restore(const ShardState& state, std::optional<uint64_t> generation,
                           std::vector<uint64_t>* dropped) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    if (generation.has_value() && *generation != generation_) return false;
    const absl::Time now = options_.clock->Now();
    Replace(state, absl::NotFoundError(absl::StrCat("segment ", options_.segment,
                                                   " was rolled back to its checkpoint at clock ", state.clock,
                                                   "; register again")),
            dropped, &ready);
    cuts_.Taken(state.clock, state.updates, now);
    started_ = true;
    moved_at_.reset();
    for (uint32_t rank : state.ranks) AddPlaceholder(rank, state.clock, now);
  }
  for (auto& complete : ready) std::move(complete)();
  return true;
}

void SegmentShard::TakeBack(const v1::RangeState& copy) {
  ShardState state;
  state.clock = std::numeric_limits<uint64_t>::max();
  for (const v1::RankPosition& at : copy.ranks()) state.clock = std::min(state.clock, at.next_clock());
  if (copy.ranks().empty()) state.clock = 0;
  state.steps = copy.steps();
  state.updates = copy.updates();
  state.values = FloatsOf(copy.values());
  for (const v1::TensorSlice& slot : copy.slots()) state.slots.push_back(FloatsOf(slot));
  Completions ready;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    Replace(state, absl::NotFoundError("the segment was taken back from its backup; register again"), nullptr,
            &ready);
    cuts_.Taken(state.clock, state.updates, now);
    started_ = true;
    moved_at_.reset();
    for (const v1::RankPosition& at : copy.ranks()) {
      AddPlaceholder(at.rank(), at.next_clock(), now)->applied = at.applied();
    }
  }
  for (auto& complete : ready) std::move(complete)();
}

v1::ReplicaRecord SegmentShard::HandOver(const std::string& why) {
  Completions ready;
  v1::ReplicaRecord state;
  {
    MutexLock lock(&mu_);
    state = StateRecord();
    const absl::Status gone = absl::UnavailableError(why);
    for (std::unique_ptr<Waiter>& waiter : parked_.ReleaseAll()) Fail(std::move(waiter), gone, &ready);
    clocks_.Reset(0);
    handed_over_ = why;
  }
  for (auto& complete : ready) std::move(complete)();
  return state;
}

absl::Status SegmentShard::SetEpochClocks(uint64_t epoch_clocks) {
  MutexLock lock(&mu_);
  if (cuts_.epoch() != 0 && cuts_.epoch() != epoch_clocks) {
    return absl::InvalidArgumentError(absl::StrCat("Register: epoch_clocks ", epoch_clocks, " differs from the ",
                                                   cuts_.epoch(), " other workers of segment ", options_.segment,
                                                   " gave; its ranks must agree on the epoch's length"));
  }
  cuts_.set_epoch(epoch_clocks);
  return absl::OkStatus();
}

void SegmentShard::EndAt(const ShardState& state, const std::string& why, std::vector<uint64_t>* dropped) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    Replace(state, absl::OutOfRangeError(why), dropped, &ready);
    ended_ = why;
    ended_at_ = state.clock;
    Cut(options_.clock->Now());  // no rank is live: none waits to resume there
  }
  for (auto& complete : ready) std::move(complete)();
}

std::optional<uint64_t> SegmentShard::EndedAt() {
  MutexLock lock(&mu_);
  return ended_at_;
}

uint64_t SegmentShard::EpochClocks() {
  MutexLock lock(&mu_);
  return cuts_.epoch();
}

void SegmentShard::Replace(const ShardState& state, const absl::Status& gone, std::vector<uint64_t>* dropped,
                           Completions* ready) {
  for (std::unique_ptr<Waiter>& waiter : parked_.ReleaseAll()) Fail(std::move(waiter), gone, ready);
  for (const auto& [id, w] : clocks_.workers()) {
    if (id < kPlaceholder && dropped != nullptr) dropped->push_back(id);
  }
  clocks_.Reset(state.clock);
  values_ = state.values;
  optimizer_->LoadState(state.slots);
  optimizer_->Bound(values_);
  for (size_t t = 0; t < tables_.size() && t < state.tables.size(); ++t) tables_[t]->Load(state.tables[t]);
  steps_begun_ = state.steps;
  pushes_ = state.updates;
  restored_clock_ = state.clock;
  restored_steps_ = state.steps;
  ++generation_;
  if (options_.replicas != nullptr) options_.replicas->Append(StateRecord());
}

v1::ReplicaRecord SegmentShard::StateRecord() {
  std::map<uint32_t, v1::RankPosition> ranks;
  for (const auto& [id, w] : clocks_.workers()) {
    v1::RankPosition& at = ranks[w.rank];
    if (at.next_clock() > w.next_clock) continue;  // a replaced registration behind the rank's
    at.set_rank(w.rank);
    at.set_next_clock(w.next_clock);
    at.set_applied(w.applied);
  }
  std::vector<std::vector<float>> slots;
  optimizer_->SaveState(&slots);
  v1::ReplicaRecord record;
  *record.mutable_state() = RangeStateOf(options_.range, steps_begun_, pushes_, ranks, values_, slots);
  return record;
}

void SegmentShard::SyncReplica(uint32_t backup) {
  MutexLock lock(&mu_);
  if (options_.replicas != nullptr) options_.replicas->Restart(backup, StateRecord());
}

std::string SegmentShard::Digest() {
  MutexLock lock(&mu_);
  std::vector<std::vector<float>> slots;
  optimizer_->SaveState(&slots);
  return RangeDigest(steps_begun_, values_, slots);
}

SegmentShard::Worker* SegmentShard::AddPlaceholder(uint32_t rank, uint64_t clock, absl::Time now) {
  Worker& w = clocks_.Add(kPlaceholder + next_placeholder_++);
  w.rank = rank;
  w.last_pull_clock = clock;
  w.last_seen = now;
  clocks_.Start(&w, clock);
  return &w;
}

uint64_t SegmentShard::generation() {
  MutexLock lock(&mu_);
  return generation_;
}

std::pair<uint64_t, bool> SegmentShard::RankPosition(uint32_t rank) {
  MutexLock lock(&mu_);
  std::optional<std::pair<uint64_t, bool>> furthest;
  for (const auto& [id, w] : clocks_.workers()) {
    if (w.rank != rank || w.never_held) continue;
    if (!furthest.has_value() || w.next_clock > furthest->first) furthest = {w.next_clock, w.applied != 0};
  }
  return furthest.value_or(std::pair<uint64_t, bool>{restored_clock_, false});
}

bool SegmentShard::AtRest(uint64_t clock) {
  MutexLock lock(&mu_);
  if (restored_clock_ != clock || restored_steps_ != steps_begun_) return false;
  for (const auto& [id, w] : clocks_.workers()) {
    if (w.next_clock != clock || w.applied != 0) return false;
  }
  return true;
}

void SegmentShard::MaybeRebalance() {
  if (planner_.has_value() && clocks_.live() > 0) planner_->MaybeDecide(clocks_.SegmentClock());
}

std::optional<v1::SharePlan> SegmentShard::PlanFrom(uint64_t clock) {
  MutexLock lock(&mu_);
  if (!planner_.has_value()) return std::nullopt;
  v1::SharePlan plan;
  planner_->Fill(clock, clocks_.SegmentClock(), &plan);
  return plan;
}

void SegmentShard::MaybeCheckpoint(absl::Time now) {
  if (clocks_.live() == 0 || !cuts_.Due(clocks_.SegmentClock(), now)) return;
  if (options_.cut_room && !options_.cut_room(cuts_.next())) return;  // waits for the disk
  Cut(now);
}

void SegmentShard::CutRoomMade() {
  Completions ready;
  {
    MutexLock lock(&mu_);
    Resume(options_.clock->Now(), &ready);
  }
  for (auto& complete : ready) std::move(complete)();
}

void SegmentShard::Cut(absl::Time now) {
  auto state = std::make_shared<ShardState>();
  state->clock = clocks_.SegmentClock();
  state->steps = steps_begun_;
  state->updates = pushes_;
  for (const auto& [id, w] : clocks_.workers()) {
    if (w.live) state->ranks.push_back(w.rank);
  }
  std::sort(state->ranks.begin(), state->ranks.end());
  state->values = values_;
  optimizer_->SaveState(&state->slots);
  for (const auto& table : tables_) state->tables.push_back(table->Save());
  state->epoch_clocks = cuts_.epoch();
  cuts_.Taken(state->clock, pushes_, now);
  if (options_.on_checkpoint) options_.on_checkpoint(std::move(state));
}

void SegmentShard::Tick() {
  Completions ready;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    ExpireLeases(now);
    ParkedCalls::Released expired = parked_.ReleaseExpired(now);
    for (std::unique_ptr<Waiter>& pull : expired.pulls) {
      blocked_ += now - pull->since;
      absl::Status behind = BehindBound(pull->clock);
      Fail(std::move(pull), std::move(behind), &ready);
    }
    for (std::unique_ptr<Waiter>& push : expired.pushes) {
      absl::Status late = Late(*clocks_.Find(push->id), *push);
      Fail(std::move(push), std::move(late), &ready);
    }
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
}

void SegmentShard::Drain(const std::string& why) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    draining_ = why;
    for (std::unique_ptr<Waiter>& waiter : parked_.ReleaseAll()) {
      Fail(std::move(waiter), absl::UnavailableError(why), &ready);
    }
  }
  for (auto& complete : ready) std::move(complete)();
}

void SegmentShard::Reopen() {
  MutexLock lock(&mu_);
  draining_.clear();
}

size_t SegmentShard::Waiting() {
  MutexLock lock(&mu_);
  return parked_.size();
}

std::optional<uint32_t> SegmentShard::FreeRank(uint32_t ranks) {
  Completions ready;
  std::optional<uint32_t> free;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    ExpireLeases(now);
    std::vector<bool> taken(ranks, false);
    for (const auto& [id, w] : clocks_.workers()) {
      // A placeholder's rank is free: it waits for whichever worker takes it.
      if (w.live && id < kPlaceholder && w.rank < ranks) taken[w.rank] = true;
    }
    for (uint32_t r = 0; r < ranks && !free.has_value(); ++r) {
      if (!taken[r]) free = r;
    }
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
  return free;
}

bool SegmentShard::Renew(uint64_t id) {
  Completions ready;
  bool live = false;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    live = FindLive(id, now, "Heartbeat").ok();
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
  return live;
}

std::optional<uint64_t> SegmentShard::Leave(uint64_t id) {
  Completions ready;
  uint64_t applied = 0;
  {
    MutexLock lock(&mu_);
    auto it = clocks_.workers().find(id);
    if (it == clocks_.workers().end()) return std::nullopt;
    applied = it->second.next_clock;
    Erase(it, &ready);
    const absl::Time now = options_.clock->Now();
    // The segment's last worker is done: its final state is a cut too.
    if (cuts_.enabled() && clocks_.live() == 0 && cuts_.Behind(pushes_)) Cut(now);
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
  return applied;
}

void SegmentShard::FillStats(v1::SegmentStats* stats,
                             google::protobuf::RepeatedPtrField<v1::WorkerStats>* workers) {
  MutexLock lock(&mu_);
  stats->set_segment(options_.segment);
  stats->set_offset(options_.range.offset);
  stats->set_count(options_.range.count);
  stats->set_clock(clocks_.SegmentClock());
  stats->set_updates(pushes_);
  stats->set_pulls(pulls_);
  stats->set_pushes(pushes_);
  stats->set_blocked_us(absl::ToInt64Microseconds(blocked_));
  stats->set_generation(generation_);
  stats->set_restored_clock(restored_clock_);
  uint64_t rows = 0;
  for (const auto& table : tables_) rows += table->stored();
  stats->set_embedding_rows(rows);
  for (const auto& [id, w] : clocks_.workers()) {
    v1::WorkerStats* ws = workers->Add();
    ws->set_worker_id(id < kPlaceholder ? id : 0);
    ws->set_segment(options_.segment);
    ws->set_rank(w.rank);
    ws->set_next_clock(w.next_clock);
    ws->set_live(w.live);
  }
}

std::vector<float> SegmentShard::Snapshot() {
  MutexLock lock(&mu_);
  return values_;
}

}  // namespace segps
