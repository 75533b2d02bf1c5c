// The one place where absl::Status and grpc::Status meet. Servers convert on
// the way out, clients on the way in; everything else speaks absl::Status.
#ifndef SEGPS_COMMON_GRPC_STATUS_H_
#define SEGPS_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace segps {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Transient failures a client should retry with backoff: the peer is not
// reachable yet, restarting, or asked us to come back (UNAVAILABLE), or the
// call ran out of time.
bool IsTransient(const absl::Status& status);

}  // namespace segps

#endif  // SEGPS_COMMON_GRPC_STATUS_H_
