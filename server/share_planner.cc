#include "server/share_planner.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/balance.h"
#include "common/log.h"

namespace segps {
namespace {

// Share decisions remembered (a rollback may return to them); a long run's plan stays bounded.
constexpr int kMaxPlan = 4096;

}  // namespace

SharePlanner::SharePlanner(int segment, Options options)
    : segment_(segment), options_(std::move(options)), throughput_(options_.initial.size(), 0.0) {
  v1::Shares* first = plan_.add_shares();
  first->set_from_clock(0);
  for (uint32_t share : options_.initial) first->add_samples(share);
  next_decision_ = options_.every_clocks;
}

void SharePlanner::Observe(uint32_t rank, double samples_per_second) {
  if (rank < throughput_.size()) throughput_[rank] = samples_per_second;
}

void SharePlanner::MaybeDecide(uint64_t clock) {
  if (options_.every_clocks == 0 || clock < next_decision_) return;
  next_decision_ = (clock / options_.every_clocks + 1) * options_.every_clocks;
  const v1::Shares& now = *plan_.shares().rbegin();
  const std::vector<uint32_t> current(now.samples().begin(), now.samples().end());
  std::optional<std::vector<uint32_t>> next = Rebalance(current, throughput_, options_.least, options_.hysteresis);
  if (!next.has_value()) return;
  // Replies so far promised no change up to promised_through_ (Fill).
  const uint64_t from = std::max(clock + options_.lead, promised_through_ + 1);
  // After a rollback the segment clock is back below earlier decisions: this one replaces them.
  while (plan_.shares_size() > 1 && plan_.shares(plan_.shares_size() - 1).from_clock() >= from) {
    plan_.mutable_shares()->RemoveLast();
  }
  if (plan_.shares_size() >= kMaxPlan) plan_.mutable_shares()->DeleteSubrange(0, 1);
  v1::Shares* entry = plan_.add_shares();
  entry->set_from_clock(from);
  for (uint32_t share : *next) entry->add_samples(share);
  std::vector<std::string> speeds;
  for (double t : throughput_) speeds.push_back(absl::StrFormat("%.0f", t));
  SEGPS_LOG_INFO << "segment " << segment_ << ": shares from clock " << from << ": " << absl::StrJoin(*next, " ")
                 << " samples (throughput " << absl::StrJoin(speeds, " ") << " samples/s; were "
                 << absl::StrJoin(current, " ") << ")";
}

void SharePlanner::Fill(uint64_t clock, uint64_t segment_clock, v1::SharePlan* plan) {
  int first = 0;
  for (int i = 0; i < plan_.shares_size(); ++i) {
    if (plan_.shares(i).from_clock() <= clock) first = i;
  }
  for (int i = first; i < plan_.shares_size(); ++i) *plan->add_shares() = plan_.shares(i);
  // The next decision comes at a segment clock of at least this one.
  promised_through_ = std::max(promised_through_, segment_clock + options_.lead - 1);
  plan->set_final_through(promised_through_);
}

}  // namespace segps
