#include "common/balance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace segps {

std::vector<uint32_t> InitialShares(const v1::TrainingConfig& training, uint32_t workers) {
  if (training.balance().shares_size() > 0) {
    return {training.balance().shares().begin(), training.balance().shares().end()};
  }
  return std::vector<uint32_t>(workers, training.batch_size());
}

std::optional<std::vector<uint32_t>> Rebalance(const std::vector<uint32_t>& current,
                                               const std::vector<double>& throughput, uint32_t least,
                                               uint32_t hysteresis) {
  const size_t n = current.size();
  // Ranks with a throughput share the samples they hold now between them.
  std::vector<size_t> measured;
  uint64_t pool = 0;
  for (size_t r = 0; r < n; ++r) {
    if (r < throughput.size() && throughput[r] > 0 && std::isfinite(throughput[r])) {
      measured.push_back(r);
      pool += current[r];
    }
  }
  if (measured.size() < 2) return std::nullopt;
  // Targets proportional to throughput; a rank below `least` is held there
  // and the rest split again among the others, until none is below.
  std::vector<double> target(n, 0.0);
  std::vector<size_t> free = measured;
  double left = static_cast<double>(pool);
  while (true) {
    double speed = 0;
    for (size_t r : free) speed += throughput[r];
    std::vector<size_t> held;
    for (size_t r : free) {
      target[r] = left * throughput[r] / speed;
      if (target[r] < least) held.push_back(r);
    }
    if (held.empty()) break;
    for (size_t r : held) {
      target[r] = least;
      left -= least;
      free.erase(std::find(free.begin(), free.end(), r));
    }
    if (free.empty()) return std::nullopt;  // cannot happen: the total holds every rank's least
  }
  // Halfway there, in whole samples that add up to the pool (largest remainders).
  std::vector<uint32_t> next = current;
  std::vector<std::pair<double, size_t>> remainders;
  uint64_t given = 0;
  for (size_t r : measured) {
    const double exact = 0.5 * (target[r] + current[r]);
    next[r] = static_cast<uint32_t>(std::floor(exact));
    given += next[r];
    remainders.push_back({exact - std::floor(exact), r});
  }
  std::sort(remainders.begin(), remainders.end(),
            [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  for (size_t i = 0; given < pool; ++i, ++given) next[remainders[i % remainders.size()].second] += 1;
  // Moves when a share is `hysteresis` or more from its target, and then
  // by at least a sample.
  bool far = false, moves = false;
  for (size_t r : measured) {
    far |= std::abs(target[r] - current[r]) >= hysteresis;
    moves |= next[r] != current[r];
  }
  if (!far || !moves) return std::nullopt;
  return next;
}

Range ShareOf(const std::vector<uint32_t>& shares, uint32_t rank, uint64_t samples) {
  uint64_t total = 0, before = 0;
  for (size_t r = 0; r < shares.size(); ++r) {
    if (r < rank) before += shares[r];
    total += shares[r];
  }
  if (total == 0 || rank >= shares.size()) return {0, 0};
  // Cut at floor(samples x prefix / total): exact shares for a whole clock.
  const auto cut = [&](uint64_t prefix) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(samples) * prefix / total);
  };
  const uint64_t begin = cut(before), end = cut(before + shares[rank]);
  return {begin, end - begin};
}

void MergePlan(const v1::SharePlan& reply, v1::SharePlan* known) {
  if (reply.shares_size() == 0) return;
  const uint64_t from = reply.shares(0).from_clock();
  while (known->shares_size() > 0 && known->shares(known->shares_size() - 1).from_clock() >= from) {
    known->mutable_shares()->RemoveLast();
  }
  for (const v1::Shares& entry : reply.shares()) *known->add_shares() = entry;
  known->set_final_through(std::max(known->final_through(), reply.final_through()));
}

const v1::Shares* SharesAt(const v1::SharePlan& plan, uint64_t clock) {
  const v1::Shares* found = nullptr;
  for (const v1::Shares& entry : plan.shares()) {
    if (entry.from_clock() <= clock) found = &entry;
  }
  return found;
}

double LayerCost(uint64_t fan_in, uint64_t units, bool first_layer) {
  return (first_layer ? 2.0 : 3.0) * static_cast<double>(fan_in) * static_cast<double>(units) +
         4.0 * static_cast<double>(units);
}

std::vector<uint32_t> CutChain(const std::vector<double>& costs, uint32_t stages) {
  const size_t n = costs.size();
  if (stages == 0 || stages > n) return {};
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[k][i]: the least possible most costly stage when the first i layers form k stages.
  const double kNone = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kNone));
  std::vector<std::vector<size_t>> from(stages + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (uint32_t k = 1; k <= stages; ++k) {
    for (size_t i = k; i <= n; ++i) {
      for (size_t j = k - 1; j < i; ++j) {
        const double worst = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (worst <= best[k][i]) {
          best[k][i] = worst;
          from[k][i] = j;
        }
      }
    }
  }
  std::vector<uint32_t> layers(stages);
  for (size_t k = stages, i = n; k > 0; --k) {
    layers[k - 1] = static_cast<uint32_t>(i - from[k][i]);
    i = from[k][i];
  }
  return layers;
}

}  // namespace segps
