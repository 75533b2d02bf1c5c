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

// Elements a part of a split update has at least: a helper thread takes
// tens of microseconds to wake, about what Adam takes over 64K elements.
constexpr uint64_t kMinPartElements = 1 << 16;

// Ids of the placeholders a restore keeps for the ranks it expects back:
// no registration gets one (the server hands out ids from 1).
constexpr uint64_t kPlaceholder = 1ull << 63;
// Share decisions a balanced segment remembers (a rollback may return to them).
constexpr int kMaxPlan = 4096;

// Parts to split an update of `count` elements into over `pool`.
size_t ApplyParts(const ApplyPool* pool, uint64_t count) {
  if (pool == nullptr) return 1;
  return static_cast<size_t>(std::clamp<uint64_t>(count / kMinPartElements, 1, pool->threads()));
}

// The first element of part `part` (of `parts`, over `count` elements).
uint64_t PartStart(uint64_t count, size_t parts, size_t part) { return count * part / parts; }

}  // namespace

SegmentShard::SegmentShard(const ShardOptions& options, std::vector<float> initial,
                           std::unique_ptr<Optimizer> optimizer)
    : options_(options), values_(std::move(initial)), optimizer_(std::move(optimizer)) {
  if (options_.balance.has_value()) {
    v1::Shares* first = plan_.add_shares();
    first->set_from_clock(0);
    for (uint32_t share : options_.balance->initial) first->add_samples(share);
    throughput_.assign(options_.balance->initial.size(), 0.0);
    next_decision_ = options_.balance->every_clocks;
  }
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
  std::vector<uint64_t> waiting;
  for (const auto& [needed, waiter] : pulls_waiting_) waiting.push_back(waiter->id);
  for (const auto& waiter : pushes_waiting_) waiting.push_back(waiter->id);
  for (uint64_t id : waiting) {
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
  for (auto it = pulls_waiting_.begin(); it != pulls_waiting_.end();) {
    if (it->second->id != id) {
      ++it;
      continue;
    }
    Fail(std::move(it->second),
         absl::FailedPreconditionError(absl::StrCat("Pull: worker ", id, " was replaced or left while waiting")),
         ready);
    it = pulls_waiting_.erase(it);
    Unparked(id);
  }
  for (auto it = pushes_waiting_.begin(); it != pushes_waiting_.end();) {
    if ((*it)->id != id) {
      ++it;
      continue;
    }
    Fail(std::move(*it),
         absl::FailedPreconditionError(absl::StrCat("Push: worker ", id, " was replaced or left while waiting")),
         ready);
    it = pushes_waiting_.erase(it);
    Unparked(id);
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
    for (auto& [needed, waiter] : pulls_waiting_) Fail(std::move(waiter), gone, &ready);
    pulls_waiting_.clear();
    for (auto& waiter : pushes_waiting_) Fail(std::move(waiter), gone, &ready);
    pushes_waiting_.clear();
    parked_.clear();
    for (auto& [id, w] : workers_) {
      SetLive(&w, false);
      if (id < kPlaceholder && dropped != nullptr) dropped->push_back(id);
    }
    workers_.clear();
    values_ = state.values;
    optimizer_->LoadState(state.slots);
    steps_begun_ = state.steps;
    pushes_ = cut_updates_ = state.updates;
    highest_clock_ = restored_clock_ = state.clock;
    ++generation_;
    const absl::Time now = options_.clock->Now();
    last_cut_ = now;
    next_cut_ = options_.checkpoint_every == 0 ? 0 : (state.clock / options_.checkpoint_every + 1) * options_.checkpoint_every;
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
  if (!options_.balance.has_value() || options_.balance->every_clocks == 0 || live_ == 0) return;
  const uint64_t clock = SegmentClock();
  if (clock < next_decision_) return;
  const ShardOptions::Balance& balance = *options_.balance;
  next_decision_ = (clock / balance.every_clocks + 1) * balance.every_clocks;
  const v1::Shares& now = *plan_.shares().rbegin();
  const std::vector<uint32_t> current(now.samples().begin(), now.samples().end());
  std::optional<std::vector<uint32_t>> next = Rebalance(current, throughput_, balance.least, balance.hysteresis);
  if (!next.has_value()) return;
  // Replies so far promised no change up to promised_through_ (FillPlan).
  const uint64_t from = std::max(clock + balance.lead, promised_through_ + 1);
  // After a rollback the segment clock is back below earlier decisions: this one replaces them.
  while (plan_.shares_size() > 1 && plan_.shares(plan_.shares_size() - 1).from_clock() >= from) {
    plan_.mutable_shares()->RemoveLast();
  }
  if (plan_.shares_size() >= kMaxPlan) plan_.mutable_shares()->DeleteSubrange(0, 1);
  v1::Shares* entry = plan_.add_shares();
  entry->set_from_clock(from);
  for (uint32_t share : *next) entry->add_samples(share);
  std::vector<std::string> speeds;
  for (double t : throughput_) speeds.push_back(absl::StrFormat("%.0f", t));
  SEGPS_LOG_INFO << "segment " << options_.segment << ": shares from clock " << from << ": "
                 << absl::StrJoin(*next, " ") << " samples (throughput " << absl::StrJoin(speeds, " ")
                 << " samples/s; were " << absl::StrJoin(current, " ") << ")";
}

void SegmentShard::FillPlan(uint64_t clock, v1::SharePlan* plan) {
  int first = 0;
  for (int i = 0; i < plan_.shares_size(); ++i) {
    if (plan_.shares(i).from_clock() <= clock) first = i;
  }
  for (int i = first; i < plan_.shares_size(); ++i) *plan->add_shares() = plan_.shares(i);
  // The next decision comes at a segment clock of at least this one.
  promised_through_ = std::max(promised_through_, SegmentClock() + options_.balance->lead - 1);
  plan->set_final_through(promised_through_);
}

std::optional<v1::SharePlan> SegmentShard::PlanFrom(uint64_t clock) {
  MutexLock lock(&mu_);
  if (!options_.balance.has_value()) return std::nullopt;
  v1::SharePlan plan;
  FillPlan(clock, &plan);
  return plan;
}

void SegmentShard::MaybeCheckpoint(absl::Time now) {
  if (options_.checkpoint_every == 0 || live_ == 0 || SegmentClock() < next_cut_) return;
  if (now - last_cut_ >= options_.checkpoint_interval) {
    Cut(now);
  } else {
    next_cut_ = (SegmentClock() / options_.checkpoint_every + 1) * options_.checkpoint_every;
  }
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
  last_cut_ = now;
  cut_updates_ = pushes_;
  if (options_.checkpoint_every > 0) {
    next_cut_ = (state->clock / options_.checkpoint_every + 1) * options_.checkpoint_every;
  }
  if (options_.on_checkpoint) options_.on_checkpoint(std::move(state));
}

absl::Status SegmentShard::Park(const Waiter& waiter, const char* call) {
  uint32_t& parked = parked_[waiter.id];
  if (parked >= options_.max_waiting_per_worker) {
    if (parked == 0) parked_.erase(waiter.id);
    return absl::ResourceExhaustedError(absl::StrCat(
        call, ": worker ", waiter.id, " already has ", options_.max_waiting_per_worker,
        " calls waiting on segment ", options_.segment, " (a worker has at most a few); this one is refused"));
  }
  ++parked;
  return absl::OkStatus();
}

void SegmentShard::Unparked(uint64_t id) {
  auto it = parked_.find(id);
  if (it != parked_.end() && --it->second == 0) parked_.erase(it);
}

bool SegmentShard::WaitsForCut(const Waiter& push) const {
  return options_.checkpoint_every > 0 && push.clock >= next_cut_;
}

void SegmentShard::Pull(uint64_t id, uint64_t clock, uint64_t first, uint64_t count, absl::Time deadline,
                        ReadRange read, PullDone done) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    auto waiter = std::make_unique<Waiter>(id, clock, first, count, deadline, std::move(read));
    waiter->pull_done = std::move(done);
    absl::Status valid;
    if (id != 0) {
      absl::StatusOr<Worker*> w = FindLive(id, now, "Pull");
      if (!w.ok()) {
        valid = w.status();
      } else if (clock < (*w)->last_pull_clock) {
        valid = absl::InvalidArgumentError(absl::StrCat("Pull: clock ", clock, " of worker ", id,
                                                        " goes backwards (last pull was for clock ",
                                                        (*w)->last_pull_clock, ")"));
      } else if (clock > (*w)->next_clock + options_.max_clock_ahead) {
        valid = absl::InvalidArgumentError(absl::StrCat(
            "Pull: clock ", clock, " of worker ", id, " skips ahead of its pushes (next push is clock ",
            (*w)->next_clock, ", at most ", options_.max_clock_ahead, " may be in flight)"));
      } else {
        (*w)->last_pull_clock = clock;
        MarkPulled(*w);
      }
    }
    if (valid.ok()) {
      StartPull(std::move(waiter), now, &ready);
      Resume(now, &ready);  // a first pull may free a peer's push (WaitsForPeers)
    } else {
      Fail(std::move(waiter), valid, &ready);
    }
  }
  for (auto& complete : ready) std::move(complete)();
}

