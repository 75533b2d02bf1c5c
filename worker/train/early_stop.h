// training.early_stopping on one worker (a segment's rank 0): the
// validation loss of each epoch in, whether to stop out. An epoch scored
// again (computed again after a rollback) replaces its score, so the
// decision depends only on the scores of the epochs as they stand.
//
// Thread safety: none; the training thread's.
#ifndef SEGPS_WORKER_TRAIN_EARLY_STOP_H_
#define SEGPS_WORKER_TRAIN_EARLY_STOP_H_

#include <cstdint>
#include <map>

#include "segps/v1/config.pb.h"

namespace segps {

class EarlyStop {
 public:
  explicit EarlyStop(const v1::EarlyStopping& config) : config_(config) {}

  // Epoch `epoch` (from 1) scored `validation_loss`: true once `patience`
  // epochs after the best have not lowered its loss by more than min_delta.
  bool Observe(uint32_t epoch, double validation_loss) {
    scores_.erase(scores_.lower_bound(epoch), scores_.end());
    scores_[epoch] = validation_loss;
    best_epoch_ = scores_.begin()->first;
    for (const auto& [e, loss] : scores_) {
      if (loss < scores_[best_epoch_] - config_.min_delta()) best_epoch_ = e;
    }
    return epoch - best_epoch_ >= config_.patience();
  }
  // The epoch with the best loss so far (0 before any), and its loss.
  uint32_t best_epoch() const { return best_epoch_; }
  double best_loss() const { return scores_.count(best_epoch_) > 0 ? scores_.at(best_epoch_) : 0; }

 private:
  const v1::EarlyStopping config_;
  std::map<uint32_t, double> scores_;  // validation loss by epoch
  uint32_t best_epoch_ = 0;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_EARLY_STOP_H_
