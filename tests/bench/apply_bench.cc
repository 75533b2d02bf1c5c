// segps-bench-apply: optimizer updates per second per core on server-sized
// shards, against the memory bound measured in the same run, interleaved
// with the updates, on arrays far past the last-level cache: memcpy
// (counted as read plus write) and a read-modify-write a += s * b (read a
// and b, write a: 12 bytes an element), each on one thread and on every
// core at once. The bound is the fastest of them on every core: one
// thread's update cannot move bytes faster than the whole machine. (On
// some machines memcpy's non-temporal stores are the slower pattern; the
// read-modify-write is the one the optimizers share.) Adam reads w, g, m, v
// and writes w, m, v: 28 bytes per element moved, 16 held; SGD reads w, g
// and writes w: 12 moved, 8 held.
//
//   segps-bench-apply [--sizes_m 1,4,16,64] [--seconds 0.5]

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>
#include <tuple>
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

// The last-level cache's size as the kernel reads it from the CPU (sysfs);
// sysconf reads a figure that virtual machines may make up (256 MB on a
// 2-core test machine whose sysfs says 32 MB). 0 when unknown.
double LastLevelCacheBytes() {
  for (const char* path : {"/sys/devices/system/cpu/cpu0/cache/index3/size",
                           "/sys/devices/system/cpu/cpu0/cache/index2/size"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text.empty()) continue;
    const char unit = text.back();
    double value = 0;
    if (!absl::SimpleAtod(unit == 'K' || unit == 'M' ? text.substr(0, text.size() - 1) : text, &value)) continue;
    return value * (unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : 1.0);
  }
  return 0;
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
  // Per thread: 256 MB each way, far past any last-level cache.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  constexpr size_t kStreamBytes = size_t{256} << 20;
  constexpr size_t kStreamFloats = kStreamBytes / sizeof(float);
  std::vector<std::vector<float>> from(cores, std::vector<float>(kStreamFloats, 1.0f)),
      to(cores, std::vector<float>(kStreamFloats, 0.0f));
  // Runs `kernel(t)` on threads 0..threads-1 at once.
  auto on_threads = [&](unsigned threads, auto kernel) {
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back([&, t] { kernel(t); });
    kernel(0);
    for (auto& t : pool) t.join();
  };
  auto copy = [&](unsigned t) { std::memcpy(to[t].data(), from[t].data(), kStreamBytes); };
  auto rmw = [&](unsigned t) {
    float* __restrict a = to[t].data();
    const float* __restrict b = from[t].data();
    for (size_t i = 0; i < kStreamFloats; ++i) a[i] += 0.5f * b[i];
  };
  // Bytes per second, one sample each per update measured.
  std::vector<double> copy1, copy_all, rmw1, rmw_all;
  auto sample_bound = [&] {
    copy1.push_back(2.0 * kStreamBytes / MedianSeconds([&] { on_threads(1, copy); }, 0));
    copy_all.push_back(2.0 * kStreamBytes * cores / MedianSeconds([&] { on_threads(cores, copy); }, 0));
    rmw1.push_back(3.0 * kStreamBytes / MedianSeconds([&] { on_threads(1, rmw); }, 0));
    rmw_all.push_back(3.0 * kStreamBytes * cores / MedianSeconds([&] { on_threads(cores, rmw); }, 0));
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  struct Row {
    segps::v1::OptimizerKind kind;
    size_t n;
    double rate;
    double bytes;      // moved per element
    double footprint;  // held per element
  };
  std::vector<Row> rows;
  segps::v1::OptimizerConfig config;
  config.set_learning_rate(1e-3f);
  config.set_beta1(0.9f);
  config.set_beta2(0.999f);
  config.set_epsilon(1e-7f);
  for (auto [kind, bytes, footprint] :
       {std::tuple{segps::v1::SGD, 12.0, 8.0}, std::tuple{segps::v1::ADAM, 28.0, 16.0}}) {
    config.set_kind(kind);
    for (size_t n : sizes) {
      std::unique_ptr<segps::Optimizer> opt = *segps::CreateOptimizer(config, n);
      std::vector<float> w(n, 0.1f), g(n, 0.01f);
      uint64_t step = 0;
      sample_bound();
      const double s = MedianSeconds([&] { opt->Apply(++step, 0, absl::MakeSpan(w), g, 1.0f); }, budget);
      sample_bound();
      rows.push_back({kind, n, n / s, bytes, footprint});
    }
  }
  const double bound = std::max(median(copy_all), median(rmw_all));
  std::cout << absl::StrFormat(
      "memory, %zu MB per thread, medians of %zu samples taken between the updates (GB/s):\n"
      "  memcpy (read + write)   1 thread %6.2f   %u cores %6.2f\n"
      "  a += s * b (12 B/elem)  1 thread %6.2f   %u cores %6.2f\n"
      "  bound: the fastest on every core, %.2f GB/s\n",
      kStreamBytes >> 20, copy_all.size(), median(copy1) / 1e9, cores, median(copy_all) / 1e9, median(rmw1) / 1e9,
      cores, median(rmw_all) / 1e9, bound / 1e9);
  std::cout << absl::StrFormat("%-8s %10s %16s %11s %16s %10s\n", "kind", "elements", "Melem/s/core", "GB/s",
                               "bound Melem/s", "of bound");
  // A shard whose arrays fit in the last-level cache is not bound by memory.
  const double cache = LastLevelCacheBytes();
  for (const Row& r : rows) {
    const double limit = bound / r.bytes;
    const bool cached = cache > 0 && r.n * r.footprint < cache;
    std::cout << absl::StrFormat("%-8s %9zuM %16.1f %11.2f %16.1f %9.0f%%%s\n", segps::v1::OptimizerKind_Name(r.kind),
                                 r.n / 1000000, r.rate / 1e6, r.rate * r.bytes / 1e9, limit / 1e6,
                                 100 * r.rate / limit, cached ? "  (fits in the cache)" : "");
    if (r.kind == segps::v1::ADAM && r.n == sizes.back()) {
      std::cout << absl::StrFormat("RESULT apply_adam_ratio %.3f\n", r.rate / limit);
    }
  }
  return 0;
}
