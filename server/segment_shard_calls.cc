// SegmentShard's data path: pulls and pushes, parked while the staleness
// bound, a predecessor or a checkpoint cut holds them, resumed by the calls
// that release them; updates applied in clock order, split over the apply
// pool when large. Registration, clocks and leases are in segment_shard.cc.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/staleness.h"
#include "server/segment_shard.h"

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

bool SegmentShard::WaitsForCut(const Waiter& push) const { return cuts_.Holds(push.clock); }

void SegmentShard::Pull(uint64_t id, uint64_t clock, uint64_t first, uint64_t count, absl::Time deadline,
                        ReadRange read, PullDone done, ReadRows read_rows) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    auto waiter = std::make_unique<Waiter>(id, clock, first, count, deadline, std::move(read));
    waiter->pull_done = std::move(done);
    waiter->read_rows = std::move(read_rows);
    absl::Status valid;
    // A pull of rows alone comes beside the step's parameter pull, which
    // may be ahead of it (prefetched): it neither goes backwards nor counts as the step's pull.
    const bool rows_only = count == 0 && waiter->read_rows;
    if (id != 0) {
      absl::StatusOr<Worker*> w = FindLive(id, now, "Pull");
      if (!w.ok()) {
        valid = w.status();
      } else if (clock < (*w)->last_pull_clock && !rows_only) {
        valid = absl::InvalidArgumentError(absl::StrCat("Pull: clock ", clock, " of worker ", id,
                                                        " goes backwards (last pull was for clock ",
                                                        (*w)->last_pull_clock, ")"));
      } else if (clock > (*w)->next_clock + options_.max_clock_ahead) {
        valid = absl::InvalidArgumentError(absl::StrCat(
            "Pull: clock ", clock, " of worker ", id, " skips ahead of its pushes (next push is clock ",
            (*w)->next_clock, ", at most ", options_.max_clock_ahead, " may be in flight)"));
      } else if (!rows_only) {
        (*w)->last_pull_clock = clock;
        clocks_.MarkPulled(*w);
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
  } else if (absl::Status full = parked_.ParkPull(Needed(waiter->clock), waiter, "Pull"); !full.ok()) {
    Fail(std::move(waiter), std::move(full), ready);
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
  if (waiter->read_rows) waiter->read_rows(tables_);
  if (ahead == 0) {
    waiter->read(values);
  } else {
    drifted_.resize(waiter->count);
    optimizer_->Extrapolate(steps_begun_, ahead, waiter->first, values, absl::MakeSpan(drifted_));
    waiter->read(drifted_);
  }
  result.clock = clocks_.ClockOf(waiter->first + waiter->count, options_.range.count);
  result.updates = pushes_;
  if (planner_.has_value() && waiter->id != 0) planner_->Fill(waiter->clock, clocks_.SegmentClock(), &result.plan.emplace());
  if (waiter->pushed.has_value()) {
    PushResult pushed = *waiter->pushed;
    pushed.pulled = result;
    ready->push_back([done = std::move(waiter->push_done), pushed]() mutable { std::move(done)(pushed); });
  } else {
    ready->push_back([done = std::move(waiter->pull_done), result]() mutable { std::move(done)(result); });
  }
}

uint64_t SegmentShard::UpdatesAhead(uint64_t id, uint64_t clock) const {
  const uint64_t next = clocks_.Find(id)->next_clock;
  return clock <= next ? 0 : (clock - next) * clocks_.live();
}

void SegmentShard::Push(uint64_t id, uint64_t clock, uint64_t first, const DenseView* grad, absl::Time deadline,
                        ReadRange read, PushDone done, const PushInfo& info,
                        const std::vector<RowGradients>* rows) {
  Completions ready;
  {
    MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    auto waiter = std::make_unique<Waiter>(id, clock, first, grad->count(), deadline, std::move(read));
    waiter->since = now;
    waiter->grad = grad;
    waiter->rows = rows;
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
  if (!moved_at_.has_value()) moved_at_ = now;
  // It computed a step on something: no longer a worker that just joined
  // (two that push without pulling must not wait for each other).
  clocks_.MarkPulled(w);
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
    if (absl::Status full = parked_.ParkPush(waiter, "Push"); !full.ok()) {
      return Fail(std::move(waiter), std::move(full), ready);
    }
    return;
  }
  absl::StatusOr<PushResult> result = Apply(w, *waiter);
  if (!result.ok()) return Fail(std::move(waiter), std::move(result).status(), ready);
  AfterPush(std::move(waiter), w, *result, now, ready);
}

absl::Status SegmentShard::Late(const Worker& w, const Waiter& push) const {
  if (w.next_clock != push.clock || w.applied != push.first) return Skipped(w, push);
  if (WaitsForCut(push) && clocks_.SegmentClock() >= cuts_.next()) {
    return absl::UnavailableError(absl::StrCat("Push: clock ", push.clock, " waits for the checkpoint at clock ",
                                               cuts_.next(), ", which waits for the disk to take the one before it"));
  }
  if (WaitsForCut(push)) {
    return absl::UnavailableError(absl::StrCat("Push: clock ", push.clock, " waits for the checkpoint at clock ",
                                               cuts_.next(), ", which needs ", clocks_.Laggard(), " to push clock ",
                                               clocks_.SegmentClock()));
  }
  if (WaitsForPeers(push)) {
    return absl::UnavailableError(absl::StrCat("Push: clock ", push.clock, " waits for ",
                                               clocks_.Unpulled(push.clock, push.id),
                                               ", which joined at that clock, to pull it first"));
  }
  return Skipped(w, push);
}

absl::Status SegmentShard::Skipped(const Worker& w, const Waiter& push) {
  return absl::FailedPreconditionError(absl::StrCat("Push: clock ", push.clock, " element ", push.first,
                                                    " of worker ", push.id, " skips clock ", w.next_clock,
                                                    " element ", w.applied, ", which never arrived"));
}

void SegmentShard::AfterPush(std::unique_ptr<Waiter> waiter, Worker* w, const PushResult& applied, absl::Time now,
                             Completions* ready) {
  // Applied now or before (a retry): either way, once the backups have it.
  PushResult result = applied;
  if (options_.replicas != nullptr) result.replica_seq = options_.replicas->last();
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

absl::StatusOr<PushResult> SegmentShard::Apply(Worker* w, const Waiter& push) {
  const DenseView& grad = *push.grad;
  const uint64_t count = push.count, first = push.first;
  // A balanced push weighs as the samples behind it.
  float scale = 1.0f;
  if (push.info.samples.has_value() && options_.batch_size > 0) {
    scale = static_cast<float>(*push.info.samples) / static_cast<float>(options_.batch_size);
  }
  const uint64_t step = first == 0 ? steps_begun_ + 1 : w->step;
  if (scale != 0.0f) SEGPS_RETURN_IF_ERROR(optimizer_->Admit(step, push.info.max_abs_gradient, scale, values_));
  const bool rows = push.rows != nullptr && first == 0 && scale != 0.0f;
  if (rows) SEGPS_RETURN_IF_ERROR(UpdateRows(*push.rows, step, scale));
  if (first == 0) w->step = ++steps_begun_;
  // To the backups first, so that they apply it while this server does.
  if (options_.replicas != nullptr) Replicate(*w, push, step, scale);
  const absl::Time apply_start = absl::Now();
  Optimizer* const optimizer = optimizer_.get();
  const absl::Span<float> values = absl::MakeSpan(values_);
  if (first == 0 && push.info.samples_per_second > 0 && planner_.has_value()) {
    planner_->Observe(w->rank, push.info.samples_per_second);
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
  PushResult result;
  if (rows) {
    for (const RowGradients& table_rows : *push.rows) {
      tables_[table_rows.table]->Commit();
      result.rows_pushed += table_rows.ids.size();
    }
    for (const auto& table : tables_) {
      result.rows_held += table->stored();
      result.rows_bytes += table->stored() * table->stride() * sizeof(float);
    }
  }
  const absl::Duration apply = absl::Now() - apply_start;
  w->applied += count;
  if (w->applied == options_.range.count) {
    ++pushes_;
    clocks_.Advance(w);
    w->applied = 0;
  }
  result.applied = true;
  result.next_clock = w->next_clock;
  result.rank = w->rank;
  result.apply = apply;
  return result;
}

absl::Status SegmentShard::UpdateRows(const std::vector<RowGradients>& rows, uint64_t step, float scale) {
  uint64_t added = 0;
  for (const RowGradients& table_rows : rows) {
    EmbeddingTable& table = *tables_[table_rows.table];
    SEGPS_RETURN_IF_ERROR(table.Update(step, scale, table_rows.ids, table_rows.values));
    added += table.pending_new();
  }
  if (added > 0 && (options_.row_budget == nullptr || !options_.row_budget->Take(added))) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "Push rows: storing ", added, " more embedding rows of segment ", options_.segment,
        " would pass this server's cluster.embedding_rows_budget; refused, nothing was applied"));
  }
  return absl::OkStatus();
}

