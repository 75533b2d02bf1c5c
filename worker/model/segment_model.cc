#include "worker/model/segment_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/shard_map.h"
#include "common/status_macros.h"

namespace segps {

absl::StatusOr<SegmentModel> SegmentModel::Create(Backend* backend, const v1::ModelConfig& model,
                                                  int segment, int max_batch) {
  if (segment < 0 || segment >= model.segments_size()) {
    return absl::InvalidArgumentError(absl::StrCat("segment ", segment, " is out of range"));
  }
  if (max_batch <= 0) return absl::InvalidArgumentError("max_batch must be > 0");
  SegmentModel m;
  m.backend_ = backend;
  m.max_batch_ = max_batch;
  m.widths_.push_back(static_cast<int>(SegmentInputWidth(model, segment)));
  const bool chain = model.combine() == v1::CHAIN;
  m.final_stage_ = !chain || segment + 1 == model.segments_size();
  m.regression_ = model.loss() == v1::MSE;
  int widest = m.widths_[0];
  for (const auto& layer : model.segments(segment).layers()) {
    m.kernel_offsets_.push_back(m.num_params_);
    m.num_params_ += static_cast<size_t>(m.widths_.back()) * layer.units();
    m.bias_offsets_.push_back(m.num_params_);
    m.num_params_ += layer.units();
    m.widths_.push_back(static_cast<int>(layer.units()));
    m.activations_.push_back(layer.activation());
    m.dropout_.push_back(layer.dropout());
    widest = std::max(widest, static_cast<int>(layer.units()));
  }
  auto alloc = [&](Buffer* out, size_t bytes) -> absl::Status {
    absl::StatusOr<Buffer> b = backend->Allocate(bytes);
    if (!b.ok()) return b.status();
    *out = *std::move(b);
    return absl::OkStatus();
  };
  const size_t fb = sizeof(float);
  SEGPS_RETURN_IF_ERROR(alloc(&m.params_, m.num_params_ * fb));
  SEGPS_RETURN_IF_ERROR(alloc(&m.grad_, m.num_params_ * fb));
  for (int s = 0; s < kInputSlots; ++s) {
    SEGPS_RETURN_IF_ERROR(alloc(&m.inputs_[s], static_cast<size_t>(max_batch) * m.widths_[0] * fb));
    SEGPS_RETURN_IF_ERROR(alloc(&m.labels_[s], static_cast<size_t>(max_batch) * sizeof(int32_t)));
  }
  SEGPS_RETURN_IF_ERROR(alloc(&m.stats_, 2 * fb));
  for (size_t l = 1; l < m.widths_.size(); ++l) {
    m.acts_.emplace_back();
    SEGPS_RETURN_IF_ERROR(alloc(&m.acts_.back(), static_cast<size_t>(max_batch) * m.widths_[l] * fb));
    m.unmasked_.emplace_back();
    if (m.dropout_[l - 1] > 0) {
      SEGPS_RETURN_IF_ERROR(alloc(&m.unmasked_.back(), static_cast<size_t>(max_batch) * m.widths_[l] * fb));
    }
  }
  SEGPS_RETURN_IF_ERROR(alloc(&m.logits_, static_cast<size_t>(max_batch) * m.widths_.back() * fb));
  SEGPS_RETURN_IF_ERROR(alloc(&m.delta_a_, static_cast<size_t>(max_batch) * widest * fb));
  SEGPS_RETURN_IF_ERROR(alloc(&m.delta_b_, static_cast<size_t>(max_batch) * widest * fb));
  // A stage's, or a segment with embedding tables (its rows' gradients
  // come from the input gradient): the micro-batch interface.
  if (chain || model.segments(segment).embeddings_size() > 0) {
    const size_t rows = static_cast<size_t>(max_batch);
    SEGPS_RETURN_IF_ERROR(alloc(&m.input_grad_, rows * m.widths_.front() * fb));
    if (m.final_stage_) {
      SEGPS_RETURN_IF_ERROR(alloc(&m.dlogits_, rows * m.widths_.back() * fb));
    } else {
      SEGPS_RETURN_IF_ERROR(alloc(&m.output_grad_, rows * m.widths_.back() * fb));
    }
    SEGPS_RETURN_IF_ERROR(alloc(&m.ones_, rows * fb));
    const std::vector<float> ones(rows, 1.0f);
    SEGPS_RETURN_IF_ERROR(backend->Upload(ones.data(), m.ones_.data(), rows * fb));
    SEGPS_RETURN_IF_ERROR(backend->Synchronize());
  }
  absl::StatusOr<Buffer> host_stats = backend->AllocateHost(2 * fb);
  if (!host_stats.ok()) return host_stats.status();
  m.host_stats_ = *std::move(host_stats);
  m.host_stats_.data()[0] = m.host_stats_.data()[1] = 0.0f;
  return m;
}

absl::Status SegmentModel::DropOut(size_t l, float* y, size_t n, uint64_t first, std::optional<uint64_t> seed) {
  if (!seed.has_value() || dropout_[l] <= 0) return absl::OkStatus();
  float* unmasked = unmasked_[l].data() + first;
  SEGPS_RETURN_IF_ERROR(backend_->Dropout(y, unmasked, n, 0.0f, 0, 0));  // rate 0 keeps every element: a copy
  return backend_->Dropout(unmasked, y, n, dropout_[l], Mix64(*seed + l), first);
}

absl::StatusOr<const float*> SegmentModel::UndoDropout(size_t l, float* delta, size_t n, uint64_t first,
                                                       std::optional<uint64_t> seed) {
  if (!seed.has_value() || dropout_[l] <= 0) return acts_[l].data() + first;
  SEGPS_RETURN_IF_ERROR(backend_->Dropout(delta, delta, n, dropout_[l], Mix64(*seed + l), first));
  return unmasked_[l].data() + first;
}

uint64_t DropoutSeed(uint64_t seed, int segment, uint32_t rank, uint64_t clock) {
  return Mix64(seed ^ Mix64(static_cast<uint64_t>(segment) << 32 | rank) ^ Mix64(clock ^ 0x64726f706f7574ull));
}

absl::Status SegmentModel::Forward(int rows, int slot, bool with_labels, std::optional<uint64_t> dropout_seed) {
  if (rows <= 0 || rows > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", rows, " rows; this model takes 1..", max_batch_));
  }
  if (slot < 0 || slot >= kInputSlots) return absl::InvalidArgumentError(absl::StrCat("no input slot ", slot));
  const size_t layers = activations_.size();
  const float* in = inputs_[slot].data();
  for (size_t l = 0; l < layers; ++l) {
    const int fan_in = widths_[l], units = widths_[l + 1];
    const bool last = l + 1 == layers;
    float* out = last ? logits_.data() : acts_[l].data();
    SEGPS_RETURN_IF_ERROR(backend_->Gemm(false, false, rows, units, fan_in, 1.0f, in,
                                         params_.data() + kernel_offsets_[l], 0.0f, out));
    SEGPS_RETURN_IF_ERROR(backend_->AddBias(out, params_.data() + bias_offsets_[l], rows, units));
    if (!last) {
      const size_t n = static_cast<size_t>(rows) * units;
      SEGPS_RETURN_IF_ERROR(backend_->Activate(activations_[l], out, n));
      SEGPS_RETURN_IF_ERROR(DropOut(l, out, n, 0, dropout_seed));
    }
    in = out;
  }
  return Loss(0, rows, slot, with_labels, 1.0f / rows, with_labels ? delta_a_.data() : nullptr);
}

absl::Status SegmentModel::Loss(int first, int rows, int slot, bool with_labels, float grad_scale, float* dlogits) {
  const size_t at = static_cast<size_t>(first) * widths_.back();
  float* stats = with_labels ? stats_.data() : nullptr;
  if (regression_) {
    return backend_->SquaredError(logits_.data() + at, with_labels ? labels_[slot].data<float>() + first : nullptr,
                                  rows, grad_scale, acts_.back().data() + at, dlogits, stats);
  }
  return backend_->SoftmaxCrossEntropy(logits_.data() + at,
                                       with_labels ? labels_[slot].data<int32_t>() + first : nullptr, rows,
                                       widths_.back(), grad_scale, acts_.back().data() + at, dlogits, stats);
}

absl::Status SegmentModel::Predict(int rows, int slot) {
  return Forward(rows, slot, /*with_labels=*/false, std::nullopt);
}

absl::Status SegmentModel::TrainStep(int rows, int slot, std::optional<uint64_t> dropout_seed) {
  SEGPS_RETURN_IF_ERROR(Forward(rows, slot, /*with_labels=*/true, dropout_seed));
  // delta holds dLoss/d(pre-activation) of the current layer.
  float* delta = delta_a_.data();
  float* spare = delta_b_.data();
  for (size_t l = activations_.size(); l-- > 0;) {
    const int fan_in = widths_[l], units = widths_[l + 1];
    const bool last = l + 1 == activations_.size();
    if (!last) {
      const size_t n = static_cast<size_t>(rows) * units;
      absl::StatusOr<const float*> activated = UndoDropout(l, delta, n, 0, dropout_seed);
      if (!activated.ok()) return activated.status();
      SEGPS_RETURN_IF_ERROR(backend_->ActivationGrad(activations_[l], *activated, delta, n));
    }
    const float* layer_in = l == 0 ? inputs_[slot].data() : acts_[l - 1].data();
    // dW = in^T * delta, db = column sums of delta, d(in) = delta * W^T.
    SEGPS_RETURN_IF_ERROR(backend_->Gemm(true, false, fan_in, units, rows, 1.0f, layer_in, delta, 0.0f,
                                         grad_.data() + kernel_offsets_[l]));
    SEGPS_RETURN_IF_ERROR(backend_->ColumnSum(delta, rows, units, grad_.data() + bias_offsets_[l]));
    if (l > 0) {
      SEGPS_RETURN_IF_ERROR(backend_->Gemm(false, true, rows, fan_in, units, 1.0f, delta,
                                           params_.data() + kernel_offsets_[l], 0.0f, spare));
      std::swap(delta, spare);
    }
  }
  return absl::OkStatus();
}

absl::Status SegmentModel::StageForward(int first, int rows, float grad_scale,
                                        std::optional<uint64_t> dropout_seed) {
  if (rows <= 0 || first < 0 || first + rows > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch rows [", first, ", +", rows, ") outside this stage's ",
                                                   max_batch_));
  }
  const size_t layers = activations_.size();
  const float* in = inputs_[0].data() + static_cast<size_t>(first) * widths_.front();
  for (size_t l = 0; l < layers; ++l) {
    const int fan_in = widths_[l], units = widths_[l + 1];
    const bool logits = final_stage_ && l + 1 == layers;
    float* out = (logits ? logits_.data() : acts_[l].data()) + static_cast<size_t>(first) * units;
    SEGPS_RETURN_IF_ERROR(backend_->Gemm(false, false, rows, units, fan_in, 1.0f, in,
                                         params_.data() + kernel_offsets_[l], 0.0f, out));
    SEGPS_RETURN_IF_ERROR(backend_->AddBias(out, params_.data() + bias_offsets_[l], rows, units));
    if (!logits) {
      const size_t n = static_cast<size_t>(rows) * units;
      SEGPS_RETURN_IF_ERROR(backend_->Activate(activations_[l], out, n));
      SEGPS_RETURN_IF_ERROR(DropOut(l, out, n, static_cast<size_t>(first) * units, dropout_seed));
    }
    in = out;
  }
  if (!final_stage_) return absl::OkStatus();
  return Loss(first, rows, 0, /*with_labels=*/true, grad_scale,
              dlogits_.data() + static_cast<size_t>(first) * widths_.back());
}

