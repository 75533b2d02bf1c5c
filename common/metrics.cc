#include "common/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "prometheus/text_serializer.h"

namespace segps {
namespace {

// A deliberately small HTTP/1.0 server: one thread, every request
// answered with the registry in the text exposition format. Scrapes are
// rare and small; this keeps segps free of an embedded web server and its
// interactions with the GPU libraries. It holds up to kMaxClients
// connections at once, each given kReadDeadline from its accept to send
// its request head: a client that trickles bytes, or sends none, delays
// no other scrape and is dropped at its deadline (the oldest first when
// more arrive).
class Endpoint final : public MetricsEndpoint {
 public:
  Endpoint(int fd, std::string address) : fd_(fd), address_(std::move(address)) {
    if (pipe(wake_) != 0) wake_[0] = wake_[1] = -1;
    thread_ = std::thread([this] { Serve(); });
  }
  ~Endpoint() override {
    stop_ = true;
    if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
    thread_.join();
    close(fd_);
    if (wake_[0] >= 0) close(wake_[0]), close(wake_[1]);
  }
  prometheus::Registry& registry() override { return registry_; }
  std::string address() const override { return address_; }

 private:
  static constexpr size_t kMaxClients = 16;
  static constexpr absl::Duration kReadDeadline = absl::Seconds(2);
  struct Client {
    int fd;
    std::string request;
    absl::Time deadline;
  };

  void Serve() {
    std::vector<Client> clients;
    while (!stop_) {
      std::vector<pollfd> fds = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      int timeout = -1;  // until the nearest deadline
      const absl::Time now = absl::Now();
      for (const Client& c : clients) {
        fds.push_back({c.fd, POLLIN, 0});
        const int left = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(c.deadline - now) + 1));
        timeout = timeout < 0 ? left : std::min(timeout, left);
      }
      // (poll skips a negative descriptor: the wake pipe, if it could not be made.)
      if (poll(fds.data(), fds.size(), timeout) < 0 || stop_) continue;
      for (size_t i = clients.size(); i-- > 0;) {
        const bool done = (fds[i + 2].revents != 0 && Read(&clients[i])) || absl::Now() >= clients[i].deadline;
        if (done) {
          close(clients[i].fd);
          clients.erase(clients.begin() + static_cast<ptrdiff_t>(i));
        }
      }
      if ((fds[0].revents & POLLIN) != 0) Accept(&clients);
    }
    for (const Client& c : clients) close(c.fd);
  }

  void Accept(std::vector<Client>* clients) {
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      // Out of descriptors: the listener stays readable; wait for some to be freed.
      if (errno == EMFILE || errno == ENFILE) poll(nullptr, 0, 100);
      return;
    }
    const timeval send_limit{2, 0};  // a reply the client does not read ends the answer
    setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof(send_limit));
    if (clients->size() >= kMaxClients) {
      close(clients->front().fd);  // the oldest: deadlines are in accept order
      clients->erase(clients->begin());
    }
    clients->push_back({client, "", absl::Now() + kReadDeadline});
  }

  // Reads what a client sent and answers once its request head is in (or
  // 8 KiB of it). True when the client is done with: answered, or gone.
  bool Read(Client* c) {
    char buf[1024];
    const ssize_t n = read(c->fd, buf, sizeof(buf));
    if (n <= 0) return true;
    c->request.append(buf, static_cast<size_t>(n));
    if (c->request.find("\r\n\r\n") == std::string::npos && c->request.size() < 8192) return false;
    Answer(c->fd, c->request);
    return true;
  }

  void Answer(int client, const std::string& request) {
    const bool metrics = request.rfind("GET /metrics", 0) == 0 || request.rfind("GET / ", 0) == 0;
    const std::string body = metrics ? prometheus::TextSerializer().Serialize(registry_.Collect())
                                     : "not found; try /metrics\n";
    const std::string response =
        absl::StrCat(metrics ? "HTTP/1.0 200 OK\r\n" : "HTTP/1.0 404 Not Found\r\n",
                     "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n", "Content-Length: ", body.size(),
                     "\r\nConnection: close\r\n\r\n", body);
    size_t sent = 0;
    while (sent < response.size()) {
      const ssize_t n = send(client, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

  const int fd_;
  const std::string address_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  prometheus::Registry registry_;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& listen, bool insecure) {
  // A port alone, or an empty host, is loopback: serving other hosts is
  // asked for by naming an address (0.0.0.0:PORT, [::]:PORT, a host's IP).
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  const std::string port = colon == std::string::npos ? listen : listen.substr(colon + 1);
  if (host.empty()) host = "127.0.0.1";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (port.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", listen, "': expected [HOST:]PORT"));
  }
  if (!insecure && !IsLoopbackAddress(absl::StrCat(host, ":", port))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to serve metrics on ", listen,
        " in plaintext to other hosts (they tell the job's progress and sizes): give a port alone (loopback), "
        "or pass --insecure on a network you trust"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int err = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); err != 0) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", listen, "': ", gai_strerror(err)));
  }
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 16) == 0;
  const int bind_errno = errno;
  freeaddrinfo(found);
  if (!bound) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", std::strerror(bind_errno)));
  }
  sockaddr_storage actual{};
  socklen_t len = sizeof(actual);
  getsockname(fd, reinterpret_cast<sockaddr*>(&actual), &len);
  const int bound_port = ntohs(actual.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&actual)->sin6_port
                                                             : reinterpret_cast<sockaddr_in*>(&actual)->sin_port);
  return std::unique_ptr<MetricsEndpoint>(new Endpoint(fd, absl::StrCat(host, ":", bound_port)));
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 10};
}

}  // namespace segps
