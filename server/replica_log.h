// A primary's changes to one range of one segment on their way to the
// range's backups (cluster.replicas; proto/segps/v1/replication.proto).
//
// The segment's shard appends each change under its own lock, in the order
// it makes them, and the change gets the range's next sequence number.
// Each backup has a queue its link (server/replica_links.h) takes records
// from; when a link (re)opens, the shard restarts that backup's queue with
// the range's whole state, stamped with the last sequence number, since
// records in flight may be lost with the old stream. A backup acknowledges
// a sequence number once it took every record through it; a push waits
// (WhenHeld) until every live backup has, and only then is it acknowledged
// to its worker. A backup out of reach for a lease is dropped: pushes no
// longer wait for it, and it queues nothing, until its link opens again
// and restarts it from the whole state.
//
// Thread safety: every method is safe to call concurrently.
#ifndef SEGPS_SERVER_REPLICA_LOG_H_
#define SEGPS_SERVER_REPLICA_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "common/sync.h"
#include "common/tensor_wire.h"
#include "segps/v1/replication.pb.h"

namespace segps {

// A change as a log holds it: the record and, for a push, its gradient's
// bytes apart from it (the record's gradient has no data), held here as
// long as the change is (server/replica_wire.h sends them as they lie).
struct ReplicaChange {
  v1::ReplicaRecord record;
  Payload gradient;
};

class ReplicaLog {
 public:
  using Record = std::shared_ptr<const ReplicaChange>;
  // The log of range `range` of `segment`, for the servers `backups`.
  ReplicaLog(int segment, uint32_t range, std::vector<uint32_t> backups);

  // A change for every backup (its segment, range and seq are set here),
  // a push's gradient bytes `gradient` (with an owner, see Payload): its seq.
  uint64_t Append(v1::ReplicaRecord record, Payload gradient = Payload());
  // Backup `backup`'s link opened: its queue is the range's whole `state`
  // from now on, holding every change through the last seq.
  void Restart(uint32_t backup, v1::ReplicaRecord state);
  // Backup `backup` is out of reach: the waits release without it, and it
  // queues nothing, until Restart.
  void Drop(uint32_t backup);
  // The last seq given.
  uint64_t last();

  // Runs `then` (OK) once every backup has taken every record through
  // `seq`: at once if they have. Drain runs it with UNAVAILABLE instead.
  void WhenHeld(uint64_t seq, absl::AnyInvocable<void(absl::Status) &&> then);
  // Backup `backup` took every record through `seq`.
  void Acked(uint32_t backup, uint64_t seq);
  // The records waiting for `backup`'s link, oldest first, taken off its queue.
  std::vector<Record> Take(uint32_t backup);
  // Called (without the log's lock) when `backup`'s queue gains a record.
  void SetWake(std::function<void(uint32_t backup)> wake);
  // Fails the waits now and later with UNAVAILABLE (`why`): the server stops.
  void Drain(const std::string& why);
  // Waits again after Drain.
  void Reopen();
  // Pushes waiting for their backups now (tests observe a wait).
  size_t Waiting();

  int segment() const { return segment_; }
  uint32_t range() const { return range_; }
  const std::vector<uint32_t>& backups() const { return backups_; }

 private:
  using Waiters = std::multimap<uint64_t, absl::AnyInvocable<void(absl::Status) &&>>;
  // The seq every live backup took.
  uint64_t Held() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the waits that every live backup now holds.
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> Release() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the links of the backups that gained a record.
  void Wake(const std::vector<uint32_t>& backups);

  const int segment_;
  const uint32_t range_;
  const std::vector<uint32_t> backups_;
  Mutex mu_;
  uint64_t last_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, std::deque<Record>> queues_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> acked_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> dropped_ ABSL_GUARDED_BY(mu_);
  Waiters waiters_ ABSL_GUARDED_BY(mu_);
  std::string draining_ ABSL_GUARDED_BY(mu_);
  std::function<void(uint32_t)> wake_ ABSL_GUARDED_BY(mu_);
};

}  // namespace segps

#endif  // SEGPS_SERVER_REPLICA_LOG_H_
