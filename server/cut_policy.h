// When a segment shard cuts a checkpoint: at every segment clock that is a
// multiple of checkpoint_every, unless the last cut is less than
// checkpoint_interval old (then the cut moves on to the next multiple). A
// push of a clock at or past the next cut waits until the cut is taken, so
// that the cut is consistent. With early stopping's epoch length set, every
// multiple of it is cut too, whatever the interval: the servers end a
// segment at its best epoch's end.
//
// Thread safety: none of its own; the segment shard calls it under its lock.
#ifndef SEGPS_SERVER_CUT_POLICY_H_
#define SEGPS_SERVER_CUT_POLICY_H_

#include <algorithm>
#include <cstdint>
#include <optional>

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
    if (now - last_ >= interval_ || (epoch_ > 0 && segment_clock % epoch_ == 0)) return true;
    next_ = After(segment_clock);
    return false;
  }
  // A cut (or a restored checkpoint) at `clock`, holding `updates`.
  void Taken(uint64_t clock, uint64_t updates, absl::Time now) {
    last_ = now;
    last_clock_ = clock;
    updates_ = updates;
    next_ = every_ == 0 ? 0 : After(clock);
  }
  // Early stopping: cut at every multiple of `epoch_clocks` as well.
  void set_epoch(uint64_t epoch_clocks) {
    epoch_ = epoch_clocks;
    if (every_ > 0 && last_clock_.has_value()) next_ = After(*last_clock_);
  }
  uint64_t epoch() const { return epoch_; }
  // Whether updates were applied since the last cut.
  bool Behind(uint64_t updates) const { return updates > updates_; }

 private:
  uint64_t After(uint64_t clock) const {
    const uint64_t next = (clock / every_ + 1) * every_;
    return epoch_ == 0 ? next : std::min(next, (clock / epoch_ + 1) * epoch_);
  }

  const uint32_t every_;
  const absl::Duration interval_;
  uint64_t epoch_ = 0;  // clocks per epoch, with early stopping
  uint64_t next_ = 0;   // the next checkpoint clock
  std::optional<uint64_t> last_clock_;
  absl::Time last_ = absl::InfinitePast();
  uint64_t updates_ = 0;  // at the last cut (or restore)
};

}  // namespace segps

#endif  // SEGPS_SERVER_CUT_POLICY_H_
