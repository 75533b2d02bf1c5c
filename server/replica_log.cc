#include "server/replica_log.h"

#include <algorithm>
#include <utility>

namespace segps {

ReplicaLog::ReplicaLog(int segment, uint32_t range, std::vector<uint32_t> backups)
    : segment_(segment), range_(range), backups_(std::move(backups)) {
  for (uint32_t b : backups_) {
    queues_[b];
    acked_[b] = 0;
  }
}

void ReplicaLog::SetWake(std::function<void(uint32_t)> wake) {
  MutexLock lock(&mu_);
  wake_ = std::move(wake);
}

void ReplicaLog::Wake(const std::vector<uint32_t>& backups) {
  std::function<void(uint32_t)> wake;
  {
    MutexLock lock(&mu_);
    wake = wake_;
  }
  if (!wake) return;
  for (uint32_t b : backups) wake(b);
}

uint64_t ReplicaLog::Append(v1::ReplicaRecord record, Payload gradient) {
  uint64_t seq = 0;
  std::vector<uint32_t> queued;
  {
    MutexLock lock(&mu_);
    seq = ++last_;
    record.set_segment(static_cast<uint32_t>(segment_));
    record.set_range(range_);
    record.set_seq(seq);
    auto shared = std::make_shared<const ReplicaChange>(ReplicaChange{std::move(record), std::move(gradient)});
    for (auto& [backup, queue] : queues_) {
      if (dropped_.count(backup) > 0) continue;
      queue.push_back(shared);
      queued.push_back(backup);
    }
  }
  Wake(queued);
  return seq;
}

void ReplicaLog::Restart(uint32_t backup, v1::ReplicaRecord state) {
  {
    MutexLock lock(&mu_);
    auto queue = queues_.find(backup);
    if (queue == queues_.end()) return;
    state.set_segment(static_cast<uint32_t>(segment_));
    state.set_range(range_);
    state.set_seq(last_);
    dropped_.erase(backup);  // later pushes wait for it again
    queue->second.clear();
    queue->second.push_back(std::make_shared<const ReplicaChange>(ReplicaChange{std::move(state), Payload()}));
  }
  Wake({backup});
}

void ReplicaLog::Drop(uint32_t backup) {
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> ready;
  {
    MutexLock lock(&mu_);
    auto queue = queues_.find(backup);
    if (queue == queues_.end()) return;
    dropped_.insert(backup);
    queue->second.clear();
    ready = Release();
  }
  for (auto& then : ready) std::move(then)(absl::OkStatus());
}

uint64_t ReplicaLog::last() {
  MutexLock lock(&mu_);
  return last_;
}

uint64_t ReplicaLog::Held() const {
  uint64_t held = last_;
  for (const auto& [backup, seq] : acked_) {
    if (dropped_.count(backup) == 0) held = std::min(held, seq);
  }
  return held;
}

std::vector<absl::AnyInvocable<void(absl::Status) &&>> ReplicaLog::Release() {
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> ready;
  auto end = waiters_.upper_bound(Held());
  for (auto it = waiters_.begin(); it != end; ++it) ready.push_back(std::move(it->second));
  waiters_.erase(waiters_.begin(), end);
  return ready;
}

void ReplicaLog::WhenHeld(uint64_t seq, absl::AnyInvocable<void(absl::Status) &&> then) {
  absl::Status status;
  {
    MutexLock lock(&mu_);
    if (draining_.empty() && seq > Held()) {
      waiters_.emplace(seq, std::move(then));
      return;
    }
    if (!draining_.empty()) status = absl::UnavailableError(draining_);
  }
  std::move(then)(std::move(status));
}

void ReplicaLog::Acked(uint32_t backup, uint64_t seq) {
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> ready;
  {
    MutexLock lock(&mu_);
    auto acked = acked_.find(backup);
    if (acked == acked_.end() || seq <= acked->second || seq > last_) return;
    acked->second = seq;
    ready = Release();
  }
  for (auto& then : ready) std::move(then)(absl::OkStatus());
}

std::vector<ReplicaLog::Record> ReplicaLog::Take(uint32_t backup) {
  MutexLock lock(&mu_);
  auto queue = queues_.find(backup);
  if (queue == queues_.end()) return {};
  std::vector<Record> records(queue->second.begin(), queue->second.end());
  queue->second.clear();
  return records;
}

void ReplicaLog::Drain(const std::string& why) {
  Waiters failed;
  {
    MutexLock lock(&mu_);
    draining_ = why;
    failed.swap(waiters_);
  }
  for (auto& [seq, then] : failed) std::move(then)(absl::UnavailableError(why));
}

void ReplicaLog::Reopen() {
  MutexLock lock(&mu_);
  draining_.clear();
}

size_t ReplicaLog::Waiting() {
  MutexLock lock(&mu_);
  return waiters_.size();
}

}  // namespace segps
