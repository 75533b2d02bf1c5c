// A worker's tensor traffic as one long-lived stream per server
// (PushStream, PullStream): a message each way per request (a push, a pull,
// or a chunk of either) instead of a call. On this 2-core machine an 8 KB
// push+pull round costs ~170 us of CPU as stream messages against ~250 us
// as unary calls, client and server together (segps-bench-transport).
//
// A stream opens on first use and stays open across steps. One that breaks
// (the server rejected a request, went away, or sent no reply in time)
// fails its unanswered requests with its status and is opened again on the
// next exchange: the server applies each (worker, clock) push once and a
// pull changes nothing, so resending is safe.
//
// Not thread-safe: one exchange at a time, driven by the calling thread.
#ifndef SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_
#define SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace segps {

class RequestStreams {
 public:
  // Streams of the bidirectional method `method` (a path, e.g.
  // kPushStreamMethod), one per channel.
  RequestStreams(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const char* method);
  ~RequestStreams();  // cancels the open streams and waits for them to end
  RequestStreams(const RequestStreams&) = delete;
  RequestStreams& operator=(const RequestStreams&) = delete;

  // Called with each reply, in the order the requests were written per server.
  using TakeReply = std::function<absl::Status(size_t request, grpc::ByteBuffer* reply)>;

  // Writes requests[j] for each j in `pending` to server servers[j]'s stream,
  // in the order of `pending`, with at most `window` unanswered per server,
  // and hands each reply to `take`. A request fails with its stream's status
  // if the stream breaks before its reply, with DEADLINE_EXCEEDED if no
  // reply or other progress comes within `patience`, or with take's error.
  // Returns the status of each request in `pending`, in the same order.
  std::vector<absl::Status> Exchange(const std::vector<size_t>& servers, const std::vector<grpc::ByteBuffer>& requests,
                                     size_t window, absl::Duration patience, const TakeReply& take,
                                     const std::vector<size_t>& pending);

 private:
  enum class Op { kStart, kWrite, kRead, kFinish };
  struct Tag {
    size_t server;
    Op op;
  };
  struct Stream {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> io;  // null: closed
    bool started = false, broken = false;
    bool starting = false, writing = false, reading = false, finishing = false;  // operations outstanding
    grpc::Status status;      // set by Finish
    absl::Status break_cause;  // why the client broke it, if it did
    grpc::ByteBuffer reply;
    std::deque<size_t> unsent, unanswered;  // positions in the exchange's `pending`
    Tag tags[4];
  };

  void Open(size_t server);
  void Pump(size_t server, size_t window, const std::vector<size_t>& pending,
            const std::vector<grpc::ByteBuffer>& requests);
  // Marks the stream broken (cancelling it, for `cause`, when the client is
  // the one giving up) and, once nothing is outstanding, asks for its status.
  void Break(size_t server, absl::Status cause);
  void FinishIfIdle(size_t server);
  bool AnyBusy() const;
  // Breaks every stream with requests outstanding: no progress for `patience`.
  void BreakStalled(absl::Duration patience);
  // Stream `server`'s Finish came back: its requests left fail with its
  // status (`settle`); a failure for good abandons the other streams' requests.
  void Finished(size_t server, absl::FunctionRef<void(size_t, absl::Status)> settle);
  bool Busy(const Stream& s) const { return s.starting || s.writing || s.reading || s.finishing; }

  const char* const method_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::vector<Stream> streams_;
  grpc::CompletionQueue cq_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_REQUEST_STREAMS_H_
