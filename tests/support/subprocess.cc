#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/loopback.h"

namespace segps {

std::unique_ptr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv, const std::string& cwd) {
  const std::string dir = cwd.empty() ? MakeTempDir() : cwd;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return nullptr;
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);  // nothing a test starts reads the test's stdin
    if (null >= 0) dup2(null, STDIN_FILENO);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s failed\n", args[0]);
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return nullptr;
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, fds[0]));
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
  if (fd_ >= 0) close(fd_);
}

bool Subprocess::ReadSome(absl::Duration timeout) {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  const int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
  if (poll(&p, 1, ms) <= 0) return true;
  char buf[4096];
  const ssize_t n = read(fd_, buf, sizeof(buf));
  if (n <= 0) {
    close(fd_);
    fd_ = -1;
    return false;
  }
  output_.append(buf, n);
  return true;
}

std::optional<std::string> Subprocess::WaitForLine(absl::string_view needle, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t end;
    while ((end = output_.find('\n', scanned_)) != std::string::npos) {
      std::string line = output_.substr(scanned_, end - scanned_);
      scanned_ = end + 1;
      if (absl::StrContains(line, needle)) return line;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline || !ReadSome(deadline - now)) return std::nullopt;
  }
}

std::optional<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!reaped_) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return std::nullopt;
    if (!ReadSome(deadline - now)) {
      // End of output: the process is exiting; reap it.
      if (waitpid(pid_, &status_, 0) == pid_) reaped_ = true;
    }
  }
  return status_;
}

void Subprocess::Signal(int signal) {
  if (!reaped_) kill(pid_, signal);
}

std::string BinaryPath(const std::string& name) {
  if (const char* dir = std::getenv("SEGPS_BIN_DIR")) return std::string(dir) + "/" + name;
  // Tools in the build tree sit beside the binary asking.
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string path(self, n > 0 ? n : 0);
  return path.substr(0, path.rfind('/') + 1) + name;
}

ServerProcesses StartServers(const std::string& config, int count, bool replicated) {
  ServerProcesses servers;
  const std::vector<std::string> listen =
      replicated ? FreeLoopbackAddresses(count) : std::vector<std::string>(count, "127.0.0.1:0");
  std::string peers;
  for (const std::string& address : listen) peers += (peers.empty() ? "" : ",") + address;
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> command = {BinaryPath("segps-server"), "--config", config, "--index",
                                        std::to_string(i), "--listen", listen[i]};
    if (replicated) command.insert(command.end(), {"--servers", peers});
    servers.processes.push_back(Subprocess::Start(command));
    std::optional<std::string> line = servers.processes.back()->WaitForLine("listening on", absl::Seconds(60));
    if (!line.has_value()) break;
    servers.addresses.push_back(line->substr(line->rfind(' ') + 1));
  }
  return servers;
}

std::string ServerProcesses::Joined() const {
  std::string joined;
  for (const std::string& a : addresses) joined += (joined.empty() ? "" : ",") + a;
  return joined;
}

std::string ServerProcesses::Output() const {
  std::string all;
  for (const auto& p : processes) all += p->output();
  return all;
}

double LargestDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}

std::string MakeTempDir() {
  char dir[] = "/tmp/segps_test_XXXXXX";
  return mkdtemp(dir) ? dir : "/tmp";
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string WriteEndlessJob(const std::string& dir, int num_servers, int staleness) {
  const std::string path = dir + "/job.pbtxt";
  WriteFile(path, absl::StrFormat(R"pb(
    cluster { num_servers: %d }
    model {
      input_width: 50
      num_classes: 10
      segments { name: "s" layers { units: 16 activation: RELU } layers { units: 10 activation: SOFTMAX } }
    }
    optimizer { kind: ADAM }
    training { batch_size: 32 epochs: 100000 staleness: %d log_interval_s: 0.05 }
    data { source: SYNTHETIC_SEED train_samples: 512 test_samples: 64 }
  )pb", num_servers, staleness));
  return path;
}

std::string WriteChainJob(const std::string& dir, const std::string& name, const ChainJob& job) {
  std::string segments = R"pb(segments { name: "first" layers { units: 32 activation: RELU } })pb";
  if (job.stages == 3) segments += R"pb( segments { name: "middle" layers { units: 24 activation: TANH } })pb";
  segments += R"pb( segments { name: "last" layers { units: 10 activation: SOFTMAX } })pb";
  const std::string path = dir + "/" + name + ".pbtxt";
  WriteFile(path, absl::StrFormat(R"pb(
    cluster { num_servers: 2 %s }
    model { input_width: 50 num_classes: 10 combine: CHAIN %s }
    optimizer { kind: SGD learning_rate: 0.1 }
    training { batch_size: 32 epochs: %d staleness: 0 micro_batches: %d schedule: %s %s }
    data { source: SYNTHETIC_TEACHER train_samples: %d test_samples: 500 }
    %s
  )pb", job.cluster, segments, job.epochs, job.micro_batches, job.schedule, job.training, job.train_samples,
                                  job.more));
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double EnsembleAccuracy(const std::string& report_json) {
  std::smatch m;
  const std::regex re("\"ensemble\": \\{\"name\": \"[a-z]+\", \"accuracy\": ([0-9.]+)");
  if (!std::regex_search(report_json, m, re)) return -1;
  return std::stod(m[1]);
}

std::vector<float> ReadNpyFloat32(const std::string& path) {
  const std::string bytes = ReadFile(path);
  if (bytes.size() < 10) return {};
  const size_t header = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  if (bytes.size() < 10 + header) return {};
  std::vector<float> v((bytes.size() - 10 - header) / 4);
  std::memcpy(v.data(), bytes.data() + 10 + header, v.size() * 4);
  return v;
}

bool ExitedOk(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::optional<pid_t> FindProcess(const std::string& program, const std::vector<std::string>& args) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    const std::string cmdline = ReadFile(entry.path().string() + "/cmdline");
    const std::vector<std::string> argv = absl::StrSplit(cmdline, '\0');
    if (!argv.empty() && argv[0] == program &&
        std::search(argv.begin(), argv.end(), args.begin(), args.end()) != argv.end()) {
      return pid;
    }
  }
  return std::nullopt;
}

}  // namespace segps
