// Minimal line logger shared by every process: one line per message on
// stderr, with a UTC timestamp and a level. Thread-safe (each line is
// written with a single write call).
#ifndef SEGPS_COMMON_LOG_H_
#define SEGPS_COMMON_LOG_H_

#include <sstream>
#include <string>

namespace segps {

enum class LogLevel { kInfo, kWarning, kError };

class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  ~LogLine();

  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Sends protobuf's own log messages through LogLine, except its complaint
// about each string field with invalid UTF-8 that it parses: bytes from the
// network must not write to a server's log (a client repeating one request
// would fill it, or block the server on a full pipe), and the caller
// already gets INVALID_ARGUMENT naming the method. Process-wide: for mains.
void RouteProtobufLogs();

}  // namespace segps

#define SEGPS_LOG_INFO ::segps::LogLine(::segps::LogLevel::kInfo)
#define SEGPS_LOG_WARNING ::segps::LogLine(::segps::LogLevel::kWarning)
#define SEGPS_LOG_ERROR ::segps::LogLine(::segps::LogLevel::kError)

#endif  // SEGPS_COMMON_LOG_H_
