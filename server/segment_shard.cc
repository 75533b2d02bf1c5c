#include "server/segment_shard.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace segps {
namespace {

// Elements a part of a split update has at least: a helper thread takes
// tens of microseconds to wake, about what Adam takes over 64K elements.
constexpr uint64_t kMinPartElements = 1 << 16;

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
    : options_(options), values_(std::move(initial)), optimizer_(std::move(optimizer)) {}

absl::Time SegmentShard::ExpireLeases(absl::Time now) {
  absl::Time earliest = absl::InfiniteFuture();
  for (auto& [id, w] : workers_) {
    if (!w.live) continue;
    const absl::Time expiry = w.last_seen + options_.lease;
    if (expiry <= now) {
      w.live = false;
      changed_.SignalAll();
    } else {
      earliest = std::min(earliest, expiry);
    }
  }
  return earliest;
}

uint64_t SegmentShard::SegmentClock() const {
  uint64_t clock = std::numeric_limits<uint64_t>::max();
  for (const auto& [id, w] : workers_) {
    if (w.live) clock = std::min(clock, w.next_clock);
  }
  return clock == std::numeric_limits<uint64_t>::max() ? highest_clock_ : clock;
}

uint64_t SegmentShard::ClockOf(uint64_t end) const {
  uint64_t clock = std::numeric_limits<uint64_t>::max();
  for (const auto& [id, w] : workers_) {
    if (!w.live) continue;
    // A step partly applied counts for the elements its chunks already cover.
    clock = std::min(clock, w.next_clock + (end > 0 && w.applied >= end ? 1 : 0));
  }
  return clock == std::numeric_limits<uint64_t>::max() ? highest_clock_ : clock;
}

uint64_t SegmentShard::Laggard() const {
  uint64_t laggard = 0, clock = std::numeric_limits<uint64_t>::max();
  for (const auto& [id, w] : workers_) {
    if (w.live && w.next_clock < clock) {
      clock = w.next_clock;
      laggard = id;
    }
  }
  return laggard;
}

absl::StatusOr<SegmentShard::Worker*> SegmentShard::FindLive(uint64_t id, absl::Time now,
                                                             const char* call) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat(call, ": worker ", id, " is not registered for segment ",
                                            options_.segment, "; call Register first"));
  }
  Worker& w = it->second;
  if (w.live && w.last_seen + options_.lease <= now) w.live = false;
  if (!w.live) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, ": worker ", id, " (segment ", options_.segment, " rank ", w.rank,
                     ") lost its lease (no call for ", absl::FormatDuration(options_.lease),
                     "); register again to rejoin"));
  }
  w.last_seen = now;
  return &w;
}

uint64_t SegmentShard::Register(uint64_t id, uint32_t rank, std::optional<uint64_t> join_clock) {
  MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  ExpireLeases(now);
  for (auto it = workers_.begin(); it != workers_.end();) {
    it = it->second.rank == rank ? workers_.erase(it) : std::next(it);
  }
  const uint64_t start = join_clock.value_or(SegmentClock());
  Worker w;
  w.rank = rank;
  w.next_clock = start;
  w.last_pull_clock = start;
  w.last_seen = now;
  workers_[id] = w;
  highest_clock_ = std::max(highest_clock_, start);
  changed_.SignalAll();
  return start;
}

absl::StatusOr<PullResult> SegmentShard::Pull(uint64_t id, uint64_t clock, uint64_t first, uint64_t count,
                                              absl::FunctionRef<void(absl::Span<const float>)> read,
                                              absl::Time deadline) {
  MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  PullResult result;
  if (id != 0) {
    absl::StatusOr<Worker*> w = FindLive(id, now, "Pull");
    if (!w.ok()) return w.status();
    if (clock < (*w)->last_pull_clock) {
      return absl::InvalidArgumentError(absl::StrCat("Pull: clock ", clock, " of worker ", id,
                                                     " goes backwards (last pull was for clock ",
                                                     (*w)->last_pull_clock, ")"));
    }
    if (clock > (*w)->next_clock + options_.max_clock_ahead) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Pull: clock ", clock, " of worker ", id, " skips ahead of its pushes (next push is clock ",
          (*w)->next_clock, ", at most ", options_.max_clock_ahead, " may be in flight)"));
    }
    (*w)->last_pull_clock = clock;
    const uint64_t needed =
        options_.staleness < 0 || clock <= static_cast<uint64_t>(options_.staleness)
            ? 0
            : clock - static_cast<uint64_t>(options_.staleness);
    const absl::Time wait_start = now;
    while (true) {
      const absl::Time next_expiry = ExpireLeases(now);
      if (ClockOf(first + count) >= needed) break;
      if (now >= deadline) {
        blocked_ += now - wait_start;
        return absl::UnavailableError(absl::StrCat(
            "Pull: segment ", options_.segment, " clock ", SegmentClock(), " is below ", needed,
            " needed for clock ", clock, " with staleness ", options_.staleness,
            "; waiting for worker ", Laggard()));
      }
      changed_.WaitWithDeadline(&mu_, std::min(deadline, next_expiry));
      now = absl::Now();
      // A worker waiting on its peers is alive: its lease runs while it waits.
      auto it = workers_.find(id);
      if (it == workers_.end() || !it->second.live) {
        return absl::FailedPreconditionError(
            absl::StrCat("Pull: worker ", id, " was replaced or left while waiting"));
      }
      it->second.last_seen = now;
    }
    blocked_ += now - wait_start;
    result.blocked = now - wait_start;
  }
  ++pulls_;
  const absl::Span<const float> values = absl::MakeConstSpan(values_).subspan(first, count);
  const uint64_t ahead = id != 0 && options_.momentum_lookahead ? UpdatesAhead(id, clock) : 0;
  if (ahead == 0) {
    read(values);
  } else {
    drifted_.resize(count);
    optimizer_->Extrapolate(steps_begun_, ahead, first, values, absl::MakeSpan(drifted_));
    read(drifted_);
  }
  result.clock = ClockOf(first + count);
  result.updates = pushes_;
  return result;
}

