// How a call reaches server i's ranges (cluster.replicas;
// docs/replication.md): at server i, or, once a majority found server i
// gone and its first backup took its ranges over, at that backup, with the
// call naming server i in this header. A server given a call for another
// serves it only for ranges it took over (UNAVAILABLE otherwise).
#ifndef SEGPS_COMMON_SERVER_ROUTE_H_
#define SEGPS_COMMON_SERVER_ROUTE_H_

namespace segps {

inline constexpr char kServerHeader[] = "segps-server";

}  // namespace segps

#endif  // SEGPS_COMMON_SERVER_ROUTE_H_
