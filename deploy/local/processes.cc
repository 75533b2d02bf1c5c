#include "deploy/local/processes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace segps {

Launcher::Launcher(Console* console) : console_(console) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  // A child that exits before reading its stdin must not kill the launcher.
  signal(SIGPIPE, SIG_IGN);
}

Child* Launcher::Spawn(const std::string& name, std::vector<std::string> argv, bool with_input) {
  int fds[2], in[2] = {-1, -1};
  if (pipe2(fds, O_CLOEXEC) != 0) return nullptr;
  if (with_input && pipe2(in, O_CLOEXEC) != 0) {
    close(fds[0]);
    close(fds[1]);
    return nullptr;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);  // Ctrl-C reaches the launcher, which stops children in order
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    if (with_input) dup2(in[0], STDIN_FILENO);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  if (with_input) close(in[0]);
  if (pid < 0) {
    close(fds[0]);
    if (with_input) close(in[1]);
    return nullptr;
  }
  auto child = std::make_unique<Child>();
  child->argv = argv;
  child->name = name;
  child->pid = pid;
  child->fd = fds[0];
  child->input = in[1];
  children_.push_back(std::move(child));
  return children_.back().get();
}

void Launcher::SendInput(Child* child, const std::string& text) {
  if (child->input < 0) return;
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(child->input, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(child->input);
  child->input = -1;
}

void Launcher::Terminate(Child* c) {
  if (c->running) kill(c->pid, SIGTERM);
}

void Launcher::KillAll() {
  for (auto& c : children_) Terminate(c.get());
  const auto exited = [this] { return AllExited(); };
  if (!RunUntil(exited, absl::Now() + absl::Seconds(5), /*stop_on_interrupt=*/false)) {
    for (auto& c : children_) {
      if (c->running) kill(c->pid, SIGKILL);
    }
    RunUntil(exited, absl::Now() + absl::Seconds(5), /*stop_on_interrupt=*/false);
  }
}

bool Launcher::AllExited() const {
  for (auto& c : children_) {
    if (c->running || c->fd >= 0) return false;
  }
  return true;
}

void Launcher::HandleSignals() {
  signalfd_siginfo info;
  while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
    if (info.ssi_signo == SIGINT || info.ssi_signo == SIGTERM) {
      console_->Say(absl::StrCat("segps-local: ", info.ssi_signo == SIGINT ? "interrupted" : "terminated",
                                 ", stopping every process"));
      interrupted_ = true;
    }
  }
}

void Launcher::ReadOutput(Child* c) {
  char buf[8192];
  const ssize_t n = read(c->fd, buf, sizeof(buf));
  if (n <= 0) {
    if (!c->partial.empty()) Emit(c, c->partial);
    c->partial.clear();
    close(c->fd);
    c->fd = -1;
    return;
  }
  c->partial.append(buf, n);
  size_t pos;
  while ((pos = c->partial.find_first_of("\r\n")) != std::string::npos) {
    std::string line = c->partial.substr(0, pos);
    c->partial.erase(0, pos + 1);
    if (!line.empty()) Emit(c, line);
  }
}

void Launcher::Emit(Child* c, const std::string& line) {
  if (c->on_line) c->on_line(line);
  console_->Line(c->name, line, absl::Now());
}

void Launcher::Reap() {
  for (auto& c : children_) {
    if (!c->running) continue;
    int status = 0;
    if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
      c->running = false;
      c->status = status;
    }
  }
}

bool Launcher::RunUntil(const std::function<bool()>& done, absl::Time deadline, bool stop_on_interrupt) {
  while (!done()) {
    if (interrupted_ && stop_on_interrupt) return false;
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    fds.push_back({signal_fd_, POLLIN, 0});
    owners.push_back(nullptr);
    for (auto& c : children_) {
      if (c->fd >= 0) {
        fds.push_back({c->fd, POLLIN, 0});
        owners.push_back(c.get());
      }
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int timeout = deadline == absl::InfiniteFuture() ? -1 : static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    if (poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) return false;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (owners[i] == nullptr) {
        HandleSignals();
      } else {
        ReadOutput(owners[i]);
      }
    }
    Reap();
  }
  return true;
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return "stopped";
}

bool Succeeded(const Child& c) { return !c.running && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0; }

}  // namespace segps
