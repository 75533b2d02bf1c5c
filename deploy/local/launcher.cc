// segps-local: a whole cluster on this machine, one command.
//
//   segps-local --config job.pbtxt [--report report.json] [--device cpu] [--cpu_threads 1] [--apply_threads 1]
//               [--export model.safetensors] [--onnx model.onnx]
//
// Starts the config's servers on free loopback ports, with their checkpoints
// in segps-runs/<job name> (the same command resumes a stopped job), and,
// alongside them, one worker process per (segment, rank), which loads its
// data and then reads the servers' addresses from stdin; shows what a user
// needs of their output (deploy/local/console.h), runs segps-eval when every
// worker has finished, and prints its report (then segps-export, if asked).
// Exits non-zero if any process failed. Every child dies with the launcher
// (deploy/local/processes.h): on Ctrl-C, SIGTERM, an error, or the
// launcher's own death.
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "common/config.h"
#include "common/loopback.h"
#include "deploy/local/console.h"
#include "deploy/local/job_security.h"
#include "deploy/local/processes.h"
#include "worker/data/dataset.h"

ABSL_FLAG(std::string, config, "", "Job config file (*.pbtxt). Required.");
ABSL_FLAG(std::string, report, "segps-report.json", "Where the evaluation writes its JSON report.");
ABSL_FLAG(std::string, params_dir, "", "If set, the evaluation writes each segment's trained parameters to DIR/<segment>.npy.");
ABSL_FLAG(std::string, device, "cpu", "Device for every worker: cpu, cuda:N or auto.");
ABSL_FLAG(int32_t, cpu_threads, 1, "Threads each CPU worker computes with (see segps-worker --cpu_threads).");
ABSL_FLAG(int32_t, apply_threads, 1, "Threads each server splits an update over (see segps-server --apply_threads).");
ABSL_FLAG(std::string, bin_dir, "", "Directory of segps-server, segps-worker and segps-eval. Default: this binary's.");
ABSL_FLAG(int32_t, straggler_ms, 0,
          "Slow the last worker of the first segment by this many milliseconds per step (staleness experiments).");
ABSL_FLAG(double, straggler_factor, 1,
          "Stretch the compute time of the first segment's last worker by this factor (>= 1): a slower device "
          "(segps-worker --slowdown_factor).");
ABSL_FLAG(double, slowdown_factor, 1,
          "Stretch every worker's compute time by this factor (>= 1): slower devices (segps-worker --slowdown_factor).");
ABSL_FLAG(double, pass_ms, 0,
          "combine: CHAIN: pad every stage's forward passes to at least this many milliseconds and backward passes "
          "to twice that (segps-worker --pass_ms).");
ABSL_FLAG(int32_t, start_timeout_s, 60, "Seconds to wait for servers to start listening.");
ABSL_FLAG(bool, tls, false,
          "Run the whole job over mutual TLS with bearer tokens, with a CA, certificates and tokens made for it "
          "(deploy/make-certs.sh, openssl) in a temporary directory. Default: plaintext on loopback with a token "
          "made for the job (files only you may read), so that other users of the host are refused.");
ABSL_FLAG(bool, no_restart, false,
          "Do not restart a server or worker killed by a signal during training (by default each is restarted "
          "up to 3 times; servers restore their newest checkpoint and workers rejoin).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory of the servers' checkpoints. Default: checkpoint.dir of the config, else segps-runs/<job name> "
          "here. A job whose checkpoints are there resumes from them: Ctrl-C, then the same command, goes on.");
ABSL_FLAG(bool, no_checkpoints, false,
          "Servers keep no checkpoints but where the config's checkpoint.dir asks: a server that dies loses the "
          "job, and nothing resumes (training measured alone).");
ABSL_FLAG(bool, fresh, false,
          "Start over: delete the job's checkpoints (each segment's folder in the checkpoint directory) first.");
ABSL_FLAG(std::string, export, "", "After training, write the model as safetensors to this file (segps-export --out).");
ABSL_FLAG(std::string, onnx, "", "After training, write the model as an ONNX graph to this file (segps-export --onnx).");
ABSL_FLAG(std::string, plot, "",
          "Write the run's learning curves (PNG, from the report's history) to this directory, with "
          "python/segps_plot.py and Debian's /usr/bin/python3 (python3-matplotlib).");
