// segps-local's processes: started with their output on a pipe, relayed
// line by line to the console (deploy/local/console.h), given their stdin
// once, reaped, and stopped in order; every child dies with the launcher
// (PR_SET_PDEATHSIG). Ctrl-C and SIGTERM reach the launcher alone (each
// child has its own process group), which then stops its children.
//
// Thread safety: none; one thread runs the launcher.
#ifndef SEGPS_DEPLOY_LOCAL_PROCESSES_H_
#define SEGPS_DEPLOY_LOCAL_PROCESSES_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "deploy/local/console.h"

namespace segps {

struct Child {
  std::string name;
  pid_t pid = -1;
  int fd = -1;          // read end of the child's stdout+stderr
  int input = -1;       // write end of the child's stdin, if it was given one
  std::string partial;  // an output line not yet complete
  bool running = true;
  int status = 0;
  std::function<void(const std::string&)> on_line;  // sees each line before it is relayed
  std::vector<std::string> argv;  // to start it again
  int restarts = 0;
};

class Launcher {
 public:
  explicit Launcher(Console* console);
  ~Launcher() { KillAll(); }

  // `with_input`: the child's stdin is a pipe the launcher writes with
  // SendInput (otherwise it inherits the launcher's).
  Child* Spawn(const std::string& name, std::vector<std::string> argv, bool with_input = false);

  // Writes `text` to a child's stdin and closes it. A child that already
  // exited is reported by its exit status, not here.
  void SendInput(Child* child, const std::string& text);

  // Relays output and reaps children until `done()` or `deadline`; false on
  // a deadline or an interrupt.
  bool RunUntil(const std::function<bool()>& done, absl::Time deadline = absl::InfiniteFuture(),
                bool stop_on_interrupt = true);

  void Terminate(Child* c);

  // SIGTERM to everyone still running, SIGKILL after a grace period.
  void KillAll();

  bool AllExited() const;
  bool interrupted() const { return interrupted_; }
  const std::vector<std::unique_ptr<Child>>& children() const { return children_; }

 private:
  void HandleSignals();
  void ReadOutput(Child* c);
  void Emit(Child* c, const std::string& line);
  void Reap();

  Console* const console_;
  int signal_fd_ = -1;
  bool interrupted_ = false;
  std::vector<std::unique_ptr<Child>> children_;
};

// "exit code 1", "killed by signal 9".
std::string Describe(int status);
// Whether `c` exited with code 0.
bool Succeeded(const Child& c);

}  // namespace segps

#endif  // SEGPS_DEPLOY_LOCAL_PROCESSES_H_