void SegmentShard::Resume(absl::Time now, Completions* ready) {
  bool progress = true;
  while (progress) {
    progress = false;
    MaybeCheckpoint(now);
    MaybeRebalance();
    // Parked pushes whose turn has come.
    for (std::unique_ptr<Waiter>& push : parked_.TakePushes()) {
      Worker* w = clocks_.Find(push->id);
      if (w != nullptr && !w->live) w = nullptr;
      const bool turn = w != nullptr && w->next_clock == push->clock && w->applied == push->first &&
                        !WaitsForCut(*push) && !WaitsForPeers(*push);
      if (w != nullptr && !turn && !AppliedBefore(*w, *push)) {
        parked_.Repark(std::move(push));  // still waiting
        continue;
      }
      parked_.Unpark(push->id);
      if (w == nullptr) {
        Fail(std::move(push),
             absl::FailedPreconditionError(
                 absl::StrCat("Push: worker ", push->id, " was replaced or left while waiting")),
             ready);
      } else if (turn) {
        absl::StatusOr<PushResult> result = Apply(w, *push);
        if (result.ok()) {
          AfterPush(std::move(push), w, *result, now, ready);
        } else {
          Fail(std::move(push), std::move(result).status(), ready);
        }
        progress = true;
      } else {
        AfterPush(std::move(push), w, Acknowledged(*w), now, ready);
      }
    }
    // Parked pulls the bound now allows: those needing at most one clock
    // more than the segment's (a chunk may be a clock ahead of it).
    auto allowed = [this](const Waiter& pull) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under mu_, as Resume
      return BoundAllows(pull.clock, pull.first + pull.count);
    };
    for (std::unique_ptr<Waiter>& pull : parked_.ReleasePulls(clocks_.SegmentClock() + 1, allowed)) {
      FinishPull(std::move(pull), now, ready);
    }
  }
}

