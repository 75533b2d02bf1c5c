#include "server/parked_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace segps {

absl::Status ParkedCalls::Count(const Waiter& waiter, const char* call) {
  uint32_t& parked = per_worker_[waiter.id];
  if (parked >= max_per_worker_) {
    if (parked == 0) per_worker_.erase(waiter.id);
    return absl::ResourceExhaustedError(absl::StrCat(
        call, ": worker ", waiter.id, " already has ", max_per_worker_, " calls waiting on segment ", segment_,
        " (a worker has at most a few); this one is refused"));
  }
  ++parked;
  return absl::OkStatus();
}

absl::Status ParkedCalls::ParkPull(uint64_t needed, std::unique_ptr<Waiter>& waiter, const char* call) {
  if (absl::Status counted = Count(*waiter, call); !counted.ok()) return counted;
  pulls_.emplace(needed, std::move(waiter));
  return absl::OkStatus();
}

absl::Status ParkedCalls::ParkPush(std::unique_ptr<Waiter>& waiter, const char* call) {
  if (absl::Status counted = Count(*waiter, call); !counted.ok()) return counted;
  pushes_.push_back(std::move(waiter));
  return absl::OkStatus();
}

void ParkedCalls::Unpark(uint64_t id) {
  auto it = per_worker_.find(id);
  if (it != per_worker_.end() && --it->second == 0) per_worker_.erase(it);
}

std::vector<std::unique_ptr<Waiter>> ParkedCalls::TakePushes() {
  std::vector<std::unique_ptr<Waiter>> pushes;
  pushes.swap(pushes_);
  return pushes;
}

std::vector<std::unique_ptr<Waiter>> ParkedCalls::ReleasePulls(uint64_t reachable,
                                                               absl::FunctionRef<bool(const Waiter&)> ready) {
  std::vector<std::unique_ptr<Waiter>> released;
  for (auto it = pulls_.begin(); it != pulls_.end() && it->first <= reachable;) {
    if (!ready(*it->second)) {
      ++it;
      continue;
    }
    Unpark(it->second->id);
    released.push_back(std::move(it->second));
    it = pulls_.erase(it);
  }
  return released;
}

ParkedCalls::Released ParkedCalls::ReleaseIf(absl::FunctionRef<bool(const Waiter&)> release) {
  Released released;
  for (auto it = pulls_.begin(); it != pulls_.end();) {
    if (!release(*it->second)) {
      ++it;
      continue;
    }
    Unpark(it->second->id);
    released.pulls.push_back(std::move(it->second));
    it = pulls_.erase(it);
  }
  for (auto it = pushes_.begin(); it != pushes_.end();) {
    if (!release(**it)) {
      ++it;
      continue;
    }
    Unpark((*it)->id);
    released.pushes.push_back(std::move(*it));
    it = pushes_.erase(it);
  }
  return released;
}

ParkedCalls::Released ParkedCalls::ReleaseExpired(absl::Time now) {
  return ReleaseIf([now](const Waiter& w) { return w.deadline <= now; });
}

ParkedCalls::Released ParkedCalls::ReleaseOf(uint64_t id) {
  return ReleaseIf([id](const Waiter& w) { return w.id == id; });
}

std::vector<std::unique_ptr<Waiter>> ParkedCalls::ReleaseAll() {
  std::vector<std::unique_ptr<Waiter>> released;
  for (auto& [needed, waiter] : pulls_) released.push_back(std::move(waiter));
  for (auto& waiter : pushes_) released.push_back(std::move(waiter));
  pulls_.clear();
  pushes_.clear();
  per_worker_.clear();
  return released;
}

std::vector<uint64_t> ParkedCalls::Waiting() const {
  std::vector<uint64_t> ids;
  for (const auto& [needed, waiter] : pulls_) ids.push_back(waiter->id);
  for (const auto& waiter : pushes_) ids.push_back(waiter->id);
  return ids;
}

}  // namespace segps
