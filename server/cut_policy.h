// When a segment shard cuts a checkpoint: at every segment clock that is a
// multiple of checkpoint_every, unless the last cut is less than
// checkpoint_interval old (then the cut moves on to the next multiple). A
// push of a clock at or past the next cut waits until the cut is taken, so
// that the cut is consistent.
//
// Thread safety: none of its own; the segment shard calls it under its lock.
#ifndef SEGPS_SERVER_CUT_POLICY_H_
#define SEGPS_SERVER_CUT_POLICY_H_

#include <cstdint>

#include "absl/time/time.h"

namespace segps {

class CutPolicy {
 public:
  CutPolicy(uint32_t every, absl::Duration interval) : every_(every), interval_(interval) {}

  bool enabled() const { return every_ > 0; }
  // Whether a push of `clock` waits for the cut before it.
  bool Holds(uint64_t clock) const { return every_ > 0 && clock >= next_; }
  uint64_t next() const { return next_; }
  // At `segment_clock`: whether a cut is due now. One that is too soon
  // after the last moves on to the next multiple instead.
  bool Due(uint64_t segment_clock, absl::Time now) {
    if (every_ == 0 || segment_clock < next_) return false;
    if (now - last_ >= interval_) return true;
    next_ = After(segment_clock);
    return false;
  }
  // A cut (or a restored checkpoint) at `clock`, holding `updates`.
  void Taken(uint64_t clock, uint64_t updates, absl::Time now) {
    last_ = now;
    updates_ = updates;
    next_ = every_ == 0 ? 0 : After(clock);
  }
  // Whether updates were applied since the last cut.
  bool Behind(uint64_t updates) const { return updates > updates_; }

 private:
  uint64_t After(uint64_t clock) const { return (clock / every_ + 1) * every_; }

  const uint32_t every_;
  const absl::Duration interval_;
  uint64_t next_ = 0;  // the next checkpoint clock
  absl::Time last_ = absl::InfinitePast();
  uint64_t updates_ = 0;  // at the last cut (or restore)
};

}  // namespace segps

#endif  // SEGPS_SERVER_CUT_POLICY_H_