void SegmentShard::Replicate(const Worker& w, const Waiter& push, uint64_t step, float scale) {
  v1::ReplicaRecord record;
  v1::AppliedPush* applied = record.mutable_push();
  applied->set_rank(w.rank);
  applied->set_clock(push.clock);
  applied->set_step(step);
  applied->set_scale(scale);
  v1::TensorSlice* gradient = record.mutable_gradient();
  gradient->set_offset(options_.range.offset + push.first);
  gradient->set_count(push.count);
  gradient->set_dtype(v1::FLOAT32);
  // As the optimizer took it: float32, whatever the wire carried. The
  // push's own bytes where they are just that and stay as they are (a
  // transport's buffers); else a copy, appended block by block.
  const Payload* as_is = push.grad->float32();
  if (as_is != nullptr && as_is->owner() != nullptr) {
    options_.replicas->Append(std::move(record), *as_is);
    return;
  }
  auto copy = std::make_shared<std::string>();
  copy->reserve(push.count * sizeof(float));
  push.grad->ForEachFloatBlock(0, push.count, [&](size_t, absl::Span<const float> block) {
    copy->append(reinterpret_cast<const char*>(block.data()), block.size() * sizeof(float));
  });
  const absl::string_view bytes = *copy;
  options_.replicas->Append(std::move(record), Payload::FromPieces({bytes}, std::move(copy)));
}

}  // namespace segps
