// Early return on error, for functions returning absl::Status or StatusOr.
#ifndef SEGPS_COMMON_STATUS_MACROS_H_
#define SEGPS_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"

#define SEGPS_RETURN_IF_ERROR(expr)    \
  do {                                 \
    absl::Status _segps_status = (expr); \
    if (!_segps_status.ok()) return _segps_status; \
  } while (0)

#endif  // SEGPS_COMMON_STATUS_MACROS_H_