absl::Status SegmentModel::StageBackward(int first, int rows, bool accumulate, bool input_grad,
                                         std::optional<uint64_t> dropout_seed) {
  if (rows <= 0 || first < 0 || first + rows > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch rows [", first, ", +", rows, ") outside this stage's ",
                                                   max_batch_));
  }
  const float beta = accumulate ? 1.0f : 0.0f;
  const size_t layers = activations_.size();
  // dLoss/d(pre-activation) of the top layer, in this micro-batch's rows.
  float* delta = (final_stage_ ? dlogits_.data() : output_grad_.data()) + static_cast<size_t>(first) * widths_.back();
  float* scratch[2] = {delta_a_.data(), delta_b_.data()};
  for (size_t l = layers; l-- > 0;) {
    const int fan_in = widths_[l], units = widths_[l + 1];
    if (!(final_stage_ && l + 1 == layers)) {
      const size_t n = static_cast<size_t>(rows) * units;
      absl::StatusOr<const float*> activated =
          UndoDropout(l, delta, n, static_cast<size_t>(first) * units, dropout_seed);
      if (!activated.ok()) return activated.status();
      SEGPS_RETURN_IF_ERROR(backend_->ActivationGrad(activations_[l], *activated, delta, n));
    }
    const float* layer_in = (l == 0 ? inputs_[0].data() : acts_[l - 1].data()) + static_cast<size_t>(first) * fan_in;
    // dW (+)= in^T * delta, db (+)= ones^T * delta, d(in) = delta * W^T.
    SEGPS_RETURN_IF_ERROR(backend_->Gemm(true, false, fan_in, units, rows, 1.0f, layer_in, delta, beta,
                                         grad_.data() + kernel_offsets_[l]));
    SEGPS_RETURN_IF_ERROR(backend_->Gemm(false, false, 1, units, rows, 1.0f, ones_.data(), delta, beta,
                                         grad_.data() + bias_offsets_[l]));
    if (l > 0 || input_grad) {
      float* d_in = l > 0 ? scratch[l % 2] : input_grad_.data() + static_cast<size_t>(first) * fan_in;
      SEGPS_RETURN_IF_ERROR(backend_->Gemm(false, true, rows, fan_in, units, 1.0f, delta,
                                           params_.data() + kernel_offsets_[l], 0.0f, d_in));
      delta = d_in;
    }
  }
  return absl::OkStatus();
}

absl::Status SegmentModel::DownloadStats() {
  return backend_->Download(stats_.data(), host_stats_.data(), 2 * sizeof(float));
}

}  // namespace segps
