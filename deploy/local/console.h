// What segps-local shows of its processes' output.
//
// By default, what a user needs: segps-local's own lines, every warning
// and error, each worker's progress, its per-epoch validation and test
// scores and its result, and the evaluation (less its traffic counters). Servers' start-up
// lines, registrations, one line per checkpoint written or skipped and the
// like are shown with --verbose only; the servers' periodic checkpoint
// summaries and their restores from a checkpoint stay. A shown line keeps its process's prefix ("[relu64/1]").
//
// In a terminal (`live`), progress is one line per segment (or stage),
// redrawn in place below the lines that scroll: the newest progress of any
// of its workers, with the time left at the rate seen so far. Elsewhere,
// the workers' periodic progress lines are shown as they come.
//
// Thread safety: none; segps-local relays from one thread.
#ifndef SEGPS_DEPLOY_LOCAL_CONSOLE_H_
#define SEGPS_DEPLOY_LOCAL_CONSOLE_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace segps {

class Console {
 public:
  // `width`: the terminal's columns (live lines are cut to fit, so that
  // none wraps and the block can be redrawn).
  Console(std::ostream* out, bool verbose, bool live, int width = 100);

  // A line of process `process` ("server0", "relu64/1", "eval") at `now`.
  void Line(const std::string& process, const std::string& line, absl::Time now);
  // segps-local's own line.
  void Say(const std::string& line);
  // Training is over: the progress lines stay as last drawn, and what
  // follows scrolls below them.
  void EndProgress();

 private:
  // A progress line's parts: "TAG: [epoch E/N ]step S[/T] REST".
  struct Progress {
    std::string key;  // the segment or stage: TAG up to its '/'
    std::string text;  // everything after "TAG: "
    uint64_t step = 0;
    std::optional<uint64_t> total;
  };
  static std::optional<Progress> ParseProgress(const std::string& message);
  bool Shown(const std::string& process, char level, const std::string& message) const;
  void Update(const Progress& progress, absl::Time now);
  void Scroll(const std::string& text);
  void Draw();

  // One segment's (or stage's) line.
  struct Bar {
    std::string key;
    std::string text;
    absl::Time first_at;
    uint64_t first_step = 0;
    uint64_t step = 0;
    std::optional<uint64_t> total;
    std::string left;  // "12s left", or empty until a rate is known
  };

  std::ostream* const out_;
  const bool verbose_, live_;
  const size_t width_;
  Bar& BarOf(const std::string& key);
  std::vector<Bar> bars_;  // a segment's or stage's, in the order they first reported
  int drawn_ = 0;  // lines of the block on screen, below the cursor's line
  bool ended_ = false;
};

}  // namespace segps

#endif  // SEGPS_DEPLOY_LOCAL_CONSOLE_H_
