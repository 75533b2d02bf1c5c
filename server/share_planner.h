// Server 0's decisions of a balanced segment's shares (training.balance):
// the samples each rank computes per clock, from which clock on, decided
// from the workers' reported throughput at every multiple of every_clocks
// of the segment clock, in effect `lead` clocks later, and never earlier
// than a clock already promised unchanged to a worker.
//
// Thread safety: none of its own; the segment shard calls it under its lock.
#ifndef SEGPS_SERVER_SHARE_PLANNER_H_
#define SEGPS_SERVER_SHARE_PLANNER_H_

#include <cstdint>
#include <vector>

#include "segps/v1/parameter_server.pb.h"

namespace segps {

class SharePlanner {
 public:
  struct Options {
    std::vector<uint32_t> initial;
    uint32_t every_clocks = 0;  // 0: the shares stay
    uint32_t least = 1;         // samples
    uint32_t hysteresis = 1;    // samples a share must move by
    uint32_t lead = 2;          // s + 2
  };

  SharePlanner(int segment, Options options);

  // Rank `rank` computes `samples_per_second` now (ranks outside the plan are ignored).
  void Observe(uint32_t rank, double samples_per_second);
  // Decides new shares if the segment clock has reached the next decision.
  void MaybeDecide(uint64_t segment_clock);
  // The shares from `clock` on, promised final through the decision that
  // the segment clock can reach next.
  void Fill(uint64_t clock, uint64_t segment_clock, v1::SharePlan* plan);

 private:
  const int segment_;
  const Options options_;
  v1::SharePlan plan_;              // the shares decided, by from_clock
  std::vector<double> throughput_;  // the latest per rank
  uint64_t next_decision_ = 0;      // the segment clock of the next decision
  uint64_t promised_through_ = 0;   // the highest final_through sent
};

}  // namespace segps

#endif  // SEGPS_SERVER_SHARE_PLANNER_H_
