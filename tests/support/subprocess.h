// A child process for integration tests: started from argv, its stdout and
// stderr captured through one pipe, waited on with deadlines (never sleeps),
// killed and reaped by the destructor if still running.
#ifndef SEGPS_TESTS_SUPPORT_SUBPROCESS_H_
#define SEGPS_TESTS_SUPPORT_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace segps {

class Subprocess {
 public:
  // Runs `argv` in working directory `cwd`; by default a fresh one of its
  // own, so that what a program writes by default (segps-local's report,
  // its runs' checkpoints) never meets another test's.
  static std::unique_ptr<Subprocess> Start(const std::vector<std::string>& argv, const std::string& cwd = "");
  ~Subprocess();

  // Reads output until a line containing `needle` arrives; returns that line,
  // or nullopt on timeout or end of output.
  std::optional<std::string> WaitForLine(absl::string_view needle, absl::Duration timeout);
  // Reads output until the process exits; returns its wait status, or nullopt on timeout.
  std::optional<int> Wait(absl::Duration timeout);
  void Signal(int signal);
  pid_t pid() const { return pid_; }
  // Everything the process printed so far.
  const std::string& output() const { return output_; }

 private:
  Subprocess(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  // Reads what is available within `timeout`; false at end of output.
  bool ReadSome(absl::Duration timeout);

  pid_t pid_;
  int fd_;
  bool reaped_ = false;
  int status_ = 0;
  std::string output_;
  size_t scanned_ = 0;  // output_ before this offset was already searched for lines
};

// segps-server processes on free loopback ports.
struct ServerProcesses {
  std::vector<std::unique_ptr<Subprocess>> processes;
  std::vector<std::string> addresses;  // host:port, in index order
  bool ok() const { return !processes.empty() && addresses.size() == processes.size(); }
  std::string Joined() const;          // "a,b,..." for --servers
  std::string Output() const;          // every server's output, for failure messages
};

// Starts servers 0..count-1 of `config` and waits until each listens.
// `replicated` (cluster.replicas >= 2): their ports are chosen first, and
// each is told every server's address (--servers).
ServerProcesses StartServers(const std::string& config, int count, bool replicated = false);


// Path of a segps binary in the build tree: in $SEGPS_BIN_DIR (set by ctest),
// else beside the running binary.
std::string BinaryPath(const std::string& name);

// A fresh temporary directory for one test.
std::string MakeTempDir();

// Writes `text` to `path`.
void WriteFile(const std::string& path, const std::string& text);
std::string ReadFile(const std::string& path);

// The ensemble's accuracy in a segps-local report (JSON); -1 if absent.
double EnsembleAccuracy(const std::string& report_json);

// A float32 .npy file's values (as segps-local --params_dir writes them).
std::vector<float> ReadNpyFloat32(const std::string& path);
// The largest |a[i] - b[i]| (a and b of one size), in double.
double LargestDifference(const std::vector<float>& a, const std::vector<float>& b);

// Whether a wait status is a clean exit.
bool ExitedOk(int status);

// The pid of the running process started as `program` with `args`
// consecutive among its arguments.
std::optional<pid_t> FindProcess(const std::string& program, const std::vector<std::string>& args);

// Writes dir/job.pbtxt, a small job that trains until it is stopped (for
// tests that stop or watch a running cluster), and returns its path.
std::string WriteEndlessJob(const std::string& dir, int num_servers, int staleness);

// A pipeline job (model.combine: CHAIN) on the teacher task: 50 -> 32
// (relu) [-> 24 (tanh)] -> 10, cut into K = 2 or 3 stages ("first",
// ["middle",] "last"), 2 servers, SGD, staleness 0, one replica,
// `train_samples` (2000: an epoch's last mini-batch of 16) in mini-batches
// of 32. `cluster`, `training`
// and `more` add fields to the cluster and training blocks and to the top
// level (a security block, say).
struct ChainJob {
  ChainJob(int stages, int micro_batches, std::string schedule = "GPIPE")
      : stages(stages), micro_batches(micro_batches), schedule(std::move(schedule)) {}
  int stages;
  int micro_batches;
  std::string schedule;
  int epochs = 1;
  int train_samples = 2000;
  std::string cluster, training, more;
};
// Writes it to dir/NAME.pbtxt and returns the path.
std::string WriteChainJob(const std::string& dir, const std::string& name, const ChainJob& job);

}  // namespace segps

#endif  // SEGPS_TESTS_SUPPORT_SUBPROCESS_H_
