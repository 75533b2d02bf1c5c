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
#include "worker/client/completion.h"
#include "worker/client/ps_client.h"

namespace segps {

enum class Fault {
  kFailBefore,   // UNAVAILABLE, nothing sent
  kLoseReply,    // sent and acted on, then UNAVAILABLE
  kDuplicate,    // sent twice; the second reply is returned
  kNotFound,     // NOT_FOUND, nothing sent: the servers dropped the registration
  kDelay,        // held for the rule's delay, then sent
  kMiscount,     // Leave: sent, and every server's count of the rank's steps comes back one short
};

struct FaultRule {
  std::string call;  // "Register", "Pull", "Send", "SendAndPull", "Heartbeat", "Leave"
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
    return Run<absl::StatusOr<Registration>>("Register", [=] {
             return Completion<absl::StatusOr<Registration>>::Done(inner_->Register(segment, rank));
           }).Wait();
  }
  Completion<PulledAt> StartPull(int segment, uint64_t clock, absl::Span<float> dest) override {
    return Run<PulledAt>("Pull", [=] { return inner_->StartPull(segment, clock, dest); });
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
  void EncodeRows(EncodedPush* push, const std::vector<std::vector<uint64_t>>& ids,
                  const std::vector<std::vector<float>>& grads) override {
    inner_->EncodeRows(push, ids, grads);
  }
  Completion<absl::Status> StartSend(std::shared_ptr<const EncodedPush> push) override {
    return Run<absl::Status>("Send", [=] { return inner_->StartSend(push); });
  }
  Completion<PulledAt> StartSendAndPull(std::shared_ptr<const EncodedPush> push, absl::Span<float> dest) override {
    return Run<PulledAt>("SendAndPull", [=] { return inner_->StartSendAndPull(push, dest); });
  }
  absl::Status Heartbeat() override {
    return Run<absl::Status>("Heartbeat", [=] { return Completion<absl::Status>::Done(inner_->Heartbeat()); })
        .Wait();
  }
  absl::Status PullRows(int segment, uint64_t clock, const std::vector<std::vector<uint64_t>>& ids,
                        std::vector<std::vector<float>>* values) override {
    return inner_->PullRows(segment, clock, ids, values);
  }
  void Interrupt(const absl::Status& cause) override { inner_->Interrupt(cause); }
  absl::StatusOr<std::vector<uint64_t>> Leave(std::optional<uint64_t> end_at_clock) override {
    using Counts = absl::StatusOr<std::vector<uint64_t>>;
    return Run<Counts>("Leave", [=] { return Completion<Counts>::Done(inner_->Leave(end_at_clock)); }).Wait();
  }
  void SetEpochClocks(uint64_t epoch_clocks) override { inner_->SetEpochClocks(epoch_clocks); }
  void HoldSteps(std::optional<HeldSteps> held) override { inner_->HoldSteps(held); }
  absl::Status RollBackChain(int segment, uint64_t clock) override {
    return inner_->RollBackChain(segment, clock);
  }
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

  // Starts `call` through `send` (which starts it on the inner client),
  // with the fault a rule names for it. R: absl::Status or a StatusOr.
  template <typename R, typename F>
  Completion<R> Run(const std::string& call, F send) {
    const std::optional<FaultRule> fault = Next(call);
    const std::string what = absl::StrCat("injected fault in ", call);
    if (!fault.has_value()) return send();
    Completion<R> result;
    switch (fault->fault) {
      case Fault::kFailBefore:
        return Completion<R>::Done(absl::UnavailableError(what + ": not sent"));
      case Fault::kNotFound:
        return Completion<R>::Done(absl::NotFoundError(what + ": registration dropped"));
      case Fault::kLoseReply:
        send().OnDone([result, what](const R& sent) {
          result.Set(absl::UnavailableError(
              absl::StrCat(what, ": reply lost (the call ", StatusOf(sent).ok() ? "succeeded" : "failed", ")")));
        });
        return result;
      case Fault::kDuplicate:
        // The second goes once the first is answered; its reply is returned.
        send().OnDone([result, send](const R&) { send().OnDone([result](const R& second) { result.Set(second); }); });
        return result;
      case Fault::kDelay:
        absl::SleepFor(fault->delay);
        return send();
      case Fault::kMiscount:
        send().OnDone([result](const R& sent) { result.Set(OneShort(sent)); });
        return result;
    }
    return send();
  }

  template <typename R>
  static R OneShort(const R& r) {
    return r;
  }
  static absl::StatusOr<std::vector<uint64_t>> OneShort(absl::StatusOr<std::vector<uint64_t>> counts) {
    if (counts.ok()) {
      for (uint64_t& count : *counts) count -= 1;
    }
    return counts;
  }

  static absl::Status StatusOf(const absl::Status& s) { return s; }
  template <typename T>
  static absl::Status StatusOf(const absl::StatusOr<T>& s) {
    return s.status();
  }

  const std::unique_ptr<ParameterClient> inner_;
  const std::vector<FaultRule> rules_;
  Mutex mu_;
  std::map<std::string, int> counts_ ABSL_GUARDED_BY(mu_);
  int injected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace segps

#endif  // SEGPS_TESTS_SUPPORT_FAULTY_CLIENT_H_