ABSL_FLAG(bool, verbose, false,
          "Show every line of every process (servers' start-up and checkpoints, registrations, traffic). By default: "
          "warnings, errors, progress, results.");
ABSL_FLAG(std::string, probabilities_out, "",
          "The evaluation writes the ensemble's test-set probabilities to this .npy file.");

namespace {

using segps::Child;
using segps::Describe;
using segps::Launcher;
using segps::Succeeded;

// Whether stdout is a terminal that takes cursor movements and has room
// for `lines` progress lines below what scrolls: progress is then redrawn in place.
bool LiveTerminal(int lines) {
  const char* term = std::getenv("TERM");
  winsize size{};
  const bool room = ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) != 0 || size.ws_row == 0 || lines + 2 <= size.ws_row;
  return isatty(STDOUT_FILENO) != 0 && term != nullptr && std::string(term) != "dumb" && room;
}

int TerminalWidth() {
  winsize size{};
  return ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0 ? size.ws_col : 100;
}

// Times a process that exits abnormally during training is started again.
constexpr int kMaxRestarts = 3;



std::string SelfDir() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  std::string self(path, n);
  return self.substr(0, self.rfind('/'));
}

int Fail(const std::string& message) {
  std::cerr << "segps-local: " << message << std::endl;
  return 1;
}

// Deletes a directory of the job's own when the job ends.
struct RemoveWhenDone {
  std::string dir;
  ~RemoveWhenDone() {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
};

// A job run on this machine: its processes from start to report. Each step
// returns what went wrong, or "" when it went well.
class LocalJob {
 public:
  LocalJob(std::string config_path, segps::v1::JobConfig config, std::string bin)
      : config_path_(std::move(config_path)),
        config_(std::move(config)),
        bin_(std::move(bin)),
        chain_(config_.model().combine() == segps::v1::CHAIN),
        segments_(config_.model().segments_size()) {}

  std::string Run() {
    for (auto step : {&LocalJob::CheckData, &LocalJob::MakeDirectories, &LocalJob::SetUpSecurity}) {
      if (std::string failed = (this->*step)(); !failed.empty()) return failed;
    }
    t0_ = absl::Now();
    launcher_.emplace(&console_);
    for (auto step : {&LocalJob::StartWorkers, &LocalJob::StartServers, &LocalJob::Connect, &LocalJob::Supervise,
                      &LocalJob::Evaluate, &LocalJob::Export, &LocalJob::Plot, &LocalJob::ShutDown}) {
      if (std::string failed = (this->*step)(); !failed.empty()) return failed;
    }
    std::cout << "segps-local: done in " << absl::ToDoubleSeconds(absl::Now() - t0_) << " s; report in "
              << absl::GetFlag(FLAGS_report) << std::endl;
    return "";
  }

 private:
  // A user's files are checked whole before anything starts, so that a bad
  // row stops the job with its file, row and column instead of one worker
  // failing midway. Built-in sets are right by construction.
  std::string CheckData() {
    const auto source = config_.data().source();
    if (source != segps::v1::NPY && source != segps::v1::CSV) return "";
    absl::StatusOr<segps::TrainTest> data = segps::LoadData(config_);
    absl::Status checked = data.ok() ? segps::CheckAllRows(data->train) : data.status();
    if (checked.ok()) checked = segps::CheckAllRows(data->test);
    if (!checked.ok()) return absl::StrCat("data: ", checked.message());
    std::cout << "segps-local: data: " << data->train.size() << " training and " << data->test.size()
              << " test samples of " << data->train.width << " features" << std::endl;
    return "";
  }

