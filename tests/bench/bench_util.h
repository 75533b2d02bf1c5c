// What the benchmarks share: flag lists, percentiles, and a process's
// CPU time and memory read from /proc.
#ifndef SEGPS_TESTS_BENCH_BENCH_UTIL_H_
#define SEGPS_TESTS_BENCH_BENCH_UTIL_H_

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace segps::bench {

// The numbers of a comma-separated flag ("1,2,4"), skipping what does not parse.
inline std::vector<double> Numbers(const std::string& list) {
  std::vector<double> out;
  for (absl::string_view s : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    double v = 0;
    if (absl::SimpleAtod(s, &v)) out.push_back(v);
  }
  return out;
}

// The p-quantile (0 <= p <= 1) of `v`; 0 for none.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// A field of /proc/PID/status ("Threads", "VmRSS", "VmHWM"), in its unit (kB for memory); 0 if absent.
inline double ProcStatus(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1));
  }
  return 0;
}

// CPU seconds (user + system) a process has used.
inline double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  if (f.size() < 13) return 0;
  return (std::stod(f[11]) + std::stod(f[12])) / sysconf(_SC_CLK_TCK);  // utime, stime
}

}  // namespace segps::bench

#endif  // SEGPS_TESTS_BENCH_BENCH_UTIL_H_
