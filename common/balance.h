// Load balancing. Within a segment (training.balance): how many samples of a
// clock each rank computes (its share), how server 0 moves the shares after
// the workers' throughput, and which of a clock's samples a share covers.
//
// A clock takes the next batch_size x workers samples of the epoch's order
// of the segment's data; rank r computes the part from the sum of the shares
// of the ranks before it. The shares of every clock sum to the same total,
// so an epoch is the same number of clocks, and covers every sample exactly
// once, whatever the shares were at each clock.
//
// Between the stages of a chain (model.partition: BALANCED): where one list
// of layers is cut so that the stages' costs are as even as possible.
#ifndef SEGPS_COMMON_BALANCE_H_
#define SEGPS_COMMON_BALANCE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "common/shard_map.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/parameter_server.pb.h"

namespace segps {

// The shares a balanced segment starts with: balance.shares, or batch_size each.
std::vector<uint32_t> InitialShares(const v1::TrainingConfig& training, uint32_t workers);

// New shares: each moves halfway from `current` towards its part of the
// total proportional to `throughput` (samples per second per rank; 0:
// unknown, the rank keeps its share), each at least `least`, with the same
// total; nullopt when no share is `hysteresis` samples or more from its
// target (or halfway rounds to no move).
// Halfway: throughput measured on a shared machine is noisy, and a share
// given at once on one noisy measure swings back at the next.
std::optional<std::vector<uint32_t>> Rebalance(const std::vector<uint32_t>& current,
                                               const std::vector<double>& throughput, uint32_t least,
                                               uint32_t hysteresis);

// The samples of a clock that `rank` computes, as positions within the
// clock's `samples` (batch_size x workers, fewer at an epoch's end: then
// each share is scaled down, and the parts still tile the clock's samples).
Range ShareOf(const std::vector<uint32_t>& shares, uint32_t rank, uint64_t samples);

// Adds a reply's plan to what a worker knows: the reply's entries replace
// the known ones from its first entry's clock on.
void MergePlan(const v1::SharePlan& reply, v1::SharePlan* known);

// The shares `plan` gives for `clock`; null when it holds none that early.
const v1::Shares* SharesAt(const v1::SharePlan& plan, uint64_t clock);

// The cost of a dense layer of `units` over `fan_in` inputs, per sample:
// its forward and backward multiply-adds (in x out for the output, for the
// kernel's gradient and, but for the network's first layer, for the
// input's) and its element-wise passes.
double LayerCost(uint64_t fan_in, uint64_t units, bool first_layer);

// How many of `costs`' consecutive layers each of `stages` stages takes, so
// that the most costly stage costs as little as possible (every stage at
// least one layer; ties go to the cut that moves layers later).
std::vector<uint32_t> CutChain(const std::vector<double>& costs, uint32_t stages);

}  // namespace segps

#endif  // SEGPS_COMMON_BALANCE_H_
