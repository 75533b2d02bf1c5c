// SYNTHETIC_CTR (data.source): click-through-like samples for embedding
// tables. Each sample has model.input_width Gaussian features and
// model.categorical_fields ids; field f's ids lie in [0, V_f), V_f the
// smallest vocab of a table that looks the field up (FieldVocab), drawn
// as floor((V_f + 1)^u) - 1 for u uniform in [0, 1): a heavy head of
// frequent ids and a long tail, as Zipf's law with exponent 1 gives. The
// label is 1 with probability sigmoid(sum_f e_f(id) + 0.3 w.x - 0.5), where
// e_f(id) ~ N(0, 1) is drawn from (data_seed, f, id) alone: each id's own
// effect dominates, so a model that learns per-id rows beats one that sees
// the features only.
#ifndef SEGPS_WORKER_DATA_SYNTHETIC_CTR_H_
#define SEGPS_WORKER_DATA_SYNTHETIC_CTR_H_

#include "segps/v1/config.pb.h"
#include "worker/data/dataset.h"

namespace segps {

TrainTest SyntheticCtr(const v1::JobConfig& config);

// The area under the ROC curve of `scores` (higher: class 1) against
// binary `labels`; ties count half. 0.5 when one class is missing.
double RocAuc(const std::vector<float>& scores, const std::vector<int32_t>& labels);

}  // namespace segps

#endif  // SEGPS_WORKER_DATA_SYNTHETIC_CTR_H_
