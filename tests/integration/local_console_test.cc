// What a user sees of segps-local: the walk-through's whole output fits a
// screen, --verbose shows the rest, and in a terminal (a pseudo-terminal
// here) progress is redrawn in place rather than scrolled.
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

std::string Config(const std::string& name) { return std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/" + name; }

// Runs `argv` on a pseudo-terminal (TERM=xterm, 120 columns) to its end or
// `timeout`; what it wrote there, and its wait status (-1 on the timeout).
std::pair<std::string, int> RunOnTerminal(std::vector<std::string> argv, absl::Duration timeout) {
  const std::string dir = MakeTempDir();  // its working directory (segps-runs/ goes there)
  winsize size{};
  size.ws_row = 40;
  size.ws_col = 120;
  int terminal = -1;
  const pid_t pid = forkpty(&terminal, nullptr, nullptr, &size);
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    setenv("TERM", "xterm", 1);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  std::string text;
  bool closed = false;
  for (const absl::Time give_up = absl::Now() + timeout; !closed && absl::Now() < give_up;) {
    pollfd fd{terminal, POLLIN, 0};
    if (poll(&fd, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(terminal, buf, sizeof(buf));
    closed = n <= 0;  // EIO: the child closed the terminal, exiting
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  }
  if (!closed) kill(pid, SIGKILL);
  int status = -1;
  waitpid(pid, &status, 0);
  if (!closed) status = -1;
  close(terminal);
  return {text, status};
}

TEST(LocalConsole, TheWalkThroughSaysWhatAUserNeedsInAtMost40Lines) {
  const std::string dir = MakeTempDir();
  std::unique_ptr<Subprocess> quiet = Subprocess::Start(
      {BinaryPath("segps-local"), "--config", Config("seed.pbtxt"), "--report", dir + "/report.json"});
  std::optional<int> status = quiet->Wait(absl::Minutes(3));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << quiet->output();
  const std::string output = quiet->output();
  const size_t lines = std::count(output.begin(), output.end(), '\n');
  EXPECT_LE(lines, 40u) << output;
  for (const char* shown : {"segps-local: 2 servers at", "segment1/0: epoch 5/5 step 200/200", "segment2: done: 200",
                            "ENSEMBLE (average of softmax outputs) accuracy", "segps-local: done in"}) {
    EXPECT_NE(output.find(shown), std::string::npos) << shown << "\n" << output;
  }
  EXPECT_EQ(output.find("holds 3914 parameters"), std::string::npos) << output;

  std::unique_ptr<Subprocess> verbose = Subprocess::Start({BinaryPath("segps-local"), "--config",
                                                           Config("seed.pbtxt"), "--report", dir + "/report.json",
                                                           "--verbose"});
  status = verbose->Wait(absl::Minutes(3));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << verbose->output();
  for (const char* shown : {"holds 3914 parameters", "registered at clock 0", "[eval] traffic segment1"}) {
    EXPECT_NE(verbose->output().find(shown), std::string::npos) << shown << "\n" << verbose->output();
  }
}

// On a terminal, each segment's progress is one line drawn again in place
// (cursor up over the block, the line cleared and written), not a line per
// report; what scrolls (the result) comes below.
TEST(LocalConsole, OnATerminalProgressIsRedrawnInPlace) {
  const std::string dir = MakeTempDir();
  const auto [text, status] = RunOnTerminal(
      {BinaryPath("segps-local"), "--config", Config("teacher.pbtxt"), "--report", dir + "/report.json"},
      absl::Minutes(3));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  // Either segment may report first, and its line comes first in the block.
  EXPECT_TRUE(text.find("\x1b[2A\r\x1b[2Krelu64") != std::string::npos ||
              text.find("\x1b[2A\r\x1b[2Ktanh128") != std::string::npos)
      << "no redraw of the two segments' lines:\n" << text;
  EXPECT_NE(text.find("\x1b[2Krelu64: done"), std::string::npos) << text;
  EXPECT_NE(text.find("\x1b[2Ktanh128: done"), std::string::npos) << text;
  EXPECT_EQ(text.find("I relu64/0: epoch 1/6 step"), std::string::npos) << "progress scrolled:\n" << text;
  EXPECT_NE(text.find("ENSEMBLE (average of softmax outputs) accuracy"), std::string::npos) << text;
  // Every redraw moves up over exactly the lines drawn: the block never grows past the segments.
  EXPECT_EQ(text.find("\x1b[3A"), std::string::npos) << text;
}

}  // namespace
}  // namespace segps