void SegmentShard::StartPull(std::unique_ptr<Waiter> waiter, absl::Time now, Completions* ready) {
  waiter->since = now;
  if (waiter->id == 0 || BoundAllows(waiter->clock, waiter->first + waiter->count)) {
    FinishPull(std::move(waiter), now, ready);
  } else if (now >= waiter->deadline || !draining_.empty()) {
    absl::Status behind = draining_.empty() ? BehindBound(waiter->clock) : absl::UnavailableError(draining_);
    Fail(std::move(waiter), std::move(behind), ready);
  } else if (absl::Status full = Park(*waiter, "Pull"); !full.ok()) {
    Fail(std::move(waiter), std::move(full), ready);
  } else {
    const uint64_t needed = Needed(waiter->clock);
    pulls_waiting_.emplace(needed, std::move(waiter));
  }
}

void SegmentShard::FinishPull(std::unique_ptr<Waiter> waiter, absl::Time now, Completions* ready) {
  PullResult result;
  result.blocked = now - waiter->since;
  blocked_ += result.blocked;
  ++pulls_;
  const absl::Span<const float> values = absl::MakeConstSpan(values_).subspan(waiter->first, waiter->count);
  const uint64_t ahead =
      waiter->id != 0 && options_.momentum_lookahead ? UpdatesAhead(waiter->id, waiter->clock) : 0;
  if (ahead == 0) {
    waiter->read(values);
  } else {
    drifted_.resize(waiter->count);
    optimizer_->Extrapolate(steps_begun_, ahead, waiter->first, values, absl::MakeSpan(drifted_));
    waiter->read(drifted_);
  }
  result.clock = ClockOf(waiter->first + waiter->count);
  result.updates = pushes_;
  if (options_.balance.has_value() && waiter->id != 0) FillPlan(waiter->clock, &result.plan.emplace());
  if (waiter->pushed.has_value()) {
    PushResult pushed = *waiter->pushed;
    pushed.pulled = result;
    ready->push_back([done = std::move(waiter->push_done), pushed]() mutable { std::move(done)(pushed); });
  } else {
    ready->push_back([done = std::move(waiter->pull_done), result]() mutable { std::move(done)(result); });
  }
}

