#include "worker/client/region_arena.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "segps/v1/parameter_server.pb.h"

namespace segps {
namespace {

constexpr uint64_t kAlign = 64;

}  // namespace

std::shared_ptr<RegionArena> RegionArena::Create(size_t bytes) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(bytes);
  if (!region.ok()) {
    SEGPS_LOG_WARNING << "shared memory is off for this worker: " << region.status().message();
    return nullptr;
  }
  return std::shared_ptr<RegionArena>(new RegionArena(*std::move(region)));
}

RegionArena::RegionArena(std::unique_ptr<SharedRegion> region) : region_(std::move(region)) {
  free_[0] = region_->size();
}

std::shared_ptr<char> RegionArena::Allocate(size_t bytes) {
  const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  uint64_t offset = 0;
  {
    MutexLock lock(&mu_);
    auto it = free_.begin();
    while (it != free_.end() && it->second < rounded) ++it;
    if (it == free_.end()) {
      if (!said_full_) {
        SEGPS_LOG_WARNING << "the shared region has no room for " << rounded << " bytes (" << region_->size()
                          << " bytes, blocks of requests sent again kept out of use): tensors go in messages until "
                             "blocks come back";
      }
      said_full_ = true;
      return nullptr;
    }
    said_full_ = false;
    offset = it->first;
    const uint64_t left = it->second - rounded;
    free_.erase(it);
    if (left > 0) free_[offset + rounded] = left;
    used_[offset] = {rounded, false};
  }
  return std::shared_ptr<char>(region_->data() + offset,
                               [arena = shared_from_this(), offset](char*) { arena->Free(offset); });
}

void RegionArena::Free(uint64_t offset) {
  MutexLock lock(&mu_);
  auto it = used_.find(offset);
  if (it == used_.end() || it->second.retired) return;  // a retired block stays out
  uint64_t begin = offset, bytes = it->second.bytes;
  used_.erase(it);
  auto next = free_.lower_bound(begin);
  if (next != free_.end() && next->first == begin + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == begin) {
      begin = previous->first;
      bytes += previous->second;
      free_.erase(previous);
    }
  }
  free_[begin] = bytes;
}

std::optional<uint64_t> RegionArena::OffsetOf(const void* p) const {
  const char* c = static_cast<const char*>(p);
  if (c < region_->data() || c >= region_->data() + region_->size()) return std::nullopt;
  return static_cast<uint64_t>(c - region_->data());
}

void RegionArena::Retire(const void* p) {
  const std::optional<uint64_t> at = OffsetOf(p);
  if (!at.has_value()) return;
  MutexLock lock(&mu_);
  auto it = used_.upper_bound(*at);
  if (it == used_.begin()) return;
  --it;
  if (*at < it->first + it->second.bytes) it->second.retired = true;
}

size_t RegionArena::used() {
  MutexLock lock(&mu_);
  size_t bytes = 0;
  for (const auto& [offset, block] : used_) bytes += block.bytes;
  return bytes;
}

size_t RegionArena::retired() {
  MutexLock lock(&mu_);
  size_t bytes = 0;
  for (const auto& [offset, block] : used_) bytes += block.retired ? block.bytes : 0;
  return bytes;
}

void RegionHolder::Renew() {
  std::shared_ptr<RegionArena> current = get();
  if (current == nullptr || current->retired() == 0) return;
  std::shared_ptr<RegionArena> fresh = RegionArena::Create(bytes_);
  if (fresh == nullptr) return;
  SEGPS_LOG_INFO << "a fresh shared region replaces one with " << current->retired()
                 << " bytes kept out of use by requests sent again";
  MutexLock lock(&mu_);
  arena_ = std::move(fresh);
}

absl::Status RegionArena::Offer(const std::string& socket, uint64_t worker_id, const std::string& secret,
                                absl::Duration timeout) const {
  absl::StatusOr<int> connection = ConnectAbstract(socket, timeout);
  if (!connection.ok()) return connection.status();
  v1::RegionOffer offer;
  offer.set_worker_id(worker_id);
  offer.set_registration_secret(secret);
  absl::Status status = SendFrame(*connection, offer.SerializeAsString(), region_->fd());
  std::string bytes;
  int fd = -1;
  if (status.ok()) status = ReceiveFrame(*connection, &bytes, &fd);
  if (fd >= 0) close(fd);
  close(*connection);
  if (!status.ok()) return status;
  v1::RegionReply reply;
  if (!reply.ParseFromString(bytes)) return absl::DataLossError("the server's answer is not a RegionReply");
  if (!reply.accepted()) return absl::FailedPreconditionError(absl::StrCat("the server refused it: ", reply.error()));
  return absl::OkStatus();
}

}  // namespace segps