  std::string MakeDirectories() {
    // Each worker leaves its per-epoch history here for the evaluation's report.
    char history_template[] = "/tmp/segps-history.XXXXXX";
    if (mkdtemp(history_template) == nullptr) return "cannot make a directory for the workers' histories";
    history_dir_ = remove_history_.dir = history_template;
    // Checkpoints, so that a server that dies is restarted without losing
    // the job, and the same command resumes a job that was stopped.
    if (absl::GetFlag(FLAGS_no_checkpoints)) return "";
    checkpoint_dir_ = absl::GetFlag(FLAGS_checkpoint_dir);
    if (checkpoint_dir_.empty()) checkpoint_dir_ = config_.checkpoint().dir();
    if (checkpoint_dir_.empty()) checkpoint_dir_ = "segps-runs/" + JobName();
    bool resuming = false;
    for (const auto& segment : config_.model().segments()) {
      const std::filesystem::path dir = std::filesystem::path(checkpoint_dir_) / segment.name();
      std::error_code error;
      if (absl::GetFlag(FLAGS_fresh)) {
        std::filesystem::remove_all(dir, error);
        if (error) return absl::StrCat("--fresh: cannot delete ", dir.string(), ": ", error.message());
      }
      resuming |= std::filesystem::is_directory(dir, error) && !std::filesystem::is_empty(dir, error);
    }
    std::cout << "segps-local: " << (resuming ? "resuming the job from its checkpoints in " : "checkpoints in ")
              << checkpoint_dir_ << (resuming ? " (--fresh starts over)" : " (the same command resumes the job)")
              << std::endl;
    return "";
  }

  // The config's name, else its file's, as a folder name.
  std::string JobName() const {
    std::string name = config_.name();
    if (name.empty()) name = std::filesystem::path(config_path_).stem().string();
    for (char& c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
    }
    return name.empty() || name[0] == '.' ? "job" : name;
  }

  // A token for this job alone, or mutual TLS with tokens (--tls), or the
  // config's own security (deploy/local/job_security.h).
  std::string SetUpSecurity() {
    absl::StatusOr<segps::JobSecurity> secured =
        segps::SecureJob(config_.security(), absl::GetFlag(FLAGS_tls), SEGPS_DEPLOY_DIR);
    if (!secured.ok()) return std::string(secured.status().message());
    remove_secrets_.dir = secured->dir;
    security_ = *std::move(secured);
    std::cout << security_.banner << std::endl;
    return "";
  }

  void DescribeChain() const {
    std::string stages;
    for (int k = 0; k < segments_; ++k) {
      std::vector<std::string> widths;
      for (const auto& layer : config_.model().segments(k).layers()) widths.push_back(std::to_string(layer.units()));
      absl::StrAppend(&stages, k ? " | " : "", config_.model().segments(k).name(), " [", absl::StrJoin(widths, " "),
                      "]");
    }
    std::cout << "segps-local: a chain of " << segments_ << " stages ("
              << segps::v1::Partition_Name(config_.model().partition()) << "), input "
              << config_.model().input_width() << ": " << stages << std::endl;
  }

  std::vector<std::string> WorkerArgs(int k, uint32_t r) const {
    std::vector<std::string> args = {bin_ + "/segps-worker", "--config", config_path_, "--segment", std::to_string(k),
                                     "--rank", std::to_string(r), "--servers=-", "--device",
                                     absl::GetFlag(FLAGS_device), "--cpu_threads",
                                     std::to_string(absl::GetFlag(FLAGS_cpu_threads)), "--history_dir", history_dir_};
    if (chain_ && k + 1 < segments_) args.push_back("--next_stage=-");
    args.insert(args.end(), security_.worker.begin(), security_.worker.end());
    if (chain_ && k > 0) args.insert(args.end(), security_.stage_link.begin(), security_.stage_link.end());
    const bool straggler = k == 0 && r + 1 == segps::WorkersOf(config_, k);
    if (straggler && absl::GetFlag(FLAGS_straggler_ms) > 0) {
      args.insert(args.end(), {"--slowdown_ms", std::to_string(absl::GetFlag(FLAGS_straggler_ms))});
    }
    const double slowdown =
        absl::GetFlag(FLAGS_slowdown_factor) * (straggler ? absl::GetFlag(FLAGS_straggler_factor) : 1);
    if (slowdown != 1) args.insert(args.end(), {"--slowdown_factor", absl::StrCat(slowdown)});
    if (absl::GetFlag(FLAGS_pass_ms) != 0) {
      args.insert(args.end(), {"--pass_ms", absl::StrCat(absl::GetFlag(FLAGS_pass_ms))});
    }
    return args;
  }

