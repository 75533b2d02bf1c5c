#include "common/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace segps {
namespace {

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

absl::Status Errno(absl::string_view what) {
  const int error = errno;
  return absl::Status(error == EAGAIN || error == ETIMEDOUT ? absl::StatusCode::kDeadlineExceeded
                                                             : absl::StatusCode::kUnavailable,
                      absl::StrCat(what, ": ", std::strerror(error)));
}

// The abstract address of `name` and its length.
socklen_t Address(const std::string& name, sockaddr_un* address) {
  std::memset(address, 0, sizeof(*address));
  address->sun_family = AF_UNIX;
  const size_t length = std::min(name.size(), sizeof(address->sun_path) - 1);
  std::memcpy(address->sun_path + 1, name.data(), length);  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
}

void SetTimeouts(int socket, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

std::string SameHostIdentity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(boot, id) || id.empty()) return "";
  char net[128] = {};
  const ssize_t n = readlink("/proc/self/ns/net", net, sizeof(net) - 1);
  if (n <= 0) return "";
  return absl::StrCat(id, " ", absl::string_view(net, static_cast<size_t>(n)));
}

size_t RegionBytesFor(const ShardMap& map, const v1::JobConfig& config) {
  uint64_t largest = 0, rows = 0;  // floats
  for (int s = 0; s < map.num_segments(); ++s) {
    largest = std::max<uint64_t>(largest, map.segment_size(s));
    uint64_t step = 0;
    for (const v1::EmbeddingConfig& table : config.model().segments(s).embeddings()) {
      const uint64_t ids = std::min<uint64_t>(table.vocab(), uint64_t{config.training().batch_size()} * table.field_size());
      step += ids * table.dim();
    }
    rows = std::max(rows, step);
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = static_cast<size_t>((largest * 4 + rows * 3) * sizeof(float) + (size_t{1} << 20));
  return (bytes + page - 1) / page * page;
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bytes = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  const int fd = memfd_create("segps-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    absl::Status failed = Errno("sealing the region");
    close(fd);
    return failed;
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    absl::Status failed = Errno("mapping the region");
    close(fd);
    return failed;
  }
  return std::unique_ptr<SharedRegion>(new SharedRegion(static_cast<char*>(data), bytes, fd));
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Map(int fd, size_t max_bytes) {
  auto refuse = [fd](absl::string_view why) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared region: ", why));
  };
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (static_cast<unsigned>(seals) & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return refuse("not a memfd sealed against shrinking and growing");
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return refuse("its size cannot be read, or it is empty");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return refuse(absl::StrCat(st.st_size, " bytes, more than the ", max_bytes, " this model's regions take"));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    absl::Status failed = Errno("shared region: mapping it");
    close(fd);
    return failed;
  }
  close(fd);
  return std::unique_ptr<SharedRegion>(new SharedRegion(static_cast<char*>(data), bytes, -1));
}

SharedRegion::~SharedRegion() {
  munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<char*> SharedRegion::At(uint64_t offset, uint64_t length, absl::string_view what) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bytes [", offset, ", +", length,
                                                   ") do not lie within the shared region of ", size_, " bytes"));
  }
  return data_ + offset;
}

absl::StatusOr<int> ListenAbstract(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_un address;
  const socklen_t length = Address(name, &address);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 || listen(fd, 64) != 0) {
    absl::Status failed = Errno(absl::StrCat("listening on @", name));
    close(fd);
    return failed;
  }
  return fd;
}

absl::StatusOr<int> AcceptFrom(int listener, absl::Duration timeout) {
  const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return Errno("accept");
  SetTimeouts(fd, timeout);
  return fd;
}

absl::StatusOr<int> ConnectAbstract(const std::string& name, absl::Duration timeout) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  SetTimeouts(fd, timeout);
  sockaddr_un address;
  const socklen_t length = Address(name, &address);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    absl::Status failed = Errno(absl::StrCat("connecting to @", name));
    close(fd);
    return failed;
  }
  return fd;
}

absl::StatusOr<uid_t> PeerUid(int socket) {
  ucred credentials;
  socklen_t length = sizeof(credentials);
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return Errno("SO_PEERCRED");
  return credentials.uid;
}

absl::Status SendFrame(int socket, absl::string_view bytes, int fd) {
  if (bytes.size() > kMaxFrameBytes) return absl::InvalidArgumentError("frame too long");
  std::string frame(4, '\0');
  const uint32_t length = static_cast<uint32_t>(bytes.size());
  for (int b = 0; b < 4; ++b) frame[b] = static_cast<char>((length >> (8 * b)) & 0xff);
  frame.append(bytes.data(), bytes.size());
  return SendFramed(socket, frame, fd);
}

absl::Status SendFramed(int socket, absl::string_view frame, int fd) {
  iovec io{const_cast<char*>(frame.data()), frame.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  }
  const ssize_t sent = sendmsg(socket, &message, MSG_NOSIGNAL);
  if (sent < 0) return Errno("sending a frame");
  // The descriptor went with the first byte; the rest, if any, follows plainly.
  for (size_t at = static_cast<size_t>(sent); at < frame.size();) {
    const ssize_t more = send(socket, frame.data() + at, frame.size() - at, MSG_NOSIGNAL);
    if (more <= 0) return Errno("sending a frame");
    at += static_cast<size_t>(more);
  }
  return absl::OkStatus();
}

absl::Status ReceiveFrame(int socket, std::string* bytes, int* fd) {
  *fd = -1;
  std::string frame(4 + kMaxFrameBytes, '\0');
  size_t have = 0, want = 4;
  while (have < want) {
    iovec io{frame.data() + have, want - have};
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t got = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    if (got < 0) return Errno("receiving a frame");
    for (cmsghdr* h = CMSG_FIRSTHDR(&message); h != nullptr; h = CMSG_NXTHDR(&message, h)) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t k = 0; k < count; ++k) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(h) + k * sizeof(int), sizeof(int));
        if (*fd < 0) {
          *fd = received;
        } else {
          close(received);
        }
      }
    }
    if (got == 0 || (message.msg_flags & MSG_CTRUNC) != 0) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
      return absl::InvalidArgumentError(got == 0 ? "the frame was cut short" : "too many descriptors beside the frame");
    }
    have += static_cast<size_t>(got);
    if (want == 4 && have >= 4) {
      uint32_t length = 0;
      for (int b = 0; b < 4; ++b) length |= static_cast<uint32_t>(static_cast<unsigned char>(frame[b])) << (8 * b);
      if (length > kMaxFrameBytes) {
        if (*fd >= 0) close(*fd);
        *fd = -1;
        return absl::InvalidArgumentError(absl::StrCat("a frame of ", length, " bytes, more than ", kMaxFrameBytes));
      }
      want = 4 + length;
    }
  }
  bytes->assign(frame.data() + 4, want - 4);
  return absl::OkStatus();
}

}  // namespace segps
