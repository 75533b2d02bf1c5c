// A worker's tensor traffic as one long-lived stream per server
// (PushStream, PullStream): a message each way per request (a push, a pull,
// or a chunk of either) instead of a call. On this 2-core machine an 8 KB
// push+pull round costs ~170 us of CPU as stream messages against ~250 us
// as unary calls, client and server together (segps-bench-transport).
//
// Exchanges (one call's requests to the servers) run one at a time, in the
// order they were started: the caller's thread writes the first messages,
// the client's completion loop drives the rest, and each exchange completes
// through its callback on the loop's thread. A stream opens on first use and stays open across
// exchanges. One that breaks (the server rejected a request, went away, or
// sent no reply in time) fails its unanswered requests with its status and
// is opened again by the next attempt. Requests that failed transiently
// (UNAVAILABLE, DEADLINE_EXCEEDED) are sent again after a backoff (an alarm
// on the loop, not a sleep) while the exchange's budget lasts: the server
// applies each (worker, clock) push once and a pull changes nothing.
//
// Thread safety: Start from any thread. The state is under one mutex, held
// while operations are started and completions handled, never across a
// call's wait and never while a callback runs.
#ifndef SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_
#define SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_

#include <grpcpp/alarm.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

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
#include "worker/client/server_routes.h"

namespace segps {

// Exponential backoff between attempts (20 ms doubling to `cap`, 1 s
// unless given) within a budget.
class Backoff {
 public:
  explicit Backoff(absl::Duration budget, absl::Duration cap = absl::Seconds(1))
      : give_up_(absl::Now() + budget), cap_(cap) {}
  // The wait before the next attempt; nullopt when that attempt would start
  // after the budget ran out.
  std::optional<absl::Duration> Next();
  absl::Duration left() const { return give_up_ - absl::Now(); }

 private:
  const absl::Time give_up_;
  const absl::Duration cap_;
  absl::Duration delay_ = absl::Milliseconds(20);
};

// Sleeps out the backoff's next wait; false, without sleeping, when the
// budget has run out. Hold no lock across it.
bool SleepBeforeRetry(Backoff* backoff);

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
    // Once, on the thread driving the queue: OK, or the failure that ended
    // the exchange, naming its server and `call`.
    absl::AnyInvocable<void(absl::Status) &&> done;
    // The caller waits for it, driving the queue (CompletionLoop::Drive);
    // otherwise the loop's thread is held while it runs.
    bool caller_drives = false;
    // Called (on the loop's thread) before requests that failed are sent
    // again: the first ones may still reach their server.
    std::function<void()> on_resend;
  };

  // Streams of the bidirectional method `method` (a path, e.g.
  // kPushStreamMethod), one per server of `routes` (which outlive them),
  // each opened the server's way at the time; a stream that fails with
  // requests on it as a server that is gone fails turns its server's way
  // (ServerRoutes::Failed).
  RequestStreams(CompletionLoop* loop, ServerRoutes* routes, const char* method);
  // Fails the exchanges not yet done with CANCELLED, closes the streams and
  // waits for them to end. Not on the loop's thread.
  ~RequestStreams();
  RequestStreams(const RequestStreams&) = delete;
  RequestStreams& operator=(const RequestStreams&) = delete;

  // Queues an exchange after those started before it (and starts it, if
  // none is running).
  void Start(std::unique_ptr<Exchange> exchange);
  // Breaks the streams with requests in flight: those requests fail with
  // `cause` (the running exchange with them); later exchanges go on.
  void Interrupt(const absl::Status& cause);

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

  // A finished exchange's callback and result, run once the mutex is let go.
  struct Callback {
    absl::AnyInvocable<void(absl::Status) &&> done;
    absl::Status status;
    bool release = false;  // the loop's thread was held for the exchange
  };
  void OnEvent(size_t server, Op op, bool ok);
  // Runs the callbacks of the exchanges that finished, then, if the streams
  // are closed, lets the destructor go on: the last thing this object does.
  void RunCallbacks(std::vector<Callback> callbacks, bool closed);

  void OnStreamEvent(size_t server, Op op, bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnWatchdog(bool fired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Next() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BeginAttempt() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndAttempt() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Arm(Timer* timer, absl::Time when) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Close() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the streams just closed for good (true once).
  bool JustClosed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Open(size_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Pump(size_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the stream broken (cancelling it, for `cause`, when the client is
  // the one giving up) and, once nothing is outstanding, asks for its status.
  void Break(size_t server, absl::Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishIfIdle(size_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyBusy() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Breaks every stream with requests outstanding: no progress for the patience.
  void BreakStalled() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stream `server`'s Finish came back: its requests left fail with its
  // status; a failure for good abandons the other streams' requests.
  void Finished(size_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Settle(size_t k, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool Busy(const Stream& s) { return s.starting || s.writing || s.reading || s.finishing; }
  absl::Status Annotate(const absl::Status& status, size_t server) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CompletionLoop* const loop_;
  const char* const method_;
  ServerRoutes* const routes_;
  Mutex mu_;
  std::vector<Stream> streams_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Exchange>> queue_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Exchange> current_ ABSL_GUARDED_BY(mu_);
  std::optional<Backoff> backoff_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> pending_ ABSL_GUARDED_BY(mu_);        // the current attempt's requests
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);  // per position in pending_
  size_t remaining_ ABSL_GUARDED_BY(mu_) = 0;               // unsettled in the attempt
  bool in_attempt_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_counted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time progress_ ABSL_GUARDED_BY(mu_);  // the attempt's last event
  Timer watchdog_ ABSL_GUARDED_BY(mu_);
  Timer retry_ ABSL_GUARDED_BY(mu_);
  absl::Time watchdog_due_ ABSL_GUARDED_BY(mu_);  // when the watchdog, if armed, fires
  std::vector<Callback> callbacks_ ABSL_GUARDED_BY(mu_);  // callbacks to run once unlocked
  Latch closed_{1};
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_