  // Workers start first: a worker needs more CPU before it can register
  // than a server needs to listen (walk-through: ~7 ms, its data included,
  // against ~2 ms), on cores they all share. They read the servers'
  // addresses from stdin once every server listens. A CHAIN's stages:
  // replica r of stage k (k > 0) prints the address it takes stage k - 1's
  // activations on; replica r of stage k - 1 reads it from stdin after the
  // servers' line.
  std::string StartWorkers() {
    if (chain_) DescribeChain();
    for (int k = 0; k < segments_; ++k) {
      for (uint32_t r = 0; r < segps::WorkersOf(config_, k); ++r) {
        Child* c = launcher_->Spawn(absl::StrCat(config_.model().segments(k).name(), "/", r), WorkerArgs(k, r),
                                   /*with_input=*/true);
        if (c == nullptr) return "cannot start segps-worker";
        if (chain_ && k > 0) {
          c->on_line = [this, k, r](const std::string& line) {
            static const std::string kLink = "stage link listening on ";
            if (absl::StartsWith(line, kLink)) stage_links_[{k, r}] = line.substr(kLink.size());
          };
        }
        workers_.push_back(c);
        worker_places_.push_back({k, r});
      }
    }
    return "";
  }

  std::string StartServers() {
    const uint32_t num_servers = config_.cluster().num_servers();
    addresses_.assign(num_servers, "");
    // Replicated ranges: each server is told every server's address, so
    // their ports are chosen first.
    const std::vector<std::string> listen = config_.cluster().replicas() > 1
                                                ? segps::FreeLoopbackAddresses(num_servers)
                                                : std::vector<std::string>(num_servers, "127.0.0.1:0");
    for (uint32_t i = 0; i < num_servers; ++i) {
      std::vector<std::string> args = {bin_ + "/segps-server", "--config", config_path_, "--index", std::to_string(i),
                                       "--listen", listen[i], "--apply_threads",
                                       std::to_string(absl::GetFlag(FLAGS_apply_threads)), "--checkpoint_dir",
                                       checkpoint_dir_};
      if (config_.cluster().replicas() > 1) args.insert(args.end(), {"--servers", absl::StrJoin(listen, ",")});
      args.insert(args.end(), security_.server.begin(), security_.server.end());
      Child* c = launcher_->Spawn(absl::StrCat("server", i), args);
      if (c == nullptr) return "cannot start segps-server";
      c->on_line = [this, i](const std::string& line) {
        static const std::string kReady = "segps-server listening on ";
        if (absl::StartsWith(line, kReady)) addresses_[i] = line.substr(kReady.size());
      };
      servers_.push_back(c);
    }
    return "";
  }

  static bool AnyFailed(const std::vector<Child*>& group) {
    for (Child* c : group) {
      if (!c->running && !Succeeded(*c)) return true;
    }
    return false;
  }