uint64_t SegmentShard::UpdatesAhead(uint64_t id, uint64_t clock) const {
  const uint64_t next = workers_.at(id).next_clock;
  if (clock <= next) return 0;
  uint64_t live = 0;
  for (const auto& [other, w] : workers_) live += w.live ? 1 : 0;
  return (clock - next) * live;
}

absl::StatusOr<PushResult> SegmentShard::Push(uint64_t id, uint64_t clock, uint64_t first,
                                              const DenseView& grad, absl::Time deadline) {
  const uint64_t count = grad.count();
  MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  absl::StatusOr<Worker*> found = FindLive(id, now, "Push");
  if (!found.ok()) return found.status();
  Worker* w = *found;
  // A retry of a step or chunk already applied is acknowledged, not re-applied.
  auto applied_before = [&] {
    return clock < w->next_clock || (clock == w->next_clock && first + count <= w->applied && count > 0);
  };
  if (applied_before()) return PushResult{false, w->next_clock, w->rank, absl::ZeroDuration()};
  if (clock > w->next_clock + options_.max_clock_ahead) {
    return absl::FailedPreconditionError(
        absl::StrCat("Push: clock ", clock, " of worker ", id, " skips ahead: expected clock ",
                     w->next_clock, " (at most ", options_.max_clock_ahead, " pushes in flight)"));
  }
  if (clock == w->next_clock && first < w->applied) {
    return absl::InvalidArgumentError(absl::StrCat("Push: chunk at element ", first, " of clock ", clock,
                                                   " overlaps the chunks already applied up to element ", w->applied));
  }
  // Pushes (and chunks) of one worker may overtake each other on the wire:
  // wait for the predecessors.
  while (w->next_clock != clock || w->applied != first) {
    if (now >= deadline) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Push: clock ", clock, " element ", first, " of worker ", id, " skips clock ", w->next_clock,
          " element ", w->applied, ", which never arrived"));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
    now = absl::Now();
    auto it = workers_.find(id);
    if (it == workers_.end() || !it->second.live) {
      return absl::FailedPreconditionError(
          absl::StrCat("Push: worker ", id, " was replaced or left while waiting"));
    }
    w = &it->second;
    w->last_seen = now;
    if (applied_before()) return PushResult{false, w->next_clock, w->rank, absl::ZeroDuration()};
  }
  if (first == 0) w->step = ++steps_begun_;
  const absl::Time apply_start = absl::Now();
  Optimizer* const optimizer = optimizer_.get();
  const absl::Span<float> values = absl::MakeSpan(values_);
  const uint64_t step = w->step;
  auto apply_part = [&](uint64_t begin, uint64_t end) {
    grad.ForEachFloatBlock(begin, end, [&](size_t at, absl::Span<const float> block) {
      optimizer->Apply(step, first + at, values.subspan(first + at, block.size()), block);
    });
  };
  // Helpers update disjoint parts of the values and the optimizer's state
  // while this thread holds the lock for them: Run returns once all are done.
  const size_t parts = ApplyParts(options_.apply_pool, count);
  if (parts == 1) {
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
    ++w->next_clock;
    w->applied = 0;
    highest_clock_ = std::max(highest_clock_, w->next_clock);
  }
  changed_.SignalAll();
  return PushResult{true, w->next_clock, w->rank, apply};
}

std::optional<uint32_t> SegmentShard::FreeRank(uint32_t ranks) {
  MutexLock lock(&mu_);
  ExpireLeases(absl::Now());
  std::vector<bool> taken(ranks, false);
  for (const auto& [id, w] : workers_) {
    if (w.live && w.rank < ranks) taken[w.rank] = true;
  }
  for (uint32_t r = 0; r < ranks; ++r) {
    if (!taken[r]) return r;
  }
  return std::nullopt;
}

bool SegmentShard::Renew(uint64_t id) {
  MutexLock lock(&mu_);
  return FindLive(id, absl::Now(), "Heartbeat").ok();
}

bool SegmentShard::Leave(uint64_t id) {
  MutexLock lock(&mu_);
  if (workers_.erase(id) == 0) return false;
  changed_.SignalAll();
  return true;
}

void SegmentShard::FillStats(v1::SegmentStats* stats,
                             google::protobuf::RepeatedPtrField<v1::WorkerStats>* workers) {
  MutexLock lock(&mu_);
  ExpireLeases(absl::Now());
  stats->set_segment(options_.segment);
  stats->set_offset(options_.range.offset);
  stats->set_count(options_.range.count);
  stats->set_clock(SegmentClock());
  stats->set_updates(pushes_);
  stats->set_pulls(pulls_);
  stats->set_pushes(pushes_);
  stats->set_blocked_us(absl::ToInt64Microseconds(blocked_));
  for (const auto& [id, w] : workers_) {
    v1::WorkerStats* ws = workers->Add();
    ws->set_worker_id(id);
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