uint64_t SegmentShard::UpdatesAhead(uint64_t id, uint64_t clock) const {
  const uint64_t next = workers_.at(id).next_clock;
  return clock <= next ? 0 : (clock - next) * live_;
}

void SegmentShard::Push(uint64_t id, uint64_t clock, uint64_t first, const DenseView* grad, absl::Time deadline,
                        ReadRange read, PushDone done, const PushInfo& info) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    auto waiter = std::make_unique<Waiter>(id, clock, first, grad->count(), deadline, std::move(read));
    waiter->since = now;
    waiter->grad = grad;
    waiter->info = info;
    waiter->push_done = std::move(done);
    StartPush(std::move(waiter), now, &ready);
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
}

PushResult SegmentShard::Acknowledged(const Worker& w) {
  PushResult result;
  result.next_clock = w.next_clock;
  result.rank = w.rank;
  return result;
}

bool SegmentShard::AppliedBefore(const Worker& w, const Waiter& push) {
  // A retry of a step or chunk already applied is acknowledged, not re-applied.
  return push.clock < w.next_clock ||
         (push.clock == w.next_clock && push.first + push.count <= w.applied && push.count > 0);
}

void SegmentShard::StartPush(std::unique_ptr<Waiter> waiter, absl::Time now, Completions* ready) {
  absl::StatusOr<Worker*> found = FindLive(waiter->id, now, "Push");
  if (!found.ok()) return Fail(std::move(waiter), found.status(), ready);
  Worker* w = *found;
  // It computed a step on something: no longer a worker that just joined
  // (two that push without pulling must not wait for each other).
  MarkPulled(w);
  if (AppliedBefore(*w, *waiter)) {
    return AfterPush(std::move(waiter), w, Acknowledged(*w),
                     now, ready);
  }
  if (waiter->clock > w->next_clock + options_.max_clock_ahead) {
    return Fail(std::move(waiter),
                absl::FailedPreconditionError(absl::StrCat(
                    "Push: clock ", waiter->clock, " of worker ", waiter->id, " skips ahead: expected clock ",
                    w->next_clock, " (at most ", options_.max_clock_ahead, " pushes in flight)")),
                ready);
  }
  if (waiter->clock == w->next_clock && waiter->first < w->applied) {
    return Fail(std::move(waiter),
                absl::InvalidArgumentError(absl::StrCat("Push: chunk at element ", waiter->first, " of clock ",
                                                        waiter->clock, " overlaps the chunks already applied up to element ",
                                                        w->applied)),
                ready);
  }
  MaybeCheckpoint(now);
  MaybeRebalance();
  if (w->next_clock != waiter->clock || w->applied != waiter->first || WaitsForCut(*waiter) ||
      WaitsForPeers(*waiter)) {
    // Pushes (and chunks) of one worker may overtake each other on the
    // wire: this one waits for its predecessors (or, a checkpoint's clock,
    // for the cut before it).
    if (now >= waiter->deadline) return Fail(std::move(waiter), Late(*w, *waiter), ready);
    if (!draining_.empty()) return Fail(std::move(waiter), absl::UnavailableError(draining_), ready);
    if (absl::Status full = Park(*waiter, "Push"); !full.ok()) return Fail(std::move(waiter), std::move(full), ready);
    pushes_waiting_.push_back(std::move(waiter));
    return;
  }
  const PushResult result = Apply(w, *waiter);
  AfterPush(std::move(waiter), w, result, now, ready);
}

