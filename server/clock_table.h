// The workers of a segment shard (server/segment_shard.h) and the clocks
// that decide its staleness bound: each worker's next clock, which workers
// are live (within their lease), the least live clock (the segment's
// clock), and the live workers that have not pulled since registering (a
// segment that holds for joiners waits for them).
//
// A worker's next_clock, live and pulled change only through the table,
// which keeps its counts of them; its other fields are the shard's.
//
// Thread safety: none; the shard's lock guards it.
#ifndef SEGPS_SERVER_CLOCK_TABLE_H_
#define SEGPS_SERVER_CLOCK_TABLE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"

namespace segps {

// Ids from here on are placeholders: ranks the shard expects (back, or to
// start) before any worker registered for them.
inline constexpr uint64_t kPlaceholder = 1ull << 63;

class ClockTable {
 public:
  struct Worker {
    uint32_t rank = 0;
    uint64_t next_clock = 0;  // Start and Advance only
    uint64_t applied = 0;     // elements of step next_clock applied so far
    uint64_t step = 0;        // optimizer update number of step next_clock, once begun
    uint64_t last_pull_clock = 0;
    absl::Time last_seen;
    bool live = false;    // SetLive only
    bool pulled = false;  // has pulled or pushed since it registered (MarkPulled only)
    uint32_t streams = 0;   // open PushStream/PullStream calls that carried its calls
    bool streamed = false;  // some stream has carried its calls
    // A placeholder for a rank no worker has held yet (the segment's start):
    // whoever takes it registers as new, on every server alike.
    bool never_held = false;
  };
  using Workers = std::map<uint64_t, Worker>;

  // Worker `id`, added (not live) if new.
  Worker& Add(uint64_t id) { return workers_[id]; }
  // Worker `id`, or null.
  Worker* Find(uint64_t id);
  const Worker* Find(uint64_t id) const;
  // Puts a worker that is not live at `clock` and makes it live.
  void Start(Worker* w, uint64_t clock);
  void SetLive(Worker* w, bool live);
  void MarkPulled(Worker* w);
  // The worker's step is applied: its clock moves on.
  void Advance(Worker* w);
  // Removes a worker; the one after it.
  Workers::iterator Erase(Workers::iterator it);
  // Removes every worker; with none live, the segment is at `clock`.
  void Reset(uint64_t clock);

  Workers& workers() { return workers_; }
  const Workers& workers() const { return workers_; }
  uint64_t live() const { return live_; }

  // The least live worker's clock; with none live, the highest any reached.
  uint64_t SegmentClock() const;
  // The highest clock any worker reached.
  uint64_t Highest() const { return highest_; }
  // The clock elements [0, end) of a range of `count` reflect: a step
  // partly applied counts for the elements its chunks already cover.
  uint64_t ClockOf(uint64_t end, uint64_t count) const;
  // Whether a live worker at `clock` has not pulled since registering.
  bool AnyUnpulledAt(uint64_t clock) const { return unpulled_.count(clock) > 0; }
  // The live worker furthest behind, named ("no worker" if none).
  std::string Laggard() const;
  // A live worker at `clock` but `except` that has not pulled, named.
  std::string Unpulled(uint64_t clock, uint64_t except) const;
  static std::string Describe(uint64_t id, const Worker& w);

 private:
  Workers workers_;
  std::map<uint64_t, uint32_t> live_clocks_;  // live workers per next clock
  std::map<uint64_t, uint32_t> unpulled_;     // live workers that have not pulled, per next clock
  uint64_t live_ = 0;
  uint64_t highest_ = 0;  // the highest clock any worker reached
};

}  // namespace segps

#endif  // SEGPS_SERVER_CLOCK_TABLE_H_
