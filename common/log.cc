#include "common/log.h"

#include <unistd.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace segps {

LogLine::~LogLine() {
  const char* tag = level_ == LogLevel::kInfo      ? "I"
                    : level_ == LogLevel::kWarning ? "W"
                                                   : "E";
  std::string line = absl::FormatTime("%H:%M:%E3S ", absl::Now(), absl::UTCTimeZone());
  line += tag;
  line += ' ';
  line += stream_.str();
  line += '\n';
  // One write per line so that lines of concurrent threads never interleave.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace segps
