// A backup's copy of one range of one segment (cluster.replicas): the
// values, the optimizer's state and each rank's position, changed only by
// the range's primary's records (proto/segps/v1/replication.proto), each
// taken once and in order. A record that is not the next one, or that does
// not fit the range, is refused naming what is wrong and changes nothing.
//
// The primary applies a push with the same optimizer, update number, scale
// and float32 gradient, so a copy's values and state equal the primary's
// bit for bit after the same records.
//
// Thread safety: every method is safe to call concurrently.
#ifndef SEGPS_SERVER_REPLICA_RANGE_H_
#define SEGPS_SERVER_REPLICA_RANGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/shard_map.h"
#include "common/sync.h"
#include "common/tensor_wire.h"
#include "segps/v1/replication.pb.h"
#include "server/optimizer.h"

namespace segps {

class ReplicaRange {
 public:
  // The copy of range `range` (its index) of segment `segment`, which holds
  // `extent` of the segment's elements; `ranks` is the segment's rank count.
  ReplicaRange(int segment, uint32_t range, Range extent, uint32_t ranks, std::unique_ptr<Optimizer> optimizer);

  // A push record's gradient bytes are `gradient` (as the Replicate
  // stream's slices or a ReplicaChange hold them), not its data field; a
  // state record has none.
  absl::Status Take(const v1::ReplicaRecord& record, const Payload& gradient);

  // What the copy holds: before its first state, nothing (seq 0, no values).
  struct Copy {
    bool has_state = false;
    uint64_t seq = 0;  // every record through it is taken
    uint64_t steps = 0;
    uint64_t updates = 0;
    std::vector<float> values;
    std::vector<std::vector<float>> slots;
    std::map<uint32_t, v1::RankPosition> ranks;
  };
  Copy Snapshot();
  // Where the copy stands, as the primary's SegmentStats would say it with
  // no live worker: the highest next clock over the ranks, the steps
  // completed. All 0 before its first state.
  struct Position {
    bool has_state = false;
    uint64_t seq = 0, clock = 0, updates = 0;
  };
  Position position();
  // Hands `read` the copy's values of `chunk` (segment offsets, within the
  // range) under its lock, and says where the copy stands in `at`.
  // FAILED_PRECONDITION before its first state.
  absl::Status Read(Range chunk, absl::FunctionRef<void(absl::Span<const float>)> read, Position* at);
  // The copy as a record of its state (Fetch); no change before its first state.
  v1::ReplicaRecord StateRecord();
  // A digest of values, optimizer state and update count, comparable with
  // the primary's (RangeDigest).
  std::string Digest();

  int segment() const { return segment_; }
  uint32_t range() const { return range_; }

 private:
  absl::Status TakeState(uint64_t seq, const v1::RangeState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TakePush(const v1::AppliedPush& push, const v1::TensorSlice& grad, const Payload& data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `slice`, whose bytes are `data`, holds exactly elements [offset, offset
  // + count) of the range as finite FLOAT32 values.
  absl::Status CheckSlice(const v1::TensorSlice& slice, const Payload& data, const char* what) const;
  Position PositionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int segment_;
  const uint32_t range_;
  const Range extent_;
  const uint32_t ranks_;
  Mutex mu_;
  std::unique_ptr<Optimizer> optimizer_ ABSL_GUARDED_BY(mu_);
  bool has_state_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t updates_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, v1::RankPosition> positions_ ABSL_GUARDED_BY(mu_);
};

// A range's whole state as a record's (both sides): the values and the
// optimizer's slots of `extent`, as float32 slices.
v1::RangeState RangeStateOf(Range extent, uint64_t steps, uint64_t updates,
                            const std::map<uint32_t, v1::RankPosition>& ranks, const std::vector<float>& values,
                            const std::vector<std::vector<float>>& slots);

// A float32 slice's values (checked by the caller: data holds count floats).
std::vector<float> FloatsOf(const v1::TensorSlice& slice);

// The digest ReplicaRange::Digest gives for these contents (the primary's side).
std::string RangeDigest(uint64_t steps, const std::vector<float>& values,
                        const std::vector<std::vector<float>>& slots);

}  // namespace segps

#endif  // SEGPS_SERVER_REPLICA_RANGE_H_
