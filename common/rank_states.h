// The servers' states of one rank of a segment, as their Register answers
// give them (v1::SealedRankState): when they disagree, the segment's
// servers no longer hold the same steps of that rank, and the worker rolls
// the segment back to a checkpoint they share (docs/recovery.md). Workers
// decide it; a server asked to roll back decides it again from the states
// the worker forwards, rather than trusting the worker.
#ifndef SEGPS_COMMON_RANK_STATES_H_
#define SEGPS_COMMON_RANK_STATES_H_

#include <string>

#include "google/protobuf/repeated_ptr_field.h"
#include "segps/v1/parameter_server.pb.h"

namespace segps {

using RankStates = google::protobuf::RepeatedPtrField<v1::SealedRankState>;

// True when some server applied the rank's step only partly, when servers
// hold the rank at different clocks, or when some know the rank and others
// do not.
bool StatesDisagree(const RankStates& states);

// "server 0 at 12, server 1 at none (partly applied)": for logs and errors.
std::string DescribeStates(const RankStates& states);

}  // namespace segps

#endif  // SEGPS_COMMON_RANK_STATES_H_
