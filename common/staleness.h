// The stale-synchronous-parallel rule, shared by the servers (which make a
// pull wait until it holds) and the workers (which decide whether the
// parameters they have may serve a step): a worker may compute clock c with
// parameters that reflect every worker's steps below ClockNeeded(c, s).
// s = 0 is synchronous; s = -1 (unbounded) never waits.
#ifndef SEGPS_COMMON_STALENESS_H_
#define SEGPS_COMMON_STALENESS_H_

#include <cstdint>

namespace segps {

constexpr uint64_t ClockNeeded(uint64_t clock, int32_t staleness) {
  return staleness < 0 || clock <= static_cast<uint64_t>(staleness) ? 0 : clock - static_cast<uint64_t>(staleness);
}

// Whether parameters reflecting clock `have` may serve step `clock`.
constexpr bool FreshEnough(uint64_t have, uint64_t clock, int32_t staleness) {
  return have >= ClockNeeded(clock, staleness);
}

}  // namespace segps

#endif  // SEGPS_COMMON_STALENESS_H_
