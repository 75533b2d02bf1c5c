// Registration's calls to a ParameterServer in this process: the
// transport-free MembershipStub the membership tests drive recovery with.
// The server behind it may be replaced (a restart), and calls can be made
// to fail, to play a server that is down or a link that drops calls.
// Thread safety: calls may come from several threads (the server is
// thread-safe); replacing the server must not overlap them.
#ifndef SEGPS_TESTS_SUPPORT_INPROCESS_MEMBERSHIP_H_
#define SEGPS_TESTS_SUPPORT_INPROCESS_MEMBERSHIP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/parameter_server.h"
#include "worker/client/membership.h"

namespace segps {

class InProcessStub final : public MembershipStub {
 public:
  // `server` is the slot the server lives in (replaced by a restart); it
  // outlives the stub.
  InProcessStub(std::unique_ptr<ParameterServer>* server, size_t index) : server_(server), index_(index) {}

  absl::Status Register(const v1::RegisterRequest& request, v1::RegisterResponse* response) override {
    if (absl::Status down = Down(); !down.ok()) return down;
    if (registers_.fetch_add(1) == before_register_.load()) std::exchange(before_, nullptr)();
    return (*server_)->Register(request, response);
  }
  absl::Status Rollback(const v1::RollbackRequest& request, v1::RollbackResponse* response) override {
    if (absl::Status down = Down(); !down.ok()) return down;
    return (*server_)->Rollback(request, response);
  }
  std::string Name() const override { return absl::StrCat("server ", index_, " (in process)"); }

  // The next `n` calls fail with UNAVAILABLE, as a server still down would.
  void FailNext(int n) { fail_next_ = n; }
  // Runs `event` (a restart, say) just before the `n`th Register from now
  // (0: the next) reaches the server. Single-threaded tests only.
  void BeforeRegister(int n, std::function<void()> event) {
    before_register_ = registers_ + n;
    before_ = std::move(event);
  }

 private:
  absl::Status Down() {
    int left = fail_next_.load();
    while (left > 0 && !fail_next_.compare_exchange_weak(left, left - 1)) {
    }
    if (left > 0) return absl::UnavailableError(absl::StrCat("server ", index_, " is down"));
    return absl::OkStatus();
  }

  std::unique_ptr<ParameterServer>* const server_;
  const size_t index_;
  std::atomic<int> fail_next_{0};  // workers may register from several threads
  std::atomic<int> registers_{0};
  std::atomic<int> before_register_{-1};  // never reached unless BeforeRegister set it
  std::function<void()> before_;
};

}  // namespace segps

#endif  // SEGPS_TESTS_SUPPORT_INPROCESS_MEMBERSHIP_H_