absl::Status SegmentShard::Late(const Worker& w, const Waiter& push) const {
  if (w.next_clock != push.clock || w.applied != push.first) return Skipped(w, push);
  if (WaitsForCut(push)) {
    return absl::UnavailableError(absl::StrCat("Push: clock ", push.clock, " waits for the checkpoint at clock ",
                                               next_cut_, ", which needs ", Laggard(), " to push clock ",
                                               SegmentClock()));
  }
  if (WaitsForPeers(push)) {
    return absl::UnavailableError(absl::StrCat("Push: clock ", push.clock, " waits for ",
                                               Unpulled(push.clock, push.id),
                                               ", which joined at that clock, to pull it first"));
  }
  return Skipped(w, push);
}

absl::Status SegmentShard::Skipped(const Worker& w, const Waiter& push) {
  return absl::FailedPreconditionError(absl::StrCat("Push: clock ", push.clock, " element ", push.first,
                                                    " of worker ", push.id, " skips clock ", w.next_clock,
                                                    " element ", w.applied, ", which never arrived"));
}

void SegmentShard::AfterPush(std::unique_ptr<Waiter> waiter, Worker* w, const PushResult& result, absl::Time now,
                             Completions* ready) {
  if (!waiter->read) {
    ready->push_back([done = std::move(waiter->push_done), result]() mutable { std::move(done)(result); });
    return;
  }
  // The pull of the same elements for the next clock, in the same operation.
  waiter->pushed = result;
  waiter->clock += 1;
  waiter->grad = nullptr;
  w->last_pull_clock = std::max(w->last_pull_clock, waiter->clock);
  StartPull(std::move(waiter), now, ready);
}

PushResult SegmentShard::Apply(Worker* w, const Waiter& push) {
  const DenseView& grad = *push.grad;
  const uint64_t count = push.count, first = push.first;
  if (first == 0) w->step = ++steps_begun_;
  const absl::Time apply_start = absl::Now();
  Optimizer* const optimizer = optimizer_.get();
  const absl::Span<float> values = absl::MakeSpan(values_);
  const uint64_t step = w->step;
  // A balanced push weighs as the samples behind it.
  float scale = 1.0f;
  if (push.info.samples.has_value() && options_.batch_size > 0) {
    scale = static_cast<float>(*push.info.samples) / static_cast<float>(options_.batch_size);
  }
  if (first == 0 && push.info.samples_per_second > 0 && w->rank < throughput_.size()) {
    throughput_[w->rank] = push.info.samples_per_second;
  }
  auto apply_part = [&](uint64_t begin, uint64_t end) {
    grad.ForEachFloatBlock(begin, end, [&](size_t at, absl::Span<const float> block) {
      optimizer->Apply(step, first + at, values.subspan(first + at, block.size()), block, scale);
    });
  };
  // Helpers update disjoint parts of the values and the optimizer's state
  // while this thread holds the lock for them: Run returns once all are done.
  const size_t parts = scale == 0.0f ? 0 : ApplyParts(options_.apply_pool, count);
  if (parts == 0) {
    // No samples behind it: the step counts, nothing moves.
  } else if (parts == 1) {
    apply_part(0, count);
  } else {
    options_.apply_pool->Run(parts, [&](size_t part) {
      apply_part(PartStart(count, parts, part), PartStart(count, parts, part + 1));
    });
  }
  const absl::Duration apply = absl::Now() - apply_start;
  w->applied += count;
  if (w->applied == options_.range.count) {
    ++pushes_;
    if (w->live) {
      auto at = live_clocks_.find(w->next_clock);
      if (--at->second == 0) live_clocks_.erase(at);
      ++live_clocks_[w->next_clock + 1];
    }
    ++w->next_clock;
    w->applied = 0;
    highest_clock_ = std::max(highest_clock_, w->next_clock);
  }
  PushResult result;
  result.applied = true;
  result.next_clock = w->next_clock;
  result.rank = w->rank;
  result.apply = apply;
  return result;
}

