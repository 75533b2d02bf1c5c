// Loopback ports for processes that must know each other's addresses
// before any of them listens (cluster.replicas: every server is told every
// server's address).
#ifndef SEGPS_COMMON_LOOPBACK_H_
#define SEGPS_COMMON_LOOPBACK_H_

#include <string>
#include <vector>

namespace segps {

// `count` distinct "127.0.0.1:PORT" addresses whose ports no socket holds
// now (all held at once while they are chosen, so no two are alike). Another
// process may still take one before it is bound: servers listen without
// SO_REUSEPORT, so that shows as a server that cannot listen, never as two
// servers on one port.
std::vector<std::string> FreeLoopbackAddresses(size_t count);

}  // namespace segps

#endif  // SEGPS_COMMON_LOOPBACK_H_
