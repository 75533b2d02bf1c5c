#include "server/clock_table.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace segps {

ClockTable::Worker* ClockTable::Find(uint64_t id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const ClockTable::Worker* ClockTable::Find(uint64_t id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

void ClockTable::Start(Worker* w, uint64_t clock) {
  SetLive(w, false);
  w->next_clock = clock;
  SetLive(w, true);
  highest_ = std::max(highest_, clock);
}

void ClockTable::SetLive(Worker* w, bool live) {
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

void ClockTable::MarkPulled(Worker* w) {
  if (w->pulled) return;
  const bool live = w->live;
  SetLive(w, false);
  w->pulled = true;
  SetLive(w, live);
}

void ClockTable::Advance(Worker* w) {
  const bool live = w->live;
  SetLive(w, false);
  ++w->next_clock;
  SetLive(w, live);
  highest_ = std::max(highest_, w->next_clock);
}

ClockTable::Workers::iterator ClockTable::Erase(Workers::iterator it) {
  SetLive(&it->second, false);
  return workers_.erase(it);
}

void ClockTable::Reset(uint64_t clock) {
  for (auto& [id, w] : workers_) SetLive(&w, false);
  workers_.clear();
  highest_ = clock;
}

uint64_t ClockTable::SegmentClock() const {
  return live_clocks_.empty() ? highest_ : live_clocks_.begin()->first;
}

uint64_t ClockTable::ClockOf(uint64_t end, uint64_t count) const {
  if (end == 0 || end >= count) return SegmentClock();
  uint64_t clock = std::numeric_limits<uint64_t>::max();
  for (const auto& [id, w] : workers_) {
    if (!w.live) continue;
    clock = std::min(clock, w.next_clock + (w.applied >= end ? 1 : 0));
  }
  return clock == std::numeric_limits<uint64_t>::max() ? highest_ : clock;
}

std::string ClockTable::Describe(uint64_t id, const Worker& w) {
  if (id >= kPlaceholder) return absl::StrCat("rank ", w.rank, ", expected back or to start");
  return absl::StrCat("worker ", id, " (rank ", w.rank, ")");
}

std::string ClockTable::Laggard() const {
  const std::pair<const uint64_t, Worker>* laggard = nullptr;
  for (const auto& entry : workers_) {
    if (entry.second.live && (laggard == nullptr || entry.second.next_clock < laggard->second.next_clock)) {
      laggard = &entry;
    }
  }
  return laggard == nullptr ? "no worker" : Describe(laggard->first, laggard->second);
}

std::string ClockTable::Unpulled(uint64_t clock, uint64_t except) const {
  for (const auto& [id, w] : workers_) {
    if (id != except && w.live && !w.pulled && w.next_clock == clock) return Describe(id, w);
  }
  return "no worker";
}

}  // namespace segps
