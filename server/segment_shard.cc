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

namespace segps {
namespace {

// Ids of the placeholders a restore keeps for the ranks it expects back:
// no registration gets one (the server hands out ids from 1).
constexpr uint64_t kPlaceholder = 1ull << 63;

}  // namespace

SegmentShard::SegmentShard(const ShardOptions& options, std::vector<float> initial,
                           std::unique_ptr<Optimizer> optimizer)
    : options_(options),
      values_(std::move(initial)),
      optimizer_(std::move(optimizer)),
      parked_(options.segment, options.max_waiting_per_worker),
      cuts_(options.checkpoint_every, options.checkpoint_interval) {
  if (options_.balance.has_value()) planner_.emplace(options_.segment, *options_.balance);
}

void SegmentShard::SetLive(Worker* w, bool live) {
  if (w->live == live) return;
  w->live = live;
  if (live) {
    ++live_clocks_[w->next_clock];
    ++live_;
    if (!w->pulled) ++unpulled_[w->next_clock];
    return;
  }
  auto at = live_clocks_.find(w->next_clock);
  if (--at->second == 0) live_clocks_.erase(at);
  --live_;
  if (!w->pulled) {
    auto fresh = unpulled_.find(w->next_clock);
    if (--fresh->second == 0) unpulled_.erase(fresh);
  }
}

void SegmentShard::MarkPulled(Worker* w) {
  if (w->pulled) return;
  const bool live = w->live;
  SetLive(w, false);
  w->pulled = true;
  SetLive(w, live);
}

bool SegmentShard::WaitsForPeers(const Waiter& push) const {
  if (!options_.hold_for_joiners) return false;
  // The pusher itself counts as pulled (StartPush).
  return unpulled_.count(push.clock) > 0;
}

void SegmentShard::ExpireLeases(absl::Time now) {
  // A worker waiting on its peers is alive: its lease runs while it waits.
  for (uint64_t id : parked_.Waiting()) {
    auto it = workers_.find(id);
    if (it != workers_.end() && it->second.live) it->second.last_seen = now;
  }
  for (auto& [id, w] : workers_) {
    if (w.live && w.last_seen + options_.lease <= now) SetLive(&w, false);
  }
}

void SegmentShard::Erase(std::map<uint64_t, Worker>::iterator it, Completions* ready) {
  SetLive(&it->second, false);
  const uint64_t id = it->first;
  workers_.erase(it);
  FailWaitsOf(id, ready);
}

uint64_t SegmentShard::SegmentClock() const {
  return live_clocks_.empty() ? highest_clock_ : live_clocks_.begin()->first;
}

uint64_t SegmentShard::ClockOf(uint64_t end) const {
  if (end == 0 || end >= options_.range.count) return SegmentClock();
  uint64_t clock = std::numeric_limits<uint64_t>::max();
  for (const auto& [id, w] : workers_) {
    if (!w.live) continue;
    // A step partly applied counts for the elements its chunks already cover.
    clock = std::min(clock, w.next_clock + (w.applied >= end ? 1 : 0));
  }
  return clock == std::numeric_limits<uint64_t>::max() ? highest_clock_ : clock;
}

uint64_t SegmentShard::Needed(uint64_t clock) const { return ClockNeeded(clock, options_.staleness); }

bool SegmentShard::BoundAllows(uint64_t clock, uint64_t end) const {
  const uint64_t needed = Needed(clock);
  return SegmentClock() >= needed || ClockOf(end) >= needed;
}

std::string SegmentShard::Describe(uint64_t id, const Worker& w) {
  if (id >= kPlaceholder) return absl::StrCat("rank ", w.rank, ", expected back or to start");
  return absl::StrCat("worker ", id, " (rank ", w.rank, ")");
}

std::string SegmentShard::Laggard() const {
  const std::pair<const uint64_t, Worker>* laggard = nullptr;
  for (const auto& entry : workers_) {
    if (entry.second.live && (laggard == nullptr || entry.second.next_clock < laggard->second.next_clock)) {
      laggard = &entry;
    }
  }
  return laggard == nullptr ? "no worker" : Describe(laggard->first, laggard->second);
}

std::string SegmentShard::Unpulled(uint64_t clock, uint64_t except) const {
  for (const auto& [id, w] : workers_) {
    if (id != except && w.live && !w.pulled && w.next_clock == clock) return Describe(id, w);
  }
  return "no worker";
}

absl::Status SegmentShard::BehindBound(uint64_t clock) const {
  return absl::UnavailableError(absl::StrCat(
      "Pull: segment ", options_.segment, " clock ", SegmentClock(), " is below ", Needed(clock),
      " needed for clock ", clock, " with staleness ", options_.staleness, "; waiting for ", Laggard()));
}

absl::StatusOr<SegmentShard::Worker*> SegmentShard::FindLive(uint64_t id, absl::Time now,
                                                             const char* call) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat(call, ": worker ", id, " is not registered for segment ",
                                            options_.segment, "; call Register first"));
  }
  Worker& w = it->second;
  if (w.live && w.last_seen + options_.lease <= now) SetLive(&w, false);
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

