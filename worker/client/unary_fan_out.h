// The control calls (heartbeat, leave, stats) a client makes to every
// server at once, as unary gRPC calls on a completion queue the calling
// thread drives: retried where they failed transiently, backing off.
#ifndef SEGPS_WORKER_CLIENT_UNARY_FAN_OUT_H_
#define SEGPS_WORKER_CLIENT_UNARY_FAN_OUT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/client/server_routes.h"

namespace segps {

// One call of a fan-out: its status, and its reader, which must outlive it.
struct UnaryCall {
  size_t index = 0;  // within the attempt
  grpc::Status status;
  std::shared_ptr<void> reader;
  template <typename Response>
  void Start(std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> call, Response* response) {
    call->StartCall();
    call->Finish(response, &status, this);
    reader = std::move(call);
  }
};
// Starts the call to server i on the queue, with UnaryCall::Start.
using StartUnary = std::function<void(size_t, grpc::ClientContext*, grpc::CompletionQueue*, UnaryCall*)>;

// Calls every server of `routes` at once and waits for all; retries the
// ones that failed transiently, each attempt with deadline `per_call`, the
// server's other way next (ServerRoutes::Failed), until one failed for good
// or `budget` ran out. A failure is returned as `annotate(status, server)`
// names it.
absl::Status UnaryFanOut(ServerRoutes* routes, absl::Duration budget, absl::Duration per_call,
                         const StartUnary& start,
                         const std::function<absl::Status(const absl::Status&, size_t)>& annotate);

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_UNARY_FAN_OUT_H_
