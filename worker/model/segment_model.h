// One segment's network (dense layers, a softmax output) on a Backend.
//
// Parameters and gradients live in one flat device buffer each, in the
// shard map's order (per layer: kernel [in, out] row-major, then bias), so a
// pull lands with one upload and a gradient leaves with one download.
//
// Thread safety: none; a model belongs to its worker's training thread.
#ifndef SEGPS_WORKER_MODEL_SEGMENT_MODEL_H_
#define SEGPS_WORKER_MODEL_SEGMENT_MODEL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"
#include "worker/model/backend.h"

namespace segps {

struct BatchStats {
  double loss_sum = 0;  // summed cross-entropy (loss MSE: squared error) over the batch
  double correct = 0;   // correct predictions (loss MSE: summed absolute error)
};

// The dropout seed of a training step: a function of the job's seed, the
// segment (or stage), the worker (or replica) and the clock only, so that
// a step computed again draws the same masks.
uint64_t DropoutSeed(uint64_t seed, int segment, uint32_t rank, uint64_t clock);

class SegmentModel {
 public:
  // A model for segment `segment` of `model`, for batches of up to `max_batch` rows.
  static absl::StatusOr<SegmentModel> Create(Backend* backend, const v1::ModelConfig& model,
                                             int segment, int max_batch);

  size_t num_params() const { return num_params_; }
  int input_width() const { return widths_.front(); }
  int num_classes() const { return widths_.back(); }

  // Device pointers to the flat parameters and gradient.
  float* params() { return params_.data(); }
  const float* grad() const { return grad_.data(); }
  // Two device slots for batches, so that the next batch can be uploaded
  // while the current one computes: inputs [rows x input_width], labels [rows].
  static constexpr int kInputSlots = 2;
  float* input(int slot = 0) { return inputs_[slot].data(); }
  int32_t* labels(int slot = 0) { return labels_[slot].data<int32_t>(); }

  // Forward and backward on the `rows` rows staged in `slot`: fills grad()
  // with the gradient of the mean cross-entropy, and the device stats slot.
  // Enqueued: call DownloadStats, then read stats() after a Synchronize.
  // With `dropout_seed` (training), each layer's dropout (LayerConfig.dropout)
  // masks its outputs as DropoutSeed draws them; without, none.
  absl::Status TrainStep(int rows, int slot = 0, std::optional<uint64_t> dropout_seed = std::nullopt);
  // Forward only; probabilities land in probabilities() [rows x classes].
  absl::Status Predict(int rows, int slot = 0);
  const float* probabilities() const { return acts_.back().data(); }
  // Pipeline stages (combine: CHAIN). A stage holds several micro-batches
  // at once, each in its own rows of the model's buffers: rows [first,
  // first + rows) of input(), the activations, output_grad() and
  // input_grad(). Forward and backward of one micro-batch touch only its
  // rows, so a micro-batch's backward finds its forward's activations
  // whatever ran in between.
  //
  // Whether this model is a CHAIN's last stage (it ends in softmax).
  bool final_stage() const { return final_stage_; }
  int output_width() const { return widths_.back(); }
  // Forward of a micro-batch whose input is in input() (and, for the last
  // stage, labels in labels()) at row `first`. A middle stage's output
  // lands in output(first); the last stage's loss gradient, scaled by
  // `grad_scale` (1 / the mini-batch's rows), waits for StageBackward, and
  // its loss and accuracy in the stats (DownloadStats).
  // `dropout_seed` as TrainStep's; the micro-batch's backward takes the same.
  absl::Status StageForward(int first, int rows, float grad_scale, std::optional<uint64_t> dropout_seed = std::nullopt);
  const float* output(int first) const { return acts_.back().data() + static_cast<size_t>(first) * widths_.back(); }
  // Where a middle stage's caller puts the gradient of the loss with
  // respect to output(first) before StageBackward.
  float* output_grad(int first) { return output_grad_.data() + static_cast<size_t>(first) * widths_.back(); }
  // Backward of the micro-batch at `first`: adds its parameter gradient to
  // grad() (or, first micro-batch of a step, replaces it), and with
  // `input_grad` leaves the gradient with respect to its input in
  // input_grad(first) for the previous stage.
  absl::Status StageBackward(int first, int rows, bool accumulate, bool input_grad,
                             std::optional<uint64_t> dropout_seed = std::nullopt);
  const float* input_grad(int first) const {
    return input_grad_.data() + static_cast<size_t>(first) * widths_.front();
  }

  // Enqueues the copy of the last step's loss and accuracy to the host.
  absl::Status DownloadStats();
  // The last step's stats; valid after DownloadStats and a Synchronize.
  BatchStats stats() const { return {host_stats_.data()[0], host_stats_.data()[1]}; }

 private:
  SegmentModel() = default;
  absl::Status Forward(int rows, int slot, bool with_labels, std::optional<uint64_t> dropout_seed);
  // The output layer's loss over rows [first, first + rows) of the logits,
  // into the outputs (probabilities, or a regression's predictions) and,
  // with labels (of input slot `slot`), `dlogits` and the stats.
  absl::Status Loss(int first, int rows, int slot, bool with_labels, float grad_scale, float* dlogits);
  // Layer l's activated outputs `y` (n of them, at element `first` of the
  // layer's output): with a dropout seed and a rate, their pre-dropout
  // values kept for the backward, and y masked in place.
  absl::Status DropOut(size_t l, float* y, size_t n, uint64_t first, std::optional<uint64_t> seed);
  // Before layer l's ActivationGrad: the mask on its output's gradient, and
  // the activated values its derivative takes.
  absl::StatusOr<const float*> UndoDropout(size_t l, float* delta, size_t n, uint64_t first,
                                           std::optional<uint64_t> seed);

  Backend* backend_ = nullptr;
  int max_batch_ = 0;
  std::vector<int> widths_;                 // input, then each layer's units
  std::vector<v1::Activation> activations_;  // per layer
  std::vector<size_t> kernel_offsets_, bias_offsets_;
  size_t num_params_ = 0;
  Buffer params_, grad_, stats_, host_stats_;
  Buffer inputs_[kInputSlots], labels_[kInputSlots];
  std::vector<Buffer> acts_;    // per layer output [max_batch x units]; last = probabilities
  std::vector<float> dropout_;  // per layer rate
  std::vector<Buffer> unmasked_;    // per layer with dropout: its outputs before the mask
  Buffer logits_, delta_a_, delta_b_;
  // Pipeline stages only: the gradients at the stage's edges, the last
  // stage's loss gradient per micro-batch, and a column of ones (a bias
  // gradient accumulates as ones^T * delta).
  bool final_stage_ = true;
  bool regression_ = false;  // model.loss MSE: a squared error on one output, not softmax
  Buffer output_grad_, input_grad_, dlogits_, ones_;
};

}  // namespace segps

#endif  // SEGPS_WORKER_MODEL_SEGMENT_MODEL_H_
