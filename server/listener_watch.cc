#include "server/listener_watch.h"

#include <fcntl.h>
#include <grpc/support/log.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/log.h"

namespace segps {
namespace {

// Set by gRPC's log when an accept failed for want of descriptors.
std::atomic<bool> accept_failed{false};

void NoteGrpcLog(gpr_log_func_args* args) {
  if (std::strstr(args->message, "Failed accept4") != nullptr) accept_failed = true;
  std::fprintf(stderr, "%s %s:%d] %s\n", gpr_log_severity_string(args->severity), args->file, args->line,
               args->message);
}

// Whether this process can open a file now.
bool DescriptorFree() {
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  close(fd);
  return true;
}

}  // namespace

void WatchGrpcLog() { gpr_set_log_function(NoteGrpcLog); }

ListenerWatch::ListenerWatch(absl::Duration period, std::function<absl::Status()> restart)
    : period_(period), restart_(std::move(restart)), thread_([this] { Run(); }) {}

ListenerWatch::~ListenerWatch() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  thread_.join();
}

void ListenerWatch::Run() {
  while (true) {
    {
      MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + period_;
      while (!stop_ && absl::Now() < until) wake_.WaitWithDeadline(&mu_, until);
      if (stop_) return;
    }
    if (!accept_failed || !DescriptorFree()) continue;
    accept_failed = false;
    SEGPS_LOG_WARNING << "the listener stopped accepting when this process ran out of file descriptors (gRPC "
                         "abandons it); starting it again now that some are free";
    if (absl::Status restarted = restart_(); !restarted.ok()) {
      SEGPS_LOG_ERROR << "could not start the listener again (trying again in " << absl::FormatDuration(period_)
                      << "): " << restarted.message();
      accept_failed = true;
    }
  }
}

}  // namespace segps
