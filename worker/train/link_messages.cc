#include "worker/train/link_messages.h"

#include <cmath>
#include <cstring>
#include <optional>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/tensor_wire.h"

namespace segps {

absl::StatusOr<std::vector<float>> LinkValues(const v1::TensorSlice& slice, uint64_t count, const char* what) {
  if (slice.dtype() != v1::FLOAT32 || slice.offset() != 0 || slice.count() != count || slice.has_indices() ||
      slice.data().size() != count * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", count, " dense FLOAT32 values at offset 0, got ",
                                                   slice.count(), " of dtype ", v1::DType_Name(slice.dtype()),
                                                   " in ", slice.data().size(), " bytes"));
  }
  std::vector<float> values(count);
  DecodeFloat32(slice, absl::MakeSpan(values));
  if (std::optional<size_t> bad = FirstNonFinite(values)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": value ", *bad, " is ", values[*bad]));
  }
  return values;
}

absl::StatusOr<MicroBatch> CheckActivations(const v1::Activations& m, const LinkEnd& end) {
  if (m.model_fingerprint() != end.fingerprint || m.stage() + 1 != static_cast<uint32_t>(end.stage) ||
      m.replica() != end.replica) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Exchange: stage ", end.stage, " replica ", end.replica, " takes activations from ", end.peer,
        ", not from stage ", m.stage(), " replica ", m.replica(), " of model ", m.model_fingerprint()));
  }
  MicroBatch batch;
  batch.done = m.done();
  if (batch.done) return batch;
  batch.clock = m.clock();
  batch.epoch = m.epoch();
  batch.micro_batch = m.micro_batch();
  batch.batch_rows = m.batch_rows();
  batch.rows = m.rows();
  if (m.rows() == 0 || m.rows() > m.batch_rows() || m.labels().size() != uint64_t{m.rows()} * sizeof(int32_t)) {
    return absl::InvalidArgumentError(absl::StrCat("Exchange: micro-batch of ", m.rows(), " rows of ",
                                                   m.batch_rows(), " with ", m.labels().size(), " bytes of labels"));
  }
  absl::StatusOr<std::vector<float>> values =
      LinkValues(m.values(), uint64_t{m.rows()} * end.width, "Exchange activations");
  if (!values.ok()) return values.status();
  batch.values = *std::move(values);
  batch.labels.resize(m.rows());
  std::memcpy(batch.labels.data(), m.labels().data(), m.labels().size());
  // The last stage indexes its softmax by them, or (classes 0: loss MSE)
  // takes them as float targets.
  for (uint32_t r = 0; r < m.rows(); ++r) {
    if (end.classes == 0) {
      if (!std::isfinite(absl::bit_cast<float>(batch.labels[r]))) {
        return absl::InvalidArgumentError(absl::StrCat("Exchange: the target of row ", r, " is not finite"));
      }
    } else if (batch.labels[r] < 0 || static_cast<uint32_t>(batch.labels[r]) >= end.classes) {
      return absl::InvalidArgumentError(absl::StrCat("Exchange: label ", batch.labels[r], " of row ", r,
                                                     " is outside [0, ", end.classes, ")"));
    }
  }
  return batch;
}

}  // namespace segps
