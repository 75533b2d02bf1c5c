#include "server/listener_watch.h"

#include <grpc/support/log.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

void WatchGrpcLog() { gpr_set_log_function(NoteGrpcLog); }

std::optional<int> QueuedConnections(int port) {
  std::optional<int> most;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* f = std::fopen(table, "re");
    if (f == nullptr) continue;
    char line[512];
    std::fgets(line, sizeof(line), f);  // the header
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      // "sl: local_ip:PORT remote_ip:port STATE tx_queue:rx_queue ..."; a
      // listening socket (state 0A) has its accept queue as rx_queue.
      char local[64], remote[64];
      unsigned state = 0, tx = 0, rx = 0;
      if (std::sscanf(line, " %*[^:]: %63s %63s %x %x:%x", local, remote, &state, &tx, &rx) != 5 ||
          state != 0x0A) {
        continue;
      }
      const char* colon = std::strrchr(local, ':');
      if (colon == nullptr || std::strtol(colon + 1, nullptr, 16) != port) continue;
      most = std::max(most.value_or(0), static_cast<int>(rx));
    }
    std::fclose(f);
  }
  return most;
}

ListenerWatch::ListenerWatch(int port, absl::Duration period, std::function<absl::Status()> restart)
    : port_(port), period_(period), restart_(std::move(restart)), thread_([this] { Run(); }) {}

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
    if (!accept_failed) continue;
    // Descriptors free again: /proc opens (and says who waits meanwhile).
    const std::optional<int> queued = QueuedConnections(port_);
    if (!queued.has_value()) continue;
    accept_failed = false;
    SEGPS_LOG_WARNING << "the listener on port " << port_ << " stopped accepting when this process ran out of file "
                      << "descriptors (gRPC abandons it; " << *queued
                      << " connections wait); starting it again now that some are free";
    if (absl::Status restarted = restart_(); !restarted.ok()) {
      SEGPS_LOG_ERROR << "could not start the listener again: " << restarted.message();
    }
  }
}

}  // namespace segps
