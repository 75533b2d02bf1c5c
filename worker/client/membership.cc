#include "worker/client/membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace segps {

bool Recoverable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<Registration> Rejoin(ParameterClient* client, int segment, uint32_t rank, absl::Duration timeout,
                                    Clock* clock, const std::string& tag) {
  const absl::Time since = clock->Now();
  absl::Duration delay = absl::Milliseconds(50);
  absl::StatusOr<Registration> again = client->Register(segment, rank);
  while (!again.ok()) {
    if (!IsTransient(again.status()) || clock->Now() + delay - since > timeout) {
      return absl::Status(again.status().code(),
                          absl::StrCat(tag, ": could not rejoin the servers within ", absl::FormatDuration(timeout),
                                       " (cluster.recovery_timeout_ms): ", again.status().message()));
    }
    clock->SleepFor(delay);
    delay = std::min(delay * 2, absl::Seconds(1));
    again = client->Register(segment, rank);
  }
  return again;
}

}  // namespace segps
