// A worker's membership in the cluster apart from any transport: its
// registration with every server and the agreement on where it continues
// (a rollback where the servers disagree), which failures it survives by
// registering again, and rejoining with backoff within the recovery budget.
// A transport is a MembershipStub per server (gRPC: client/grpc_client.cc;
// in process: tests/support); time comes from an injected Clock, so that
// recovery is tested without waiting.
#ifndef SEGPS_WORKER_CLIENT_MEMBERSHIP_H_
#define SEGPS_WORKER_CLIENT_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rank_states.h"
#include "segps/v1/parameter_server.pb.h"
#include "worker/client/ps_client.h"

namespace segps {

// One server, as registration sees it. An implementation retries its own
// transient failures within its deadlines and returns the last one.
class MembershipStub {
 public:
  virtual ~MembershipStub() = default;
  virtual absl::Status Register(const v1::RegisterRequest& request, v1::RegisterResponse* response) = 0;
  virtual absl::Status Rollback(const v1::RollbackRequest& request, v1::RollbackResponse* response) = 0;
  // How errors name the server: "server 1 (10.0.0.2:7000)".
  virtual std::string Name() const = 0;
};

// A worker's registrations, one per server, and how they are agreed.
//
// Where the rank's own clocks differ only on the steps whose pushes the
// worker holds (HoldSteps: every server knows the rank, at one of those
// steps or the one after the last), the worker continues at the lowest of
// the servers' clocks and sends its pushes from there again: the servers
// that took one acknowledge it, the others apply it. Where they differ otherwise
// (a push that reached some of them, a server restored from a checkpoint),
// the segment is rolled
// back to the newest checkpoint every server holds and registration starts
// over; with no checkpoint in common the rank continues from the lowest
// clock (servers further on acknowledge the repeated pushes without
// applying them), unless a server restarted without its checkpoints, which
// is refused. Otherwise the worker starts at the furthest clock any server
// proposes, and every server is told it.
//
// Thread safety: Register must not overlap other calls; worker_id and
// secret are constant between registrations.
class Membership {
 public:
  // `servers` (in index order) outlive this. `fingerprint_parts`: the
  // model fingerprint's parts (ModelFingerprintParts), for a server to say
  // which differ.
  Membership(std::vector<MembershipStub*> servers, std::string model_fingerprint, std::string shard_fingerprint,
             std::map<std::string, std::string> fingerprint_parts = {});

  // Registers as `rank` of `segment` with every server (without a rank,
  // server 0 assigns the lowest free one). `plan`, if not null, gets server
  // 0's share plan of a balanced segment.
  absl::StatusOr<Registration> Register(int segment, std::optional<uint32_t> rank, v1::SharePlan* plan = nullptr);
  // A chain's rollback to `clock` through this worker's registrations
  // (ParameterClient::RollBackChain).
  absl::Status RollBackChain(int segment, uint64_t clock);
  // Early stopping: RegisterRequest.epoch_clocks from now on.
  void set_epoch_clocks(uint64_t epoch_clocks) { epoch_clocks_ = epoch_clocks; }
  // ParameterClient::HoldSteps.
  void set_held_steps(std::optional<HeldSteps> held) { held_steps_ = held; }

  // This worker's registration with server `i` (0 and empty until registered).
  uint64_t worker_id(size_t i) const { return worker_ids_[i]; }
  const std::string& secret(size_t i) const { return secrets_[i]; }

 private:
  absl::Status RegisterWith(size_t i, v1::RegisterRequest request, v1::RegisterResponse* response);
  // The clock every server should start the rank at, or nullopt after
  // rolling the segment back (register again).
  absl::StatusOr<std::optional<uint64_t>> Agree(int segment, const std::vector<v1::RegisterResponse>& responses);
  // `states` (the servers' sealed states) show each server that they disagree.
  absl::Status RollBack(int segment, uint64_t target, const std::vector<v1::RegisterResponse>& responses,
                        const RankStates& states);
  absl::Status Annotate(const absl::Status& status, size_t i, const char* call) const;
  // The clocks every response lists in `clocks` (each ascending), ascending.
  static std::vector<uint64_t> CommonClocks(
      const std::vector<v1::RegisterResponse>& responses,
      const google::protobuf::RepeatedField<uint64_t>& (v1::RegisterResponse::*clocks)() const);
  // Registration::lane_clock of these responses.
  static std::optional<uint64_t> LaneClock(const std::vector<v1::RegisterResponse>& responses);

  const std::vector<MembershipStub*> servers_;
  const std::string model_fingerprint_, shard_fingerprint_;
  const std::map<std::string, std::string> fingerprint_parts_;
  std::vector<uint64_t> worker_ids_;    // per server; 0 until registered
  std::vector<std::string> secrets_;    // per server: each registration's secret
  std::vector<uint64_t> incarnations_;  // per server: as of the last registration (0: none yet)
  uint64_t epoch_clocks_ = 0;
  std::optional<HeldSteps> held_steps_;
};

// Failures a worker recovers from by registering again: a server that
// restarted, was paused past the lease, is unreachable or dropped this
// registration (a rollback). Anything else (a config mismatch, a bad
// request, a broken device) ends the worker.
bool Recoverable(const absl::Status& status);

// Registers again after a failure through `attempt` (a worker's Register
// with its rank). Servers still unreachable or recovering (a transient
// refusal) are retried with backoff (50 ms, doubling up to 1 s) until
// `timeout` has passed on `clock`; any other refusal (another model, a
// server restarted without its checkpoints) is final. `tag` names the
// worker in the error.
absl::StatusOr<Registration> Rejoin(absl::FunctionRef<absl::StatusOr<Registration>()> attempt,
                                    absl::Duration timeout, Clock* clock, const std::string& tag);

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_MEMBERSHIP_H_
