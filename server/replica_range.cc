#include "server/replica_range.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "common/tensor_wire.h"

namespace segps {
std::vector<float> FloatsOf(const v1::TensorSlice& slice) {
  std::vector<float> out(slice.count());
  if (!out.empty()) std::memcpy(out.data(), slice.data().data(), out.size() * sizeof(float));
  return out;
}

v1::RangeState RangeStateOf(Range extent, uint64_t steps, uint64_t updates,
                            const std::map<uint32_t, v1::RankPosition>& ranks, const std::vector<float>& values,
                            const std::vector<std::vector<float>>& slots) {
  v1::RangeState state;
  state.set_steps(steps);
  state.set_updates(updates);
  for (const auto& [rank, at] : ranks) *state.add_ranks() = at;
  auto slice = [&](const std::vector<float>& floats, v1::TensorSlice* out) {
    out->set_offset(extent.offset);
    out->set_count(floats.size());
    out->set_dtype(v1::FLOAT32);
    out->set_data(reinterpret_cast<const char*>(floats.data()), floats.size() * sizeof(float));
  };
  slice(values, state.mutable_values());
  for (const std::vector<float>& slot : slots) slice(slot, state.add_slots());
  return state;
}

std::string RangeDigest(uint64_t steps, const std::vector<float>& values,
                        const std::vector<std::vector<float>>& slots) {
  std::string bytes = absl::StrCat("steps=", steps, ";");
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  for (const std::vector<float>& slot : slots) {
    bytes.append(reinterpret_cast<const char*>(slot.data()), slot.size() * sizeof(float));
  }
  return HexFingerprint(bytes);
}

ReplicaRange::ReplicaRange(int segment, uint32_t range, Range extent, uint32_t ranks,
                           std::unique_ptr<Optimizer> optimizer)
    : segment_(segment), range_(range), extent_(extent), ranks_(ranks), optimizer_(std::move(optimizer)) {}

absl::Status ReplicaRange::CheckSlice(const v1::TensorSlice& slice, const Payload& data, const char* what) const {
  if (slice.dtype() != v1::FLOAT32 || slice.has_indices() || slice.has_region_offset() ||
      slice.offset() < extent_.offset || slice.count() > extent_.end() - slice.offset() || slice.count() == 0 ||
      data.size() != slice.count() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Replicate: segment ", segment_, " range ", range_, ": ", what, " holds elements [", slice.offset(), ", +",
        slice.count(), ") in ", data.size(), " bytes of dtype ", v1::DType_Name(slice.dtype()),
        "; the range is [", extent_.offset, ", +", extent_.count, ") of FLOAT32"));
  }
  // One vectorised pass (common/tensor_wire.h), as a worker's push is checked.
  bool finite = true;
  data.ForEachFloatBlock(v1::FLOAT32, [&](size_t, absl::Span<const float> block) {
    finite = finite && !FirstNonFinite(block).has_value();
  });
  if (!finite) {
    return absl::InvalidArgumentError(
        absl::StrCat("Replicate: segment ", segment_, " range ", range_, ": ", what, " holds a non-finite value"));
  }
  return absl::OkStatus();
}

absl::Status ReplicaRange::Take(const v1::ReplicaRecord& record, const Payload& gradient) {
  MutexLock lock(&mu_);
  if (record.has_state()) return TakeState(record.seq(), record.state());
  if (!record.has_push()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Replicate: segment ", segment_, " range ", range_, ": a record with no change"));
  }
  if (!has_state_) {
    return absl::FailedPreconditionError(absl::StrCat("Replicate: segment ", segment_, " range ", range_,
                                                      ": a push before the range's state"));
  }
  if (record.seq() != seq_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("Replicate: segment ", segment_, " range ", range_,
                                                      ": record ", record.seq(), " after record ", seq_));
  }
  SEGPS_RETURN_IF_ERROR(TakePush(record.push(), record.gradient(), gradient));
  seq_ = record.seq();
  return absl::OkStatus();
}

absl::Status ReplicaRange::TakeState(uint64_t seq, const v1::RangeState& state) {
  const std::string where = absl::StrCat("Replicate: segment ", segment_, " range ", range_, ": state");
  if (state.values().offset() != extent_.offset || state.values().count() != extent_.count) {
    return absl::InvalidArgumentError(absl::StrCat(where, " values are not the whole range"));
  }
  SEGPS_RETURN_IF_ERROR(CheckSlice(state.values(), Payload::Borrow(state.values().data()), "the state's values"));
  const size_t slots = optimizer_->SlotNames().size();
  if (static_cast<size_t>(state.slots_size()) != slots) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", state.slots_size(), " optimizer slots; the optimizer keeps ", slots));
  }
  for (const v1::TensorSlice& slot : state.slots()) {
    if (slot.offset() != extent_.offset || slot.count() != extent_.count) {
      return absl::InvalidArgumentError(absl::StrCat(where, " slot is not the whole range"));
    }
    SEGPS_RETURN_IF_ERROR(CheckSlice(slot, Payload::Borrow(slot.data()), "an optimizer slot"));
  }
  std::map<uint32_t, v1::RankPosition> positions;
  for (const v1::RankPosition& p : state.ranks()) {
    if (p.rank() >= ranks_ || p.applied() >= extent_.count || !positions.emplace(p.rank(), p).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, " names rank ", p.rank(), " at element ", p.applied(),
                                                     " (", ranks_, " ranks, each once, within the range)"));
    }
  }
  std::vector<std::vector<float>> loaded;
  for (const v1::TensorSlice& slot : state.slots()) loaded.push_back(FloatsOf(slot));
  values_ = FloatsOf(state.values());
  optimizer_->LoadState(loaded);
  positions_ = std::move(positions);
  steps_ = state.steps();
  updates_ = state.updates();
  seq_ = seq;
  has_state_ = true;
  return absl::OkStatus();
}

