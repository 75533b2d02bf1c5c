// A worker's tensor traffic as one long-lived stream per server
// (PushStream, PullStream): a message each way per request (a push, a pull,
// or a chunk of either) instead of a call. On this 2-core machine an 8 KB
// push+pull round costs ~170 us of CPU as stream messages against ~250 us
// as unary calls, client and server together (segps-bench-transport).
//
// Exchanges (one call's requests to the servers) run one at a time, in the
// order they were started, on the client's completion loop; each completes
// through its callback. A stream opens on first use and stays open across
// exchanges. One that breaks (the server rejected a request, went away, or
// sent no reply in time) fails its unanswered requests with its status and
// is opened again by the next attempt. Requests that failed transiently
// (UNAVAILABLE, DEADLINE_EXCEEDED) are sent again after a backoff (an alarm
// on the loop, not a sleep) while the exchange's budget lasts: the server
// applies each (worker, clock) push once and a pull changes nothing.
//
// Thread safety: Start from any thread; everything else runs on the loop.
#ifndef SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_
#define SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_

#include <grpcpp/alarm.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "worker/client/completion_loop.h"

namespace segps {

// Exponential backoff between attempts (20 ms doubling to 1 s) within a budget.
class Backoff {
 public:
  explicit Backoff(absl::Duration budget) : give_up_(absl::Now() + budget) {}
  // The wait before the next attempt; nullopt when that attempt would start
  // after the budget ran out.
  std::optional<absl::Duration> Next();
  absl::Duration left() const { return give_up_ - absl::Now(); }

 private:
  const absl::Time give_up_;
  absl::Duration delay_ = absl::Milliseconds(20);
};

class RequestStreams {
 public:
  struct Exchange {
    const char* call = "";  // names the exchange in errors ("Pull")
    std::vector<size_t> servers;  // request j goes to server servers[j]
    std::vector<grpc::ByteBuffer> requests;
    size_t window = 1;  // unanswered requests per server
    // An attempt's requests fail when no reply or other progress comes
    // within `patience`; transient failures are retried until `budget` runs out.
    absl::Duration patience, budget;
    // Each reply, in the order the requests were written per server, on the loop's thread.
    std::function<absl::Status(size_t request, grpc::ByteBuffer* reply)> take;
    // Once, on the loop's thread: OK, or the failure that ended the
    // exchange, naming its server and `call`.
    absl::AnyInvocable<void(absl::Status) &&> done;
  };

  // Streams of the bidirectional method `method` (a path, e.g.
  // kPushStreamMethod), one per channel; names[i] names server i in errors.
  RequestStreams(CompletionLoop* loop, const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                 std::vector<std::string> names, const char* method);
  // Fails the exchanges not yet done with CANCELLED, closes the streams and
  // waits for them to end. Not on the loop's thread.
  ~RequestStreams();
  RequestStreams(const RequestStreams&) = delete;
  RequestStreams& operator=(const RequestStreams&) = delete;

  // Queues an exchange after those started before it.
  void Start(std::unique_ptr<Exchange> exchange);

 private:
  enum class Op { kStart, kWrite, kRead, kFinish, kWatchdog, kBackoff };
  struct Tag final : CompletionLoop::Handler {
    RequestStreams* owner = nullptr;
    size_t server = 0;
    Op op = Op::kStart;
    void OnComplete(bool ok) override { owner->OnEvent(server, op, ok); }
  };
  struct Stream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> io;  // null: closed
    bool started = false, broken = false;
    bool starting = false, writing = false, reading = false, finishing = false;  // operations outstanding
    grpc::Status status;      // set by Finish
    absl::Status break_cause;  // why the client broke it, if it did
    grpc::ByteBuffer reply;
    std::deque<size_t> unsent, unanswered;  // positions in the attempt's `pending_`
    Tag tags[4];
  };
  // An alarm on the loop and whether it is set.
  struct Timer {
    grpc::Alarm alarm;
    bool armed = false;
    Tag tag;
  };

  void OnEvent(size_t server, Op op, bool ok);
  void OnStreamEvent(size_t server, Op op, bool ok);
  void OnWatchdog(bool fired);
  void Next();
  void BeginAttempt();
  void EndAttempt();
  void Complete(absl::Status status);
  void Arm(Timer* timer, absl::Time when);
  void Close();
  void CheckClosed();

  void Open(size_t server);
  void Pump(size_t server);
  // Marks the stream broken (cancelling it, for `cause`, when the client is
  // the one giving up) and, once nothing is outstanding, asks for its status.
  void Break(size_t server, absl::Status cause);
  void FinishIfIdle(size_t server);
  bool AnyBusy() const;
  // Breaks every stream with requests outstanding: no progress for the patience.
  void BreakStalled();
  // Stream `server`'s Finish came back: its requests left fail with its
  // status; a failure for good abandons the other streams' requests.
  void Finished(size_t server);
  void Settle(size_t k, absl::Status status);
  bool Busy(const Stream& s) const { return s.starting || s.writing || s.reading || s.finishing; }
  absl::Status Annotate(const absl::Status& status, size_t server) const;

  CompletionLoop* const loop_;
  const char* const method_;
  const std::vector<std::string> names_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  // The state below is the loop thread's alone.
  std::vector<Stream> streams_;
  std::deque<std::unique_ptr<Exchange>> queue_;
  std::unique_ptr<Exchange> current_;
  std::optional<Backoff> backoff_;
  std::vector<size_t> pending_;         // the current attempt's requests
  std::vector<absl::Status> results_;   // per position in pending_
  size_t remaining_ = 0;                // unsettled in the attempt
  bool in_attempt_ = false, closing_ = false, closed_counted_ = false;
  absl::Time progress_;                 // the attempt's last event
  Timer watchdog_, retry_;
  std::chrono::system_clock::time_point watchdog_due_;
  Latch closed_{1};
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_
