// Parameter servers as separate processes on loopback for integration
// tests, each keeping its address and checkpoint directory, so that a
// killed one is started again exactly as before; workers and the evaluator
// started against them.
#ifndef SEGPS_TESTS_SUPPORT_PROCESS_CLUSTER_H_
#define SEGPS_TESTS_SUPPORT_PROCESS_CLUSTER_H_

#include <signal.h>

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/loopback.h"
#include "tests/support/subprocess.h"

namespace segps {

// A cluster whose servers keep their addresses and checkpoint directories,
// so that a killed one is started again exactly as before.
// With `tokens`, calls carry tokens as segps-local's do: the servers read
// DIR/tokens (a worker, a reader and the servers' own `server` line, which
// seals the states a rollback must show), workers DIR/worker.token, the
// evaluator DIR/reader.token.
class ProcessCluster {
 public:
  // With `replicated` (cluster.replicas >= 2) the servers' ports are chosen
  // first, so that each is told every other's address (--servers).
  ProcessCluster(std::string config, std::string dir, int servers, bool checkpoints = true, bool tokens = false,
                 bool replicated = false)
      : config_(std::move(config)), dir_(std::move(dir)), checkpoints_(checkpoints), tokens_(tokens),
        replicated_(replicated) {
    if (tokens_) {
      WriteFile(dir_ + "/worker.token", "worker 0123456789abcdef0123456789abcdef\n");
      WriteFile(dir_ + "/reader.token", "reader fedcba9876543210fedcba9876543210\n");
      WriteFile(dir_ + "/tokens", ReadFile(dir_ + "/worker.token") + ReadFile(dir_ + "/reader.token") +
                                      "server 00112233445566778899aabbccddeeff\n");
    }
    addresses_ = replicated_ ? FreeLoopbackAddresses(servers) : std::vector<std::string>(servers, "127.0.0.1:0");
    for (int i = 0; i < servers; ++i) {
      servers_.emplace_back();
      EXPECT_TRUE(StartServer(i)) << "server " << i << " did not listen on " << addresses_[i];
    }
  }

  // Starts server i (again) on its address, with `flags` besides; false if
  // it does not listen.
  bool StartServer(int i, const std::vector<std::string>& flags = {}) {
    std::vector<std::string> command = {BinaryPath("segps-server"), "--config", config_, "--index",
                                        std::to_string(i), "--listen", addresses_[i]};
    command.insert(command.end(), flags.begin(), flags.end());
    if (replicated_) {
      command.push_back("--servers");
      command.push_back(Joined());
    }
    if (checkpoints_) {
      command.push_back("--checkpoint_dir");
      command.push_back(absl::StrCat(dir_, "/ckpt", i));
    }
    servers_[i] = Subprocess::Start(WithToken(command, "tokens"));
    std::optional<std::string> line = servers_[i]->WaitForLine("listening on", absl::Seconds(60));
    if (!line.has_value()) return false;
    addresses_[i] = line->substr(line->rfind(' ') + 1);
    return true;
  }
  // Stops server i for `duration` (a long pause, a VM migration), then lets it run.
  void Pause(int i, absl::Duration duration) {
    servers_[i]->Signal(SIGSTOP);
    absl::SleepFor(duration);
    servers_[i]->Signal(SIGCONT);
  }
  // Waits until server i has written a checkpoint (it logs the first of each
  // segment): a server killed before that cannot rejoin a running job,
  // and its checkpoint writer runs behind its cuts on a loaded machine.
  bool WaitForFirstCheckpoint(int i) {
    return servers_[i]->WaitForLine("checkpoint of ", absl::Seconds(120)).has_value();
  }
  // Waits for server i to print a line holding `text`.
  bool WaitForServerLine(int i, const std::string& text) {
    return servers_[i]->WaitForLine(text, absl::Seconds(120)).has_value();
  }
  // Server i's exit status, once it exits within 60 s.
  std::optional<int> WaitServer(int i) { return servers_[i]->Wait(absl::Seconds(60)); }
  void KillServer(int i) {
    servers_[i]->Signal(SIGKILL);
    servers_[i]->Wait(absl::Seconds(30));
  }

  std::unique_ptr<Subprocess> StartWorker(const std::string& segment, int rank) const {
    return Subprocess::Start(WithToken({BinaryPath("segps-worker"), "--config", config_, "--segment", segment,
                                        "--rank", std::to_string(rank), "--servers", Joined()},
                                       "worker.token"));
  }

  // segps-eval's output with `extra` flags (its exit checked).
  std::string Evaluate(const std::vector<std::string>& extra) const {
    std::vector<std::string> command = {BinaryPath("segps-eval"), "--config", config_, "--servers", Joined()};
    command.insert(command.end(), extra.begin(), extra.end());
    std::unique_ptr<Subprocess> eval = Subprocess::Start(WithToken(command, "reader.token"));
    std::optional<int> status = eval->Wait(absl::Seconds(120));
    EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << eval->output();
    return eval->output();
  }
  pid_t ServerPid(int i) const { return servers_[i]->pid(); }
  // Every server's address, comma-separated (--servers).
  std::string Joined() const {
    std::string joined;
    for (const std::string& a : addresses_) joined += (joined.empty() ? "" : ",") + a;
    return joined;
  }
  const std::vector<std::string>& addresses() const { return addresses_; }

  // The trained parameters of segment `name`, as segps-eval dumps them.
  std::string Parameters(const std::string& name) const {
    Evaluate({"--dump_params", dir_});
    return ReadFile(dir_ + "/" + name + ".npy");
  }

  // segps-eval's output; it scores only servers that agree.
  std::string Evaluation() const { return Evaluate({}); }

  double EnsembleAccuracy() const {
    const std::string output = Evaluation();
    std::smatch m;
    const std::regex re("ENSEMBLE.* accuracy *([0-9.]+)%");
    return std::regex_search(output, m, re) ? std::stod(m[1]) / 100 : -1;
  }

  std::string Output() const {
    std::string all;
    for (const auto& s : servers_) all += s->output();
    return all;
  }

 private:
  std::vector<std::string> WithToken(std::vector<std::string> command, const char* file) const {
    if (tokens_) {
      command.push_back("--token_file");
      command.push_back(absl::StrCat(dir_, "/", file));
    }
    return command;
  }

  const std::string config_, dir_;
  const bool checkpoints_, tokens_, replicated_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
};

}  // namespace segps

#endif  // SEGPS_TESTS_SUPPORT_PROCESS_CLUSTER_H_
