// segps-bench-apply: optimizer updates per second per core on server-sized
// shards, against the memory bound measured in the same run, interleaved
// with the updates: memcpy of arrays well beyond the last-level cache,
// counted as read plus write, on one thread and on every core at once (the
// machine's bound: one thread's update cannot move bytes faster than all
// cores together). Adam reads w, g, m, v and writes w, m, v: 28 bytes per
// element; SGD reads w, g and writes w: 12.
//
//   segps-bench-apply [--sizes_m 1,4,16,64] [--seconds 0.5]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/optimizer.h"

ABSL_FLAG(std::string, sizes_m, "1,4,16,64", "Shard sizes in millions of float32 elements");
ABSL_FLAG(double, seconds, 0.5, "Minimum timed seconds per measurement");

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of one call of f, repeated for at least `budget` seconds.
template <typename F>
double MedianSeconds(F f, double budget) {
  f();  // warm up: first touch of the pages
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < budget) {
    const auto t0 = Clock::now();
    f();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const double budget = absl::GetFlag(FLAGS_seconds);
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes_m), ',', absl::SkipEmpty())) {
    double m = 0;
    if (!absl::SimpleAtod(s, &m)) return 2;
    sizes.push_back(static_cast<size_t>(m * 1e6));
  }
  // memcpy over 256 MB each way per thread, far past any last-level cache.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  constexpr size_t kCopyBytes = size_t{256} << 20;
  std::vector<std::vector<char>> from(cores, std::vector<char>(kCopyBytes, 1)), to(cores, std::vector<char>(kCopyBytes, 0));
  // Bytes per second of memcpy on `threads` threads at once (each its own arrays).
  auto copy_once = [&](unsigned threads) {
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) {
      pool.emplace_back([&, t] { std::memcpy(to[t].data(), from[t].data(), kCopyBytes); });
    }
    std::memcpy(to[0].data(), from[0].data(), kCopyBytes);
    for (auto& t : pool) t.join();
  };
  std::vector<double> one_thread, all_cores;  // bytes per second, one sample per update measured
  auto sample_bound = [&] {
    one_thread.push_back(2.0 * kCopyBytes / MedianSeconds([&] { copy_once(1); }, 0));
    all_cores.push_back(2.0 * kCopyBytes * cores / MedianSeconds([&] { copy_once(cores); }, 0));
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  struct Row {
    segps::v1::OptimizerKind kind;
    size_t n;
    double rate;
    double bytes;
  };
  std::vector<Row> rows;
  segps::v1::OptimizerConfig config;
  config.set_learning_rate(1e-3f);
  config.set_beta1(0.9f);
  config.set_beta2(0.999f);
  config.set_epsilon(1e-7f);
  for (auto [kind, bytes] : {std::pair{segps::v1::SGD, 12.0}, std::pair{segps::v1::ADAM, 28.0}}) {
    config.set_kind(kind);
    for (size_t n : sizes) {
      std::unique_ptr<segps::Optimizer> opt = *segps::CreateOptimizer(config, n);
      std::vector<float> w(n, 0.1f), g(n, 0.01f);
      uint64_t step = 0;
      sample_bound();
      const double s = MedianSeconds([&] { opt->Apply(++step, 0, absl::MakeSpan(w), g); }, budget);
      sample_bound();
      rows.push_back({kind, n, n / s, bytes});
    }
  }
  const double bound1 = median(one_thread), bound = median(all_cores);
  std::cout << absl::StrFormat("memcpy (read + write), %zu MB per thread, medians of %zu samples between the updates:\n"
                               "  1 thread %.2f GB/s, %u cores %.2f GB/s (the bound)\n",
                               kCopyBytes >> 20, all_cores.size(), bound1 / 1e9, cores, bound / 1e9);
  std::cout << absl::StrFormat("%-8s %10s %16s %11s %16s %10s\n", "kind", "elements", "Melem/s/core", "GB/s",
                               "bound Melem/s", "of bound");
  for (const Row& r : rows) {
    const double limit = bound / r.bytes;
    std::cout << absl::StrFormat("%-8s %9zuM %16.1f %11.2f %16.1f %9.0f%%\n", segps::v1::OptimizerKind_Name(r.kind),
                                 r.n / 1000000, r.rate / 1e6, r.rate * r.bytes / 1e9, limit / 1e6,
                                 100 * r.rate / limit);
    if (r.kind == segps::v1::ADAM && r.n == sizes.back()) {
      std::cout << absl::StrFormat("RESULT apply_adam_ratio %.3f\nRESULT apply_adam_vs_one_thread_memcpy %.3f\n",
                                   r.rate / limit, r.rate * r.bytes / bound1);
    }
  }
  return 0;
}
