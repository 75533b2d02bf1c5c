// segps-bench-apply: optimizer updates per second on server-sized shards,
// against the memory bound measured in the same run, interleaved with the
// updates, on arrays far past the last-level cache: loops that move the
// same arrays as the update with next to no arithmetic (class MemoryBound).
// Adam reads w, g, m, v and writes w, m, v: 28 bytes per element moved, 16
// held; SGD reads w, g and writes w: 12 moved, 8 held.
//
// Each update is measured twice, each against the bound of its own kind: on
// one thread (a push applied by the thread that received it) against its
// traffic's rate on one thread, and split over every core (the server's
// --apply_threads) against its traffic's rate on every core. A shard held
// within a few times the last-level cache is marked: memory does not bound it.
//
//   segps-bench-apply [--sizes_m 1,4,16,64] [--seconds 0.5]

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/command_line.h"
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

// The traffic of the optimizers' kernels (server/optimizer.cc) with next to no
// arithmetic, compiled the same way (SEGPS_VECTOR_CLONES): SGD's two streams,
// and Adam's three (its moments interleaved, m0 v0 m1 v1 ...).
SEGPS_VECTOR_CLONES void SgdTraffic(float* __restrict w, const float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) w[i] += 0.5f * g[i];
}
SEGPS_VECTOR_CLONES void AdamTraffic(float* __restrict w, const float* __restrict g, float* __restrict mv, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    w[i] += 0.5f * g[i];
    mv[2 * i] = 0.9f * mv[2 * i] + g[i];
    mv[2 * i + 1] = 0.999f * mv[2 * i + 1] + g[i];
  }
}

double Max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs `kernel(t)` on threads 0..threads-1 at once (0 on the caller's).
template <typename K>
void OnThreads(unsigned threads, K kernel) {
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back([&, t] { kernel(t); });
  kernel(0);
  for (auto& t : pool) t.join();
}

// The machine's memory bandwidth, sampled between the updates (bytes/s), in
// the optimizers' own traffic with no arithmetic to speak of: SGD's
// w += s * g (read 2 arrays, write 1: 12 bytes an element) and Adam's shape,
// w += s * g, m = b * m + g, v = c * v + g (read 4, write 3: 28 bytes; the
// moments interleaved as the optimizer keeps them), plus
// memcpy (read + write) for reference. Each on one thread and on every core.
class MemoryBound {
 public:
  explicit MemoryBound(unsigned cores) : cores_(cores), arrays_(cores, std::vector<float>(4 * kFloats, 1.0f)) {}

  void Sample() {
    auto at = [&](unsigned t, int k) { return arrays_[t].data() + k * kFloats; };
    auto copy = [&](unsigned t) { std::memcpy(at(t, 0), at(t, 2), 2 * kFloats * sizeof(float)); };
    auto adam = [&](unsigned t) { AdamTraffic(at(t, 0), at(t, 3), at(t, 1), kFloats); };
    auto sgd = [&](unsigned t) { SgdTraffic(at(t, 0), at(t, 3), kFloats); };
    const double bytes = kFloats * sizeof(float);
    auto rates = [&](auto kernel, double moved, std::vector<double>* one, std::vector<double>* all) {
      one->push_back(moved / MedianSeconds([&] { OnThreads(1, kernel); }, 0));
      all->push_back(moved * cores_ / MedianSeconds([&] { OnThreads(cores_, kernel); }, 0));
    };
    rates(copy, 4 * bytes, &samples_[0][0], &samples_[0][1]);
    rates(sgd, 3 * bytes, &samples_[1][0], &samples_[1][1]);
    rates(adam, 7 * bytes, &samples_[2][0], &samples_[2][1]);
  }
  // The bound for an update of `kind`: the fastest its traffic moved, on
  // one thread or on every core.
  double Bound(segps::v1::OptimizerKind kind, bool every_core) const {
    const std::vector<double>& v = samples_[kind == segps::v1::ADAM ? 2 : 1][every_core ? 1 : 0];
    return Max(v);
  }

  void Print() const {
    std::cout << absl::StrFormat("memory, %zu MB per thread, medians (and maxima: the bounds) of %zu samples taken "
                                 "between the updates, GB/s:\n",
                                 4 * kFloats * sizeof(float) >> 20, samples_[0][0].size());
    const char* names[] = {"memcpy (read + write)", "SGD's traffic (12 B/elem)", "Adam's traffic (28 B/elem)"};
    for (int k = 0; k < 3; ++k) {
      std::cout << absl::StrFormat("  %-27s 1 thread %6.2f (max %6.2f)   %u cores %6.2f (max %6.2f)\n", names[k],
                                   Median(samples_[k][0]) / 1e9, Max(samples_[k][0]) / 1e9, cores_,
                                   Median(samples_[k][1]) / 1e9, Max(samples_[k][1]) / 1e9);
    }
  }

 private:
  // Per thread: four arrays of 64 MB, far past any last-level cache.
  static constexpr size_t kFloats = (size_t{64} << 20) / sizeof(float);
  const unsigned cores_;
  std::vector<std::vector<float>> arrays_;
  std::vector<double> samples_[3][2];  // [memcpy, SGD, Adam][one thread, every core]
};

struct Row {
  segps::v1::OptimizerKind kind;
  size_t n;
  double rate1, rate_all;  // elements per second: on one thread, over every core
  double bytes;            // moved per element
  double footprint;        // held per element
};

// Updates of `kind` on an n-element shard per second: on one thread, and
// cut into `cores` disjoint ranges applied at once.
Row MeasureApply(segps::v1::OptimizerKind kind, size_t n, unsigned cores, double budget) {
  segps::v1::OptimizerConfig config;
  config.set_kind(kind);
  config.set_learning_rate(1e-3f);
  config.set_beta1(0.9f);
  config.set_beta2(0.999f);
  config.set_epsilon(1e-7f);
  std::unique_ptr<segps::Optimizer> opt = *segps::CreateOptimizer(config, n);
  std::vector<float> w(n, 0.1f), g(n, 0.01f);
  uint64_t step = 0;
  const double one = MedianSeconds([&] { opt->Apply(++step, 0, absl::MakeSpan(w), g, 1.0f); }, budget);
  const size_t per = (n + cores - 1) / cores;
  const double all = MedianSeconds(
      [&] {
        ++step;
        OnThreads(cores, [&](unsigned t) {
          const size_t first = std::min(n, t * per), count = std::min(n, first + per) - first;
          opt->Apply(step, first, absl::MakeSpan(w).subspan(first, count), absl::MakeConstSpan(g).subspan(first, count),
                     1.0f);
        });
      },
      budget);
  const bool adam = kind == segps::v1::ADAM;
  return {kind, n, n / one, n / all, adam ? 28.0 : 12.0, adam ? 16.0 : 8.0};
}

}  // namespace

