#include "common/loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace segps {

std::vector<std::string> FreeLoopbackAddresses(size_t count) {
  std::vector<int> held;
  std::vector<std::string> addresses;
  for (size_t i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    const bool bound = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                       getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
    if (fd >= 0) held.push_back(fd);
    addresses.push_back(bound ? "127.0.0.1:" + std::to_string(ntohs(address.sin_port)) : "127.0.0.1:0");
  }
  for (int fd : held) close(fd);
  return addresses;
}

}  // namespace segps