void SegmentShard::Resume(absl::Time now, Completions* ready) {
  bool progress = true;
  while (progress) {
    progress = false;
    MaybeCheckpoint(now);
    MaybeRebalance();
    // Parked pushes whose turn has come.
    std::vector<std::unique_ptr<Waiter>> pushes;
    pushes.swap(pushes_waiting_);
    for (auto& push : pushes) {
      auto it = workers_.find(push->id);
      Worker* w = it == workers_.end() || !it->second.live ? nullptr : &it->second;
      const bool turn = w != nullptr && w->next_clock == push->clock && w->applied == push->first &&
                        !WaitsForCut(*push) && !WaitsForPeers(*push);
      if (w != nullptr && !turn && !AppliedBefore(*w, *push)) {
        pushes_waiting_.push_back(std::move(push));  // still waiting
        continue;
      }
      Unparked(push->id);
      if (w == nullptr) {
        Fail(std::move(push),
             absl::FailedPreconditionError(
                 absl::StrCat("Push: worker ", push->id, " was replaced or left while waiting")),
             ready);
      } else if (turn) {
        const PushResult result = Apply(w, *push);
        AfterPush(std::move(push), w, result, now, ready);
        progress = true;
      } else {
        AfterPush(std::move(push), w, Acknowledged(*w), now, ready);
      }
    }
    // Parked pulls the bound now allows: those needing at most one clock
    // more than the segment's (a chunk may be a clock ahead of it).
    const uint64_t reachable = SegmentClock() + 1;
    for (auto it = pulls_waiting_.begin(); it != pulls_waiting_.end() && it->first <= reachable;) {
      const Waiter& pull = *it->second;
      if (!BoundAllows(pull.clock, pull.first + pull.count)) {
        ++it;
        continue;
      }
      std::unique_ptr<Waiter> waiter = std::move(it->second);
      it = pulls_waiting_.erase(it);
      Unparked(waiter->id);
      FinishPull(std::move(waiter), now, ready);
    }
  }
}

void SegmentShard::Tick() {
  Completions ready;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    ExpireLeases(now);
    for (auto it = pulls_waiting_.begin(); it != pulls_waiting_.end();) {
      if (it->second->deadline > now) {
        ++it;
        continue;
      }
      blocked_ += now - it->second->since;
      Unparked(it->second->id);
      Fail(std::move(it->second), BehindBound(it->second->clock), &ready);
      it = pulls_waiting_.erase(it);
    }
    for (auto it = pushes_waiting_.begin(); it != pushes_waiting_.end();) {
      if ((*it)->deadline > now) {
        ++it;
        continue;
      }
      absl::Status late = Late(workers_.at((*it)->id), **it);
      Unparked((*it)->id);
      Fail(std::move(*it), std::move(late), &ready);
      it = pushes_waiting_.erase(it);
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
    for (auto& [needed, waiter] : pulls_waiting_) Fail(std::move(waiter), absl::UnavailableError(why), &ready);
    pulls_waiting_.clear();
    for (auto& waiter : pushes_waiting_) Fail(std::move(waiter), absl::UnavailableError(why), &ready);
    pushes_waiting_.clear();
    parked_.clear();
  }
  for (auto& complete : ready) std::move(complete)();
}

size_t SegmentShard::Waiting() {
  MutexLock lock(&mu_);
  return pulls_waiting_.size() + pushes_waiting_.size();
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
    if (options_.checkpoint_every > 0 && live_ == 0 && pushes_ > cut_updates_) Cut(now);
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
  return true;
}

void SegmentShard::FillStats(v1::SegmentStats* stats,
                             google::protobuf::RepeatedPtrField<v1::WorkerStats>* workers) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    ExpireLeases(now);
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
    Resume(now, &ready);
  }
  for (auto& complete : ready) std::move(complete)();
}

std::vector<float> SegmentShard::Snapshot() {
  MutexLock lock(&mu_);
  return values_;
}

}  // namespace segps
