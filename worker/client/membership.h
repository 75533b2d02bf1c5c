// A worker's membership in the cluster apart from any transport: which
// failures it survives by registering again, and rejoining with backoff
// within the recovery budget. Time comes from an injected Clock, so that
// recovery is tested without waiting.
#ifndef SEGPS_WORKER_CLIENT_MEMBERSHIP_H_
#define SEGPS_WORKER_CLIENT_MEMBERSHIP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/client/ps_client.h"

namespace segps {

// Failures a worker recovers from by registering again: a server that
// restarted, was paused past the lease, is unreachable or dropped this
// registration (a rollback). Anything else (a config mismatch, a bad
// request, a broken device) ends the worker.
bool Recoverable(const absl::Status& status);

// Registers `rank` of `segment` again after a failure. Servers still
// unreachable or recovering (a transient refusal) are retried with backoff
// (50 ms, doubling up to 1 s) until `timeout` has passed on `clock`; any
// other refusal (another model, a server restarted without its
// checkpoints) is final. `tag` names the worker in the error.
absl::StatusOr<Registration> Rejoin(ParameterClient* client, int segment, uint32_t rank, absl::Duration timeout,
                                    Clock* clock, const std::string& tag);

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_MEMBERSHIP_H_