  // Waits for every server (and stage link) to listen, then tells the workers.
  std::string Connect() {
    const size_t links = chain_ ? workers_.size() - segps::WorkersOf(config_, 0) : 0;
    auto ready = [&] {
      for (const auto& a : addresses_) {
        if (a.empty()) return AnyFailed(servers_) || AnyFailed(workers_);
      }
      return stage_links_.size() == links || AnyFailed(workers_);
    };
    if (!launcher_->RunUntil(ready, absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_start_timeout_s))) ||
        AnyFailed(servers_)) {
      return launcher_->interrupted() ? "interrupted" : "servers did not start";
    }
    for (Child* c : workers_) {
      if (!c->running && !Succeeded(*c)) return absl::StrCat(c->name, " failed (", Describe(c->status), ")");
    }
    server_list_ = absl::StrJoin(addresses_, ",");
    std::cout << "segps-local: " << addresses_.size() << " servers at " << server_list_ << std::endl;
    for (size_t i = 0; i < workers_.size(); ++i) {
      const auto [k, r] = worker_places_[i];
      launcher_->SendInput(workers_[i], chain_ && k + 1 < segments_
                                           ? absl::StrCat(server_list_, "\n", stage_links_[{k + 1, r}], "\n")
                                           : server_list_ + "\n");
    }
    return "";
  }

  // Whether a process of `group` stopped: any server, or a worker that failed.
  static bool Stopped(const std::vector<Child*>& group, bool servers) {
    for (Child* c : group) {
      if (!c->running && (servers || !Succeeded(*c))) return true;
    }
    return false;
  }

  // A process killed during training (a crash, the OOM killer, kill -9) is
  // started again with the same command (a server on its address: it
  // restores its newest checkpoint, and the workers rejoin it; a pipeline
  // stage on its link's address: the chain rolls back to a checkpoint every
  // stage holds, and its neighbours reopen their links to it), up to
  // kMaxRestarts times each. One that exits with an error meant it: its
  // error stands.
  std::string Restart(std::vector<Child*>& group, bool servers) {
    for (Child*& c : group) {
      if (c->running || (!servers && Succeeded(*c))) continue;
      if (WIFEXITED(c->status) && WEXITSTATUS(c->status) != 0) {
        return absl::StrCat(c->name, " failed (", Describe(c->status), ")");
      }
      const std::string why = absl::StrCat(c->name, " stopped during training (", Describe(c->status), ")");
      if (absl::GetFlag(FLAGS_no_restart) || c->restarts >= kMaxRestarts) {
        return absl::GetFlag(FLAGS_no_restart) ? why : absl::StrCat(why, " after ", kMaxRestarts, " restarts");
      }
      std::vector<std::string> argv = c->argv;
      const size_t i = &c - group.data();
      for (std::string& a : argv) {
        if (a == "127.0.0.1:0") a = addresses_[i];                // a server keeps its address
        if (a == "--servers=-") a = "--servers=" + server_list_;  // a worker is told the servers at once
        // A pipeline stage keeps its link's address and is told the next stage's.
        if (a == "--next_stage=-") {
          a = "--next_stage=" + stage_links_[{worker_places_[i].first + 1, worker_places_[i].second}];
        }
      }
      if (!servers && chain_ && worker_places_[i].first > 0) {
        argv.push_back("--stage_listen=" + stage_links_[worker_places_[i]]);
      }
      console_.Say(absl::StrCat("segps-local: ", why, "; restarting it (", c->restarts + 1, " of ", kMaxRestarts, ")"));
      Child* again = launcher_->Spawn(c->name, argv);
      if (again == nullptr) return "cannot restart " + c->name;
      again->restarts = c->restarts + 1;
      again->on_line = c->on_line;
      c = again;
    }
    return "";
  }

  // Runs until every worker has finished, restarting what was killed.
  std::string Supervise() {
    auto done = [&] {
      if (Stopped(workers_, false) || Stopped(servers_, true)) return true;
      for (Child* c : workers_) {
        if (c->running) return false;
      }
      return true;
    };
    while (true) {
      if (!launcher_->RunUntil(done)) return "interrupted";
      if (!Stopped(workers_, false) && !Stopped(servers_, true)) break;
      for (auto* group : {&servers_, &workers_}) {
        if (std::string failed = Restart(*group, group == &servers_); !failed.empty()) return failed;
      }
    }
    for (Child* c : workers_) {
      if (!c->running && !Succeeded(*c)) return absl::StrCat(c->name, " failed (", Describe(c->status), ")");
    }
    console_.EndProgress();
    console_.Say(absl::StrCat("segps-local: training finished in ", absl::ToDoubleSeconds(absl::Now() - t0_),
                              " s; evaluating"));
    return "";
  }

  // Runs a tool against the servers to its end; what went wrong, if anything.
  std::string RunTool(const std::string& name, const std::vector<std::string>& args) {
    Child* tool = launcher_->Spawn(name, args);
    if (tool == nullptr) return "cannot start " + args[0];
    if (!launcher_->RunUntil([&] { return !tool->running && tool->fd < 0; })) return "interrupted";
    return Succeeded(*tool) ? "" : absl::StrCat(name, " failed (", Describe(tool->status), ")");
  }

  std::string Evaluate() {
    std::vector<std::string> args = {bin_ + "/segps-eval", "--config", config_path_, "--servers", server_list_,
                                     "--report", absl::GetFlag(FLAGS_report), "--history_dir", history_dir_};
    args.insert(args.end(), security_.reader.begin(), security_.reader.end());
    if (!absl::GetFlag(FLAGS_params_dir).empty()) {
      args.insert(args.end(), {"--dump_params", absl::GetFlag(FLAGS_params_dir)});
    }
    if (!absl::GetFlag(FLAGS_probabilities_out).empty()) {
      args.insert(args.end(), {"--probabilities_out", absl::GetFlag(FLAGS_probabilities_out)});
    }
    return RunTool("eval", args);
  }

  std::string Export() {
    if (absl::GetFlag(FLAGS_export).empty() && absl::GetFlag(FLAGS_onnx).empty()) return "";
    std::vector<std::string> args = {bin_ + "/segps-export", "--config", config_path_, "--servers", server_list_};
    args.insert(args.end(), security_.reader.begin(), security_.reader.end());
    if (!absl::GetFlag(FLAGS_export).empty()) args.insert(args.end(), {"--out", absl::GetFlag(FLAGS_export)});
    if (!absl::GetFlag(FLAGS_onnx).empty()) args.insert(args.end(), {"--onnx", absl::GetFlag(FLAGS_onnx)});
    return RunTool("export", args);
  }

  // A plot that cannot be drawn is a warning: the job's result stands.
  std::string Plot() {
    if (absl::GetFlag(FLAGS_plot).empty()) return "";
    std::error_code made;
    std::filesystem::create_directories(absl::GetFlag(FLAGS_plot), made);
    const std::string failed =
        made ? absl::StrCat("cannot create ", absl::GetFlag(FLAGS_plot), ": ", made.message())
             : RunTool("plot", {"/usr/bin/python3", std::string(SEGPS_PYTHON_DIR) + "/segps_plot.py",
                                "learning-curves", "--out", absl::GetFlag(FLAGS_plot), absl::GetFlag(FLAGS_report)});
    if (!failed.empty()) {
      std::cout << "segps-local: warning: --plot: " << failed << "; the job itself succeeded" << std::endl;
    }
    return "";
  }

  std::string ShutDown() {
    launcher_->KillAll();
    for (Child* c : servers_) {
      if (!(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0)) {
        return absl::StrCat(c->name, " did not shut down cleanly (", Describe(c->status), ")");
      }
    }
    return "";
  }

  const std::string config_path_;
  const segps::v1::JobConfig config_;
  const std::string bin_;
  const bool chain_;
  const int segments_;
  std::string history_dir_, checkpoint_dir_;
  RemoveWhenDone remove_history_, remove_secrets_;
  segps::JobSecurity security_;
  absl::Time t0_;
  // Made once the job's files are ready (it takes over the job's signals);
  // declared after the directories, so that its processes end before those are removed.
  segps::Console console_{&std::cout, absl::GetFlag(FLAGS_verbose), LiveTerminal(segments_), TerminalWidth()};
  std::optional<Launcher> launcher_;
  std::map<std::pair<int, uint32_t>, std::string> stage_links_;
  std::vector<Child*> workers_, servers_;
  std::vector<std::pair<int, uint32_t>> worker_places_;  // (segment, rank) of each worker
  std::vector<std::string> addresses_;
  std::string server_list_;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> positional = segps::ParseCommandLine(
      argc, argv, "Runs a whole segps cluster on this machine.\n  segps-local --config FILE [--report FILE]");
  if (positional.size() > 1) return Fail(std::string("unexpected argument '") + positional[1] + "'");
  const std::string config_path = absl::GetFlag(FLAGS_config);
  if (config_path.empty()) return Fail("--config is required (see --help)");
  absl::StatusOr<segps::v1::JobConfig> config = segps::LoadConfig(config_path);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  for (const segps::v1::SegmentConfig& segment : config->model().segments()) {
    if (segps::DeclaredByTensors(segment)) {
      return Fail(absl::StrCat("segment \"", segment.name(),
                               "\" is declared by its tensors: its workers are Python processes (segps.torch), which "
                               "segps-local does not start; segps.local.Servers starts its servers (docs/python.md)"));
    }
  }
  const std::string bin = absl::GetFlag(FLAGS_bin_dir).empty() ? SelfDir() : absl::GetFlag(FLAGS_bin_dir);
  for (const char* tool : {"segps-server", "segps-worker", "segps-eval", "segps-export"}) {
    if (access((bin + "/" + tool).c_str(), X_OK) != 0) return Fail(absl::StrCat(bin, "/", tool, " not found (see --bin_dir)"));
  }
  // OpenBLAS would start a pool per core at load, which spins for ~0.1 s on
  // cores the servers need (a quarter of the walk-through's run time); a
  // CPU worker then sets its own count (--cpu_threads). A user's own
  // setting wins.
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
  // Servers keep large freed buffers for reuse; two malloc arenas keep that
  // from multiplying by their threads (common/malloc_tuning.h).
  setenv("MALLOC_ARENA_MAX", "2", /*overwrite=*/0);
  LocalJob job(config_path, *std::move(config), bin);
  if (std::string failed = job.Run(); !failed.empty()) return Fail(failed);
  return 0;
}
