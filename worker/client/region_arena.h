// A worker's end of the same-host transport (cluster.shared_memory,
// common/shared_region.h): one region per client, handed to each server of
// the host, and cut into blocks: a push's encoded gradient (its storage)
// and a pull's landing place are blocks, so that the gradient is written
// once, where the server reads it, and the values once, where the server
// puts them.
//
// A block goes back to the arena when its last holder lets go, unless it
// was retired: a request that was sent again, or whose stream broke, may
// still be read or answered by the server after the exchange is over, so
// its blocks are never handed out again. When the arena has no room, a
// caller gets no block and its tensors go in the messages as over TCP.
//
// Thread-safe.
#ifndef SEGPS_WORKER_CLIENT_REGION_ARENA_H_
#define SEGPS_WORKER_CLIENT_REGION_ARENA_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/shared_region.h"
#include "common/sync.h"

namespace segps {

class RegionArena : public std::enable_shared_from_this<RegionArena> {
 public:
  // A region of `bytes`; null (logged) where this host cannot make one.
  static std::shared_ptr<RegionArena> Create(size_t bytes);

  // A block of `bytes` (64-byte aligned), back to the arena when the last
  // copy of the pointer goes; null when there is no room.
  std::shared_ptr<char> Allocate(size_t bytes);
  // Where `p` lies in the region, if it does.
  std::optional<uint64_t> OffsetOf(const void* p) const;
  // The block holding `p`, if any, is never handed out again.
  void Retire(const void* p);

  // Hands the region to a server's RegionListener (`socket`) for the
  // registration (`worker_id`, `secret`); the server's refusal, if any.
  absl::Status Offer(const std::string& socket, uint64_t worker_id, const std::string& secret,
                     absl::Duration timeout) const;

  size_t size() const { return region_->size(); }
  // Bytes handed out and not back (retired ones included), for tests.
  size_t used();
  // Bytes of retired blocks.
  size_t retired();

 private:
  explicit RegionArena(std::unique_ptr<SharedRegion> region);
  void Free(uint64_t offset);

  const std::unique_ptr<SharedRegion> region_;
  Mutex mu_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes, coalesced
  struct Block {
    uint64_t bytes = 0;
    bool retired = false;
  };
  std::map<uint64_t, Block> used_ ABSL_GUARDED_BY(mu_);  // by offset
  bool said_full_ ABSL_GUARDED_BY(mu_) = false;  // a failed Allocate was logged, none succeeded since
};

// A client's arena for the registrations to come. Retired blocks never come
// back, so a job that recovers again and again would fill its region: a
// registration (no call of the client in flight) first renews an arena
// that has retired blocks with a fresh region, which the servers then take
// for the new registrations. Blocks of the old one stay valid while held;
// the servers' old mappings go with the registrations they served.
// Thread-safe.
class RegionHolder {
 public:
  // The first arena, of `bytes` (none where this host cannot make one).
  explicit RegionHolder(size_t bytes) : bytes_(bytes), arena_(RegionArena::Create(bytes)) {}
  std::shared_ptr<RegionArena> get() {
    MutexLock lock(&mu_);
    return arena_;
  }
  void Renew();

 private:
  const size_t bytes_;
  Mutex mu_;
  std::shared_ptr<RegionArena> arena_ ABSL_GUARDED_BY(mu_);
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_REGION_ARENA_H_
