#include "common/rank_states.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace segps {

bool StatesDisagree(const RankStates& states) {
  std::set<uint64_t> clocks;
  bool partial = false, unknown = false;
  for (const v1::SealedRankState& state : states) {
    if (state.has_rank_clock()) clocks.insert(state.rank_clock());
    unknown |= !state.has_rank_clock();
    partial |= state.partial();
  }
  return partial || clocks.size() > 1 || (!clocks.empty() && unknown);
}

std::string DescribeStates(const RankStates& states) {
  std::vector<std::string> parts;
  for (const v1::SealedRankState& state : states) {
    parts.push_back(absl::StrCat("server ", state.server_index(), " at ",
                                 state.has_rank_clock() ? absl::StrCat(state.rank_clock()) : std::string("none"),
                                 state.partial() ? " (partly applied)" : ""));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace segps
