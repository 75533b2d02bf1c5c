// Single-process reference training: the steps a cluster with one worker per
// segment and staleness 0 must take, computed without any server, so tests
// can compare the cluster's parameters with it.
#ifndef SEGPS_TESTS_SUPPORT_REFERENCE_TRAINING_H_
#define SEGPS_TESTS_SUPPORT_REFERENCE_TRAINING_H_

#include <cstdint>
#include <map>
#include <vector>

#include "segps/v1/config.pb.h"
#include "worker/data/dataset.h"

namespace segps {

// Each segment's flat parameters after training, in segment order.
std::vector<std::vector<float>> TrainReference(const v1::JobConfig& config, const Dataset& train);

// The same for balanced training (training.balance) with SGD at staleness
// 0: one step per clock on the clock's whole batch of the segment's order,
// whatever the shares, which is what the workers' weighted pushes of that
// clock add up to (exactly so for SGD without weight decay).
std::vector<std::vector<float>> TrainBalancedReference(const v1::JobConfig& config, const Dataset& train);

// A CHAIN (combine: CHAIN) with one replica at staleness 0: the whole
// network as one segment (every stage's layers in order), trained from the
// stages' initial parameters on stage 0's mini-batches, each step on a
// whole mini-batch; returned cut back into the stages' flat parameters.
std::vector<std::vector<float>> TrainChainReference(const v1::JobConfig& config, const Dataset& train);

// Segment k with embedding tables, one worker at staleness 0, optimizer
// SGD or ADAGRAD: its dense parameters and every row a step touched (per
// table, by id), computed here with a map of rows per table: the batch's
// input assembled sample by sample, the rows' gradients summed from the
// input gradient, each touched row updated by the optimizer's formula.
struct EmbeddingReference {
  std::vector<float> params;
  std::vector<std::map<uint64_t, std::vector<float>>> tables;
};
EmbeddingReference TrainEmbeddingReference(const v1::JobConfig& config, const Dataset& train, int k);

// Largest |a - b| / max(1, |b|) over two parameter vectors.
double MaxRelativeError(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace segps

#endif  // SEGPS_TESTS_SUPPORT_REFERENCE_TRAINING_H_
