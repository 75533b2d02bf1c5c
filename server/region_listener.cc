#include "server/region_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace segps {
namespace {

// How long a connection may take to offer its region.
constexpr absl::Duration kOfferTimeout = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::unique_ptr<RegionListener>> RegionListener::Start(Attach attach, size_t max_bytes) {
  char random[12];
  if (getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    return absl::UnavailableError("region socket: no random name (getrandom)");
  }
  const std::string name = absl::StrCat("segps-region-", absl::BytesToHexString(absl::string_view(random, 12)));
  absl::StatusOr<int> listener = ListenAbstract(name);
  if (!listener.ok()) return listener.status();
  int stop[2];
  if (pipe2(stop, O_CLOEXEC) != 0) {
    close(*listener);
    return absl::UnavailableError(absl::StrCat("region socket: pipe: ", std::strerror(errno)));
  }
  std::unique_ptr<RegionListener> started(
      new RegionListener(std::move(attach), max_bytes, name, *listener, stop[0], stop[1]));
  started->thread_ = std::thread([l = started.get()] { l->Run(); });
  return started;
}

RegionListener::RegionListener(Attach attach, size_t max_bytes, std::string name, int listener, int stop_read,
                               int stop_write)
    : attach_(std::move(attach)), max_bytes_(max_bytes), name_(std::move(name)), listener_(listener),
      stop_read_(stop_read), stop_write_(stop_write) {}

RegionListener::~RegionListener() {
  const char byte = 0;
  if (write(stop_write_, &byte, 1) != 1) SEGPS_LOG_WARNING << "region socket: could not signal its thread to stop";
  thread_.join();
  close(listener_);
  close(stop_read_);
  close(stop_write_);
}

void RegionListener::Run() {
  while (true) {
    pollfd fds[2] = {{listener_, POLLIN, 0}, {stop_read_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      SEGPS_LOG_ERROR << "region socket @" << name_ << ": poll: " << std::strerror(errno) << "; no more regions taken";
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    absl::StatusOr<int> connection = AcceptFrom(listener_, kOfferTimeout);
    if (!connection.ok()) {
      // Out of descriptors, or a peer that went: the next poll tries again.
      SEGPS_LOG_WARNING << "region socket @" << name_ << ": " << connection.status().message();
      continue;
    }
    Serve(*connection);
    close(*connection);
  }
}

void RegionListener::Serve(int connection) {
  const absl::Status taken = Take(connection);
  v1::RegionReply reply;
  reply.set_accepted(taken.ok());
  if (!taken.ok()) {
    reply.set_error(std::string(taken.message()));
    // At most a line a second, whatever a local process sends.
    ++refused_;
    const absl::Time now = absl::Now();
    if (now - last_said_ >= absl::Seconds(1)) {
      SEGPS_LOG_WARNING << "region socket: refused a region: " << taken.message()
                        << (refused_ > 1 ? absl::StrCat(" (", refused_ - 1, " more refused since the last line)") : "");
      last_said_ = now;
      refused_ = 0;
    }
  }
  // A peer that left does not hear why; nothing changed either way.
  (void)SendFrame(connection, reply.SerializeAsString());
}

absl::Status RegionListener::Take(int connection) {
  // The offer is read first, whoever sent it, so that the refusal reaches
  // the peer rather than a reset connection.
  std::string bytes;
  int fd = -1;
  if (absl::Status received = ReceiveFrame(connection, &bytes, &fd); !received.ok()) return received;
  absl::StatusOr<uid_t> peer = PeerUid(connection);
  if (!peer.ok() || *peer != geteuid()) {
    if (fd >= 0) close(fd);
    if (!peer.ok()) return peer.status();
    return absl::PermissionDeniedError(
        absl::StrCat("the peer runs as user ", *peer, ", not as this server's user ", geteuid()));
  }
  v1::RegionOffer offer;
  if (!offer.ParseFromString(bytes)) {
    if (fd >= 0) close(fd);
    return absl::InvalidArgumentError("the offer is not a RegionOffer");
  }
  if (fd < 0) return absl::InvalidArgumentError("no region's descriptor came with the offer");
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Map(fd, max_bytes_);
  if (!region.ok()) return region.status();
  return attach_(offer, std::shared_ptr<SharedRegion>(*std::move(region)));
}

}  // namespace segps
