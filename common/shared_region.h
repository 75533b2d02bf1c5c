// The same-host transport's pieces that workers and servers share
// (cluster.shared_memory): a region of memory both map, and the Unix socket
// a worker hands it to a server over.
//
// A worker makes the region: a memfd sealed against shrinking, growing and
// further seals, so that no process holding it can make the other's
// mapping fault. It passes the descriptor over an abstract-namespace Unix
// socket the server serves (SCM_RIGHTS), with the registration's secret,
// which only the authenticated caller of Register holds; the server takes
// it only from a peer of its own user (SO_PEERCRED) and only sealed so.
// Tensor bytes then lie in the region at offsets the stream's messages
// name, each checked against the region's size like bytes on the wire.
#ifndef SEGPS_COMMON_SHARED_REGION_H_
#define SEGPS_COMMON_SHARED_REGION_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/shard_map.h"
#include "segps/v1/config.pb.h"

namespace segps {

// Whether `cluster` lets workers and servers of one host share memory
// (cluster.shared_memory, unset: yes).
inline bool SharedMemoryOn(const v1::ClusterConfig& cluster) {
  return !cluster.has_shared_memory() || cluster.shared_memory();
}

// This process's host as the same-host transport sees it: the kernel's
// boot id and the network namespace (abstract Unix sockets are per
// namespace, so containers on one host differ). Empty where /proc does not
// say: no shared memory then.
std::string SameHostIdentity();

// The largest region a worker of `map` (of job `config`) makes and a
// server maps: room for four copies of the largest segment as float32 (a
// push and a pull in flight, and the next of each), three of the most
// embedding rows a segment's step touches (a push's, its pull's and the
// next batch's: training.batch_size ids a field, at most the vocab), and
// 1 MiB, in whole pages.
size_t RegionBytesFor(const ShardMap& map, const v1::JobConfig& config);

class SharedRegion {
 public:
  // A new region of `bytes` (rounded up to whole pages), zero-filled, mapped
  // here, sealed.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(size_t bytes);
  // Maps the region behind `fd` (taken: closed here whatever the outcome).
  // Refused unless it is sealed against shrinking and growing and holds at
  // most `max_bytes`.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Map(int fd, size_t max_bytes);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }  // -1 once mapped by Map
  // Bytes [offset, offset + length) of the region; INVALID_ARGUMENT naming
  // `what` when they do not lie within it.
  absl::StatusOr<char*> At(uint64_t offset, uint64_t length, absl::string_view what) const;

 private:
  SharedRegion(char* data, size_t size, int fd) : data_(data), size_(size), fd_(fd) {}
  char* const data_;
  const size_t size_;
  const int fd_;
};

// Unix stream sockets in the abstract namespace (`name` without the
// leading NUL), close-on-exec, with send and receive timeouts of `timeout`
// on the connected ones.
absl::StatusOr<int> ListenAbstract(const std::string& name);
absl::StatusOr<int> AcceptFrom(int listener, absl::Duration timeout);
absl::StatusOr<int> ConnectAbstract(const std::string& name, absl::Duration timeout);
// The user id of a connected socket's peer (SO_PEERCRED).
absl::StatusOr<uid_t> PeerUid(int socket);

// A frame: a 4-byte little-endian length and that many bytes (at most
// kMaxFrameBytes), with `fd` beside it (SCM_RIGHTS) when not -1.
inline constexpr size_t kMaxFrameBytes = 4096;
absl::Status SendFrame(int socket, absl::string_view bytes, int fd = -1);
// The same for a frame already made (length and bytes): allocates nothing
// on success (a child process between fork and exit may call it).
absl::Status SendFramed(int socket, absl::string_view frame, int fd);
// Receives one frame into `bytes`, and into `*fd` the descriptor beside it
// (-1 when none; descriptors beyond the first are closed). Refused: a
// longer frame, one cut short.
absl::Status ReceiveFrame(int socket, std::string* bytes, int* fd);

}  // namespace segps

#endif  // SEGPS_COMMON_SHARED_REGION_H_