Registered SegmentShard::Register(uint64_t id, uint32_t rank, std::optional<uint64_t> join_clock,
                                  std::vector<uint64_t>* replaced) {
  Completions ready;
  Registered out;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    ExpireLeases(now);
    if (!started_) {
      started_ = true;
      for (uint32_t r = 0; r < options_.ranks; ++r) {
        if (r != rank) AddPlaceholder(r, 0, now);
      }
    }
    // Taken before the rank's registrations go: a live one holds it back.
    const uint64_t segment_clock = SegmentClock();
    std::optional<Worker> previous;  // the rank's furthest registration, if any
    for (auto it = workers_.begin(); it != workers_.end();) {
      auto next = std::next(it);
      if (it->second.rank == rank) {
        if (!previous.has_value() || it->second.next_clock > previous->next_clock) previous = it->second;
        if (replaced != nullptr) replaced->push_back(it->first);
        Erase(it, &ready);
      }
      it = next;
    }
    Worker& w = workers_[id];
    w.rank = rank;
    if (previous.has_value()) {
      out.rank_clock = previous->next_clock;
      out.partial = previous->applied != 0;
      // Peers that moved on without it set the pace; with none left (they
      // finished) the rank still owes its own steps.
      out.start_clock = join_clock.value_or(live_ == 0 ? previous->next_clock
                                                       : std::max(previous->next_clock, segment_clock));
      w.next_clock = std::max(previous->next_clock, out.start_clock);
      w.applied = w.next_clock == previous->next_clock ? previous->applied : 0;
      w.step = previous->step;
    } else {
      out.start_clock = join_clock.value_or(segment_clock);
      w.next_clock = out.start_clock;
    }
    out.generation = generation_;
    w.last_pull_clock = out.start_clock;
    w.last_seen = now;
    w.live = false;
    SetLive(&w, true);
    highest_clock_ = std::max(highest_clock_, w.next_clock);
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
  return out;
}

bool SegmentShard::Restore(const ShardState& state, std::optional<uint64_t> generation,
                           std::vector<uint64_t>* dropped) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    if (generation.has_value() && *generation != generation_) return false;
    const absl::Status gone = absl::NotFoundError(
        absl::StrCat("segment ", options_.segment, " was rolled back to its checkpoint at clock ", state.clock,
                     "; register again"));
    for (std::unique_ptr<Waiter>& waiter : parked_.ReleaseAll()) Fail(std::move(waiter), gone, &ready);
    for (auto& [id, w] : workers_) {
      SetLive(&w, false);
      if (id < kPlaceholder && dropped != nullptr) dropped->push_back(id);
    }
    workers_.clear();
    values_ = state.values;
    optimizer_->LoadState(state.slots);
    steps_begun_ = state.steps;
    pushes_ = state.updates;
    highest_clock_ = restored_clock_ = state.clock;
    ++generation_;
    const absl::Time now = options_.clock->Now();
    cuts_.Taken(state.clock, state.updates, now);
    started_ = true;
    for (uint32_t rank : state.ranks) AddPlaceholder(rank, state.clock, now);
  }
  for (auto& complete : ready) std::move(complete)();
  return true;
}

void SegmentShard::AddPlaceholder(uint32_t rank, uint64_t clock, absl::Time now) {
  Worker& w = workers_[kPlaceholder + next_placeholder_++];
  w.rank = rank;
  w.next_clock = w.last_pull_clock = clock;
  w.last_seen = now;
  SetLive(&w, true);
  highest_clock_ = std::max(highest_clock_, clock);
}

uint64_t SegmentShard::generation() {
  MutexLock lock(&mu_);
  return generation_;
}

void SegmentShard::MaybeRebalance() {
  if (planner_.has_value() && live_ > 0) planner_->MaybeDecide(SegmentClock());
}

std::optional<v1::SharePlan> SegmentShard::PlanFrom(uint64_t clock) {
  MutexLock lock(&mu_);
  if (!planner_.has_value()) return std::nullopt;
  v1::SharePlan plan;
  planner_->Fill(clock, SegmentClock(), &plan);
  return plan;
}

void SegmentShard::MaybeCheckpoint(absl::Time now) {
  if (live_ > 0 && cuts_.Due(SegmentClock(), now)) Cut(now);
}

void SegmentShard::Cut(absl::Time now) {
  auto state = std::make_shared<ShardState>();
  state->clock = SegmentClock();
  state->steps = steps_begun_;
  state->updates = pushes_;
  for (const auto& [id, w] : workers_) {
    if (w.live) state->ranks.push_back(w.rank);
  }
  std::sort(state->ranks.begin(), state->ranks.end());
  state->values = values_;
  optimizer_->SaveState(&state->slots);
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
      absl::Status late = Late(workers_.at(push->id), *push);
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
    for (const auto& [id, w] : workers_) {
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

bool SegmentShard::Leave(uint64_t id) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return false;
    Erase(it, &ready);
    const absl::Time now = options_.clock->Now();
    // The segment's last worker is done: its final state is a cut too.
    if (cuts_.enabled() && live_ == 0 && cuts_.Behind(pushes_)) Cut(now);
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
  return true;
}

void SegmentShard::FillStats(v1::SegmentStats* stats,
                             google::protobuf::RepeatedPtrField<v1::WorkerStats>* workers) {
  MutexLock lock(&mu_);
  stats->set_segment(options_.segment);
  stats->set_offset(options_.range.offset);
  stats->set_count(options_.range.count);
  stats->set_clock(SegmentClock());
  stats->set_updates(pushes_);
  stats->set_pulls(pulls_);
  stats->set_pushes(pushes_);
  stats->set_blocked_us(absl::ToInt64Microseconds(blocked_));
  stats->set_generation(generation_);
  stats->set_restored_clock(restored_clock_);
  for (const auto& [id, w] : workers_) {
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
