#include "worker/client/unary_fan_out.h"

#include <vector>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "worker/client/request_streams.h"

namespace segps {
namespace {

// One attempt at the calls to the servers in `pending`: the status of each.
std::vector<absl::Status> RunCalls(absl::Duration per_call, const StartUnary& start,
                                   const std::vector<size_t>& pending) {
  // The calling thread drives the queue: replies reach it without a
  // hand-off from another thread (latency on a busy machine).
  grpc::CompletionQueue cq;
  const size_t count = pending.size();
  std::vector<grpc::ClientContext> contexts(count);
  std::vector<UnaryCall> calls(count);
  for (size_t k = 0; k < count; ++k) {
    contexts[k].set_deadline(absl::ToChronoTime(absl::Now() + per_call));
    calls[k].index = k;
    start(pending[k], &contexts[k], &cq, &calls[k]);
  }
  std::vector<absl::Status> results(count);
  for (size_t done = 0; done < count; ++done) {
    void* tag = nullptr;
    bool ok = false;
    cq.Next(&tag, &ok);  // a unary call's Finish always completes, ok or not
    const size_t k = static_cast<UnaryCall*>(tag)->index;
    results[k] = FromGrpcStatus(calls[k].status);
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return results;
}

}  // namespace

absl::Status UnaryFanOut(ServerRoutes* routes, absl::Duration budget, absl::Duration per_call,
                         const StartUnary& start,
                         const std::function<absl::Status(const absl::Status&, size_t)>& annotate) {
  std::vector<size_t> pending(routes->size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  Backoff backoff(budget, routes->retry_cap());
  while (true) {
    std::vector<absl::Status> results = RunCalls(per_call, start, pending);
    std::vector<size_t> failed;  // to retry, if every failure is transient
    absl::Status first_failure;
    for (size_t k = 0; k < pending.size(); ++k) {
      if (results[k].ok()) continue;
      if (!IsTransient(results[k])) return annotate(results[k], pending[k]);
      if (failed.empty()) first_failure = annotate(results[k], pending[k]);
      failed.push_back(pending[k]);
      routes->Failed(pending[k]);
    }
    if (failed.empty()) return absl::OkStatus();
    if (!SleepBeforeRetry(&backoff)) return first_failure;
    pending = std::move(failed);
  }
}

}  // namespace segps
