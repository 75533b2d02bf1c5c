// segps-bench-apply: optimizer updates per second per core on server-sized
// shards, against the memory bound measured in the same run (a STREAM-like
// triad, one thread). Adam reads w, g, m, v and writes w, m, v: 28 bytes per
// element; SGD reads w, g and writes w: 12.
//
//   segps-bench-apply [--sizes_m 1,4,16,64] [--seconds 0.5]
#include <algorithm>
#include <chrono>
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
  // Memory bound: triad a = b + s * c over the largest size (at least 16M, past the caches).
  const size_t tn = std::max<size_t>(*std::max_element(sizes.begin(), sizes.end()), 16'000'000);
  std::vector<float> a(tn, 0.0f), b(tn, 1.0f), c(tn, 2.0f);
  const double triad_s = MedianSeconds(
      [&] {
        float* __restrict pa = a.data();
        const float* __restrict pb = b.data();
        const float* __restrict pc = c.data();
        for (size_t i = 0; i < tn; ++i) pa[i] = pb[i] + 0.5f * pc[i];
      },
      budget);
  const double bandwidth = 12.0 * tn / triad_s;  // bytes per second
  std::cout << absl::StrFormat("memory triad, 1 thread: %.2f GB/s (%zu M floats)\n", bandwidth / 1e9, tn / 1000000);
  std::cout << absl::StrFormat("%-8s %10s %16s %16s %10s\n", "kind", "elements", "Melem/s/core", "bound Melem/s",
                               "of bound");
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
      const double s = MedianSeconds([&] { opt->Apply(++step, 0, absl::MakeSpan(w), g); }, budget);
      const double rate = n / s, bound = bandwidth / bytes;
      std::cout << absl::StrFormat("%-8s %9zuM %16.1f %16.1f %9.0f%%\n", segps::v1::OptimizerKind_Name(kind),
                                   n / 1000000, rate / 1e6, bound / 1e6, 100 * rate / bound);
      if (kind == segps::v1::ADAM && n == sizes.back()) {
        std::cout << absl::StrFormat("RESULT apply_adam_ratio %.3f\n", rate / bound);
      }
    }
  }
  return 0;
}
