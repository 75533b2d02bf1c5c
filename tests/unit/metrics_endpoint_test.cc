// The metrics endpoint under clients that do not behave: one that trickles
// its request, or sends nothing, delays no other scrape and is dropped at
// its read deadline.
#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "absl/time/clock.h"

namespace segps {
namespace {

int Connect(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  return fd;
}

// A scrape: the whole answer, or what came before `limit` ran out.
std::string Scrape(const std::string& address, absl::Duration limit) {
  const int fd = Connect(address);
  const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string answer;
  char buf[4096];
  for (const absl::Time give_up = absl::Now() + limit; absl::Now() < give_up;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(give_up - absl::Now())) + 1) <= 0) break;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

TEST(MetricsEndpoint, ASlowClientDelaysNoScrapeAndIsDroppedAtItsDeadline) {
  std::unique_ptr<MetricsEndpoint> endpoint = *MetricsEndpoint::Start("127.0.0.1:0");
  endpoint->registry();
  // A client that sends a byte every 200 ms and never ends its request,
  // and one that sends nothing.
  const int trickle = Connect(endpoint->address()), silent = Connect(endpoint->address());
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread trickler([&] {
    while (!stop && send(trickle, "G", 1, MSG_NOSIGNAL) == 1) {
      ++sent;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // load, not synchronisation
    }
  });
  // Scrapes meanwhile are answered at once, not after the others' deadlines (2 s).
  for (int i = 0; i < 3; ++i) {
    const absl::Time start = absl::Now();
    const std::string answer = Scrape(endpoint->address(), absl::Seconds(1));
    EXPECT_EQ(answer.rfind("HTTP/1.0 200 OK", 0), 0u) << "scrape " << i << ": " << answer;
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  }
  // The silent client is closed at its deadline: its read sees the end.
  char byte;
  pollfd p{silent, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "the silent client was never dropped";
  EXPECT_EQ(read(silent, &byte, 1), 0);
  // And the trickling one too, however long it keeps sending.
  pollfd q{trickle, POLLIN, 0};
  ASSERT_EQ(poll(&q, 1, 10000), 1) << "the trickling client was never dropped";
  EXPECT_LE(read(trickle, &byte, 1), 0);
  EXPECT_GE(sent.load(), 5) << "the trickle stopped early: nothing was shown";
  stop = true;
  shutdown(trickle, SHUT_RDWR);
  trickler.join();
  close(trickle);
  close(silent);
}

// The endpoint is plaintext HTTP: an address other hosts reach takes
// --insecure (`insecure`); loopback does not.
TEST(MetricsEndpoint, AnAddressOtherHostsReachTakesInsecure) {
  for (const std::string refused : {"0.0.0.0:0", "[::]:0"}) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(refused);
    ASSERT_FALSE(endpoint.ok()) << refused;
    EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(endpoint.status().message().find("refusing to serve metrics on " + refused), std::string::npos)
        << endpoint.status();
    EXPECT_NE(endpoint.status().message().find("--insecure"), std::string::npos) << endpoint.status();
  }
  EXPECT_TRUE(MetricsEndpoint::Start("0.0.0.0:0", /*insecure=*/true).ok());
  for (const std::string loopback : {"0", "127.0.0.1:0", "localhost:0"}) {
    EXPECT_TRUE(MetricsEndpoint::Start(loopback).ok()) << loopback;
  }
}

}  // namespace
}  // namespace segps
