// What a server says about its checkpoints. The first of each segment is
// told in full (clock, file, time taken); after it, at most one line a
// segment every `interval`, summing up what was written and what waited
// meanwhile: a job that cuts every few clocks would otherwise log a line
// per cut, and a disk slower than the cuts a line per wait. The first wait
// of a segment is told at once, as a warning. Failures are not summed up:
// the server logs each.
//
// Thread safety: every method may be called from any thread.
#ifndef SEGPS_SERVER_CHECKPOINT_REPORT_H_
#define SEGPS_SERVER_CHECKPOINT_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/sync.h"

namespace segps {

class CheckpointReport {
 public:
  CheckpointReport(int server, absl::Duration interval) : server_(server), interval_(interval) {}

  // A checkpoint of `segment` at `clock` was written to `path`, taking
  // `took`, at `now`: the line to log, if one is due.
  std::optional<std::string> Written(const std::string& segment, uint64_t clock, const std::string& path,
                                     absl::Duration took, absl::Time now) {
    MutexLock lock(&mu_);
    Tally& t = tallies_[segment];
    ++t.written;
    t.newest = absl::StrCat("clock ", clock, ", ", path);
    if (!t.told) {
      t.told = true;
      t.since = now;
      t.written = 0;
      return absl::StrCat("server ", server_, ": checkpoint of ", segment, " at clock ", clock, " written to ", path,
                          " in ", absl::FormatDuration(took), "; the next are summed up every ",
                          absl::FormatDuration(interval_));
    }
    return Due(segment, &t, now);
  }

  // The cut of `segment` at `clock` waits for the disk to take the one
  // before it (asked again while it waits: each clock counts once): the
  // line to log, if one is due.
  std::optional<std::string> Waited(const std::string& segment, uint64_t clock, absl::Time now) {
    MutexLock lock(&mu_);
    Tally& t = tallies_[segment];
    if (t.waited_clock == clock) return std::nullopt;
    t.waited_clock = clock;
    ++t.waited;
    if (!t.warned) {
      t.warned = true;
      return absl::StrCat("server ", server_, ": checkpoint of ", segment, " at clock ", clock,
                          " waits for the disk to take the one before it, and the pushes of that clock wait with it: "
                          "the disk is slower than checkpoint.every_clocks (further waits are counted in the summary)");
    }
    return Due(segment, &t, now);
  }

 private:
  struct Tally {
    bool told = false, warned = false;
    absl::Time since;
    uint64_t written = 0, waited = 0;
    std::optional<uint64_t> waited_clock;
    std::string newest;
  };

  std::optional<std::string> Due(const std::string& segment, Tally* t, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (now - t->since < interval_ || (t->written == 0 && t->waited == 0)) return std::nullopt;
    std::string line = absl::StrCat("server ", server_, ": checkpoints of ", segment, " in the last ",
                                    absl::FormatDuration(now - t->since), ": ", t->written, " written (newest at ",
                                    t->newest, ")");
    if (t->waited > 0) absl::StrAppend(&line, ", ", t->waited, " waited for the disk (it is slower than the cuts)");
    t->since = now;
    t->written = t->waited = 0;
    return line;
  }

  const int server_;
  const absl::Duration interval_;
  Mutex mu_;
  std::map<std::string, Tally> tallies_ ABSL_GUARDED_BY(mu_);
};

}  // namespace segps

#endif  // SEGPS_SERVER_CHECKPOINT_REPORT_H_
