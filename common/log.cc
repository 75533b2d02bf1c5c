#include "common/log.h"

#include <unistd.h>

#include <google/protobuf/stubs/logging.h>

#include "absl/strings/match.h"
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

void RouteProtobufLogs() {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel level, const char* file, int line,
                                     const std::string& message) {
    if (absl::StrContains(message, "when parsing a protocol buffer")) return;
    const LogLevel ours = level == google::protobuf::LOGLEVEL_INFO      ? LogLevel::kInfo
                          : level == google::protobuf::LOGLEVEL_WARNING ? LogLevel::kWarning
                                                                       : LogLevel::kError;
    LogLine(ours) << "protobuf " << file << ":" << line << ": " << message;
  });
}

}  // namespace segps
