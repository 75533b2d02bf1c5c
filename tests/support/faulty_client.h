// A ParameterClient that injects faults into another's calls, by call and
// count: a call failed before it is sent, a reply lost after the servers
// acted on it, a call sent twice, a registration dropped, a call held back.
// Tests script them to drive a worker's retries, backoff and re-registration
// deterministically, without killing processes.
//
// Thread safety: as the wrapped client (the counts are locked).
#ifndef SEGPS_TESTS_SUPPORT_FAULTY_CLIENT_H_
#define SEGPS_TESTS_SUPPORT_FAULTY_CLIENT_H_

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "worker/client/ps_client.h"

namespace segps {

enum class Fault {
  kFailBefore,   // UNAVAILABLE, nothing sent
  kLoseReply,    // sent and acted on, then UNAVAILABLE
  kDuplicate,    // sent twice; the second reply is returned
  kNotFound,     // NOT_FOUND, nothing sent: the servers dropped the registration
  kDelay,        // held for the rule's delay, then sent
};

struct FaultRule {
  std::string call;  // "Register", "Pull", "Send", "SendAndPull", "Heartbeat"
  int nth = 1;       // the call it hits, counting from 1
  Fault fault = Fault::kFailBefore;
  absl::Duration delay = absl::ZeroDuration();  // kDelay
};

class FaultyClient final : public ParameterClient {
 public:
  FaultyClient(std::unique_ptr<ParameterClient> inner, std::vector<FaultRule> rules)
      : inner_(std::move(inner)), rules_(std::move(rules)) {}

  // Faults injected so far.
  int injected() {
    MutexLock lock(&mu_);
    return injected_;
  }

  absl::StatusOr<Registration> Register(int segment, std::optional<uint32_t> rank) override {
    return Run<Registration>("Register", [&] { return inner_->Register(segment, rank); });
  }
  absl::StatusOr<uint64_t> Pull(int segment, uint64_t clock, absl::Span<float> dest) override {
    return Run<uint64_t>("Pull", [&] { return inner_->Pull(segment, clock, dest); });
  }
  std::optional<std::vector<uint32_t>> Shares(int segment, uint64_t clock) override {
    return inner_->Shares(segment, clock);
  }
  std::unique_ptr<EncodedPush> Encode(int segment, uint64_t clock, absl::Span<const float> grad) override {
    return inner_->Encode(segment, clock, grad);
  }
  std::unique_ptr<EncodedPush> EncodeSparse(int segment, uint64_t clock, absl::Span<const uint64_t> indices,
                                            absl::Span<const float> values) override {
    return inner_->EncodeSparse(segment, clock, indices, values);
  }
  absl::Status Send(const EncodedPush& push) override {
    return Run<bool>("Send", [&]() -> absl::StatusOr<bool> {
             absl::Status s = inner_->Send(push);
             if (!s.ok()) return s;
             return true;
           }).status();
  }
  absl::StatusOr<uint64_t> SendAndPull(const EncodedPush& push, absl::Span<float> dest) override {
    return Run<uint64_t>("SendAndPull", [&] { return inner_->SendAndPull(push, dest); });
  }
  absl::Status Heartbeat() override {
    return Run<bool>("Heartbeat", [&]() -> absl::StatusOr<bool> {
             absl::Status s = inner_->Heartbeat();
             if (!s.ok()) return s;
             return true;
           }).status();
  }
  absl::Status Leave() override { return inner_->Leave(); }
  absl::StatusOr<std::vector<v1::StatsResponse>> Stats() override { return inner_->Stats(); }

 private:
  // The fault for this call of `call`, if a rule names it.
  std::optional<FaultRule> Next(const std::string& call) {
    MutexLock lock(&mu_);
    const int n = ++counts_[call];
    for (const FaultRule& r : rules_) {
      if (r.call == call && r.nth == n) {
        ++injected_;
        return r;
      }
    }
    return std::nullopt;
  }

  template <typename T, typename F>
  absl::StatusOr<T> Run(const std::string& call, F send) {
    const std::optional<FaultRule> fault = Next(call);
    const std::string what = absl::StrCat("injected fault in ", call);
    if (!fault.has_value()) return send();
    switch (fault->fault) {
      case Fault::kFailBefore:
        return absl::UnavailableError(what + ": not sent");
      case Fault::kNotFound:
        return absl::NotFoundError(what + ": registration dropped");
      case Fault::kLoseReply: {
        absl::StatusOr<T> sent = send();
        return absl::UnavailableError(absl::StrCat(what, ": reply lost (the call ", sent.ok() ? "succeeded" : "failed",
                                                   ")"));
      }
      case Fault::kDuplicate: {
        absl::StatusOr<T> first = send();
        (void)first;
        return send();
      }
      case Fault::kDelay:
        absl::SleepFor(fault->delay);
        return send();
    }
    return send();
  }

  const std::unique_ptr<ParameterClient> inner_;
  const std::vector<FaultRule> rules_;
  Mutex mu_;
  std::map<std::string, int> counts_ ABSL_GUARDED_BY(mu_);
  int injected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace segps

#endif  // SEGPS_TESTS_SUPPORT_FAULTY_CLIENT_H_