int main(int argc, char** argv) {
  segps::ParseCommandLine(argc, argv, "Optimizer updates per second on server-sized shards.");
  const double budget = absl::GetFlag(FLAGS_seconds);
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes_m), ',', absl::SkipEmpty())) {
    double m = 0;
    if (!absl::SimpleAtod(s, &m) || m <= 0) {
      std::cerr << "--sizes_m: \"" << s << "\" is not a positive number of millions\n";
      return 2;
    }
    sizes.push_back(static_cast<size_t>(m * 1e6));
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  MemoryBound memory(cores);
  std::vector<Row> rows;
  for (segps::v1::OptimizerKind kind : {segps::v1::SGD, segps::v1::ADAM}) {
    for (size_t n : sizes) {
      memory.Sample();
      rows.push_back(MeasureApply(kind, n, cores, budget));
      memory.Sample();
    }
  }
  memory.Print();
  std::cout << absl::StrFormat("%-6s %9s | %-30s | %-30s\n", "", "", "  one thread", absl::StrCat("  ", cores, " cores"));
  std::cout << absl::StrFormat("%-6s %9s | %10s %8s %10s | %10s %8s %10s\n", "kind", "elements", "Melem/s", "GB/s",
                               "of bound", "Melem/s", "GB/s", "of bound");
  const double cache = LastLevelCacheBytes();
  for (const Row& r : rows) {
    const double of1 = r.rate1 * r.bytes / memory.Bound(r.kind, false);
    const double of_all = r.rate_all * r.bytes / memory.Bound(r.kind, true);
    // Past the cache's size, its replacement policy still keeps part of a
    // working set a few times larger: only far past it does memory bound.
    const double held = r.n * r.footprint;
    const char* note = cache <= 0 ? "" : held < cache ? "  (fits in the cache)" : held < 4 * cache ? "  (partly cached)" : "";
    std::cout << absl::StrFormat("%-6s %8zuM | %10.1f %8.2f %9.0f%% | %10.1f %8.2f %9.0f%%%s\n",
                                 segps::v1::OptimizerKind_Name(r.kind), r.n / 1000000, r.rate1 / 1e6,
                                 r.rate1 * r.bytes / 1e9, 100 * of1, r.rate_all / 1e6, r.rate_all * r.bytes / 1e9,
                                 100 * of_all, note);
    if (r.kind == segps::v1::ADAM && r.n == sizes.back()) {
      std::cout << absl::StrFormat("RESULT apply_adam_ratio %.3f\nRESULT apply_adam_all_cores_ratio %.3f\n", of1,
                                   of_all);
    }
  }
  return 0;
}
