// What a pipeline stage checks of every message its neighbours send on a
// link (proto/segps/v1/pipeline.proto, worker/train/pipeline_link.h): the
// sender, the sizes, every value and label. Network bytes: nothing here
// trusts them, and tests/fuzz/stage_link_fuzz.cc drives both checks.
#ifndef SEGPS_WORKER_TRAIN_LINK_MESSAGES_H_
#define SEGPS_WORKER_TRAIN_LINK_MESSAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/pipeline.pb.h"

namespace segps {

// One micro-batch crossing a link forward.
struct MicroBatch {
  uint64_t clock = 0;
  uint32_t epoch = 0;  // the mini-batch's, from 0
  uint32_t micro_batch = 0;
  uint32_t batch_rows = 0;  // the mini-batch's rows
  uint32_t rows = 0;
  std::vector<float> values;    // rows x width
  std::vector<int32_t> labels;  // rows
  bool done = false;            // training is over (nothing else set)
};

// The receiving end of a link: whose activations it takes and their shape.
struct LinkEnd {
  std::string fingerprint;  // the model's
  int stage = 0;            // the receiving stage (the sender is stage - 1)
  uint32_t replica = 0;
  uint64_t width = 0;   // values a row
  uint32_t classes = 0;  // labels in [0, classes); 0: float targets (loss MSE)
  std::string peer;      // the sender, as messages name it
};

// An Activations message as `end` takes it: FAILED_PRECONDITION from
// another model, stage or replica; INVALID_ARGUMENT naming what is wrong
// with its rows, values (dense, finite FLOAT32) or labels.
absl::StatusOr<MicroBatch> CheckActivations(const v1::Activations& m, const LinkEnd& end);

// `count` dense, finite FLOAT32 values at offset 0 from `slice`, or
// INVALID_ARGUMENT naming `what`.
absl::StatusOr<std::vector<float>> LinkValues(const v1::TensorSlice& slice, uint64_t count, const char* what);

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_LINK_MESSAGES_H_