absl::Status ReplicaRange::TakePush(const v1::AppliedPush& push, const v1::TensorSlice& grad,
                                    const Payload& data) {
  SEGPS_RETURN_IF_ERROR(CheckSlice(grad, data, "a push's gradient"));
  const uint64_t first = grad.offset() - extent_.offset;
  if (push.rank() >= ranks_ || !std::isfinite(push.scale()) || push.step() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("Replicate: segment ", segment_, " range ", range_,
                                                   ": a push of rank ", push.rank(), " update ", push.step(),
                                                   " scale ", push.scale(), " (", ranks_, " ranks)"));
  }
  v1::RankPosition& at = positions_[push.rank()];
  // A step's chunks come in order from the range's start; a rank that
  // joined later starts at a later clock.
  const bool follows = first == 0 ? push.clock() >= at.next_clock() && at.applied() == 0
                                  : push.clock() == at.next_clock() && first == at.applied();
  if (!follows) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Replicate: segment ", segment_, " range ", range_, ": rank ", push.rank(), " clock ", push.clock(),
        " at element ", first, " does not follow clock ", at.next_clock(), " element ", at.applied()));
  }
  if (push.scale() != 0.0f) {
    // Block by block as the bytes lie (elementwise, so as the primary's one
    // pass); the lambda reaches the state through these, taken under mu_.
    Optimizer* const optimizer = optimizer_.get();
    const absl::Span<float> values = absl::MakeSpan(values_);
    data.ForEachFloatBlock(v1::FLOAT32, [&](size_t at, absl::Span<const float> block) {
      optimizer->Apply(push.step(), first + at, values.subspan(first + at, block.size()), block, push.scale());
    });
  }
  at.set_rank(push.rank());
  at.set_next_clock(push.clock());
  at.set_applied(first + grad.count());
  if (at.applied() == extent_.count) {
    at.set_next_clock(push.clock() + 1);
    at.set_applied(0);
    ++updates_;
  }
  steps_ = std::max(steps_, push.step());
  return absl::OkStatus();
}

ReplicaRange::Copy ReplicaRange::Snapshot() {
  MutexLock lock(&mu_);
  Copy copy;
  copy.has_state = has_state_;
  copy.seq = seq_;
  copy.steps = steps_;
  copy.updates = updates_;
  copy.values = values_;
  optimizer_->SaveState(&copy.slots);
  copy.ranks = positions_;
  return copy;
}

ReplicaRange::Position ReplicaRange::PositionLocked() const {
  Position at;
  at.has_state = has_state_;
  at.seq = seq_;
  at.updates = updates_;
  for (const auto& [rank, p] : positions_) at.clock = std::max(at.clock, p.next_clock());
  return at;
}

ReplicaRange::Position ReplicaRange::position() {
  MutexLock lock(&mu_);
  return PositionLocked();
}

absl::Status ReplicaRange::Read(Range chunk, absl::FunctionRef<void(absl::Span<const float>)> read, Position* at) {
  MutexLock lock(&mu_);
  *at = PositionLocked();
  if (!has_state_) {
    return absl::FailedPreconditionError(absl::StrCat("segment ", segment_, " range ", range_,
                                                      ": this server's copy holds no state yet"));
  }
  read(absl::MakeConstSpan(values_).subspan(chunk.offset - extent_.offset, chunk.count));
  return absl::OkStatus();
}

v1::ReplicaRecord ReplicaRange::StateRecord() {
  const Copy copy = Snapshot();
  v1::ReplicaRecord record;
  record.set_segment(static_cast<uint32_t>(segment_));
  record.set_range(range_);
  record.set_seq(copy.seq);
  if (copy.has_state) {
    *record.mutable_state() = RangeStateOf(extent_, copy.steps, copy.updates, copy.ranks, copy.values, copy.slots);
  }
  return record;
}

std::string ReplicaRange::Digest() {
  const Copy copy = Snapshot();
  return copy.has_state ? RangeDigest(copy.steps, copy.values, copy.slots) : "";
}

}  // namespace segps
