// ParameterServer's registrations (server/parameter_server.h): who may
// call for a segment's ranks (Register, its fingerprints and secret),
// renewing and ending a registration (Heartbeat, Leave), and rolling a
// segment back (Rollback).
#include <sys/random.h>

#include <algorithm>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/log.h"
#include "common/rank_states.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "server/parameter_server.h"
#include "server/state_seal.h"

namespace segps {

absl::Status ParameterServer::CheckFingerprints(const v1::RegisterRequest& request) const {
  if (request.model_fingerprint() != model_fingerprint_) {
    // Which parts differ, not the server's fingerprint: that says nothing
    // a caller needs, and it is not the caller's to read.
    std::vector<std::string> differ;
    for (const auto& [name, fingerprint] : ModelFingerprintParts(config_)) {
      auto theirs = request.fingerprint_parts().find(name);
      if (theirs == request.fingerprint_parts().end() || theirs->second != fingerprint) differ.push_back(name);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "Register: model fingerprint ", request.model_fingerprint(),
        " does not match this server's: worker and server were started with different configs (",
        request.fingerprint_parts().empty() ? "model, optimizer, seed or balance"
                                            : absl::StrCat(absl::StrJoin(differ, " and "),
                                                           differ.size() == 1 ? " differs" : " differ"),
        ")"));
  }
  if (request.shard_fingerprint() != map_.fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Register: shard-map fingerprint ", request.shard_fingerprint(),
        " does not match this server's: the worker assumes a different number of servers (this cluster has ",
        map_.num_servers(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ParameterServer::RankFor(const v1::RegisterRequest& request, SegmentShard* shard) {
  const uint32_t workers = WorkersOf(config_, request.segment());
  if (request.any_rank()) {
    // Two replicas asking at once could both see the same free rank; the
    // second is then refused (the first holds it) and asks again.
    std::optional<uint32_t> free = shard->FreeRank(workers);
    if (!free.has_value()) {
      return absl::ResourceExhaustedError(absl::StrCat("Register: all ", workers, " ranks of segment ",
                                                       request.segment(),
                                                       " are held by live workers; raise the segment's workers in "
                                                       "the config"));
    }
    return *free;
  }
  if (request.rank() >= workers) {
    return absl::InvalidArgumentError(absl::StrCat("Register: rank ", request.rank(),
                                                   " is out of range: segment ", request.segment(), " has ",
                                                   workers, " workers"));
  }
  return request.rank();
}

absl::Status ParameterServer::Register(const v1::RegisterRequest& request, v1::RegisterResponse* response,
                                       const std::string& caller) {
  absl::StatusOr<SegmentShard*> shard = ShardFor(request.segment(), "Register");
  if (!shard.ok()) return Reject(request.segment(), shard.status());
  if (absl::Status agree = CheckFingerprints(request); !agree.ok()) return Reject(request.segment(), agree);
  if (taking_back_.load()) {
    return absl::UnavailableError(absl::StrCat("Register: server ", index_,
                                               " is taking its ranges back from their backups; try again"));
  }
  if (absl::Status epochs = TakeEpochClocks(request, *shard); !epochs.ok()) return Reject(request.segment(), epochs);
  absl::StatusOr<uint32_t> chosen = RankFor(request, *shard);
  if (!chosen.ok()) return Reject(request.segment(), chosen.status());
  const uint32_t rank = *chosen;
  std::string secret(16, '\0');
  if (getrandom(secret.data(), secret.size(), 0) != static_cast<ssize_t>(secret.size())) {
    return absl::UnavailableError("Register: the system's random source failed; try again");
  }
  std::optional<uint64_t> join;
  if (request.has_join_clock()) {
    join = request.join_clock();
    if (const uint64_t furthest = (*shard)->FurthestJoin(); *join > furthest) {
      return Reject(request.segment(), absl::InvalidArgumentError(absl::StrCat(
          "Register: join_clock ", *join, " is beyond every rank of segment ", request.segment(),
          " on this server (at most ", furthest, "): joining there would skip steps no worker computed (a server "
          "restarted without a checkpoint starts its segments over)")));
    }
  }
  std::optional<uint64_t> replaces;
  if (request.replaces_worker_id() != 0 &&
      CheckRegistration(request.replaces_worker_id(), request.replaces_secret(), caller, "Register",
                        request.segment())
          .ok()) {
    replaces = request.replaces_worker_id();
  }
  const uint64_t id = next_worker_id_.fetch_add(1);
  std::vector<uint64_t> replaced;
  const absl::StatusOr<Registered> held = (*shard)->Register(id, rank, join, &replaced, replaces);
  if (!held.ok()) return held.status();
  const Registered& registered = *held;
  ForgetRegistrations(replaced);
  const Range range = map_.range(request.segment(), index_);
  response->set_worker_id(id);
  response->set_start_clock(registered.start_clock);
  response->set_incarnation(incarnation_);
  response->set_generation(registered.generation);
  response->set_partial(registered.partial);
  if (registered.rank_clock.has_value()) response->set_rank_clock(*registered.rank_clock);
  *response->mutable_sealed() = Seal(request.segment(), rank, registered);
  if (std::optional<v1::SharePlan> plan = (*shard)->PlanFrom(registered.start_clock)) {
    *response->mutable_plan() = *std::move(plan);
  }
  if (store_ != nullptr) {
    for (uint64_t clock : store_->Clocks(request.segment())) response->add_checkpoint_clocks(clock);
  }
  DescribeLane(rank, response);
  response->set_taken_back(taken_back_.load());
  response->set_server_index(index_);
  response->set_offset(range.offset);
  response->set_count(range.count);
  response->set_lease_ms(config_.cluster().lease_ms());
  response->set_rank(rank);
  response->set_registration_secret(secret);
  if (!region_socket_.empty() && !request.host().empty() && request.host() == host_) {
    response->set_region_socket(region_socket_);
  }
  MutexLock lock(&secrets_mu_);
  secrets_[id] = {std::move(secret), request.segment(), caller, nullptr};
  return absl::OkStatus();
}

v1::SealedRankState ParameterServer::Seal(uint32_t segment, uint32_t rank, const Registered& registered) const {
  v1::SealedRankState state;
  state.set_server_index(index_);
  state.set_incarnation(incarnation_);
  state.set_generation(registered.generation);
  state.set_segment(segment);
  state.set_rank(rank);
  if (registered.rank_clock.has_value()) state.set_rank_clock(*registered.rank_clock);
  state.set_partial(registered.partial);
  state.set_sealed_at_ms(absl::ToUnixMillis(clock_->Now()));
  if (!state_key_.empty()) SealState(state_key_, &state);
  return state;
}

absl::Status ParameterServer::CheckDisagreement(const v1::RollbackRequest& request) const {
  const RankStates& states = request.states();
  if (states.size() != static_cast<int>(map_.num_servers())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Rollback: states must hold the sealed state of each of the ", map_.num_servers(),
        " servers (RegisterResponse.sealed, in server order), got ", states.size()));
  }
  if (authenticated_ && state_key_.empty()) {
    return absl::FailedPreconditionError(
        "Rollback: this server has no `server` line in its token file, so it cannot check the servers' "
        "states; give every server the same `server SECRET` line (deploy/make-certs.sh writes one)");
  }
  const absl::Duration lease = absl::Milliseconds(config_.cluster().lease_ms());
  const absl::Time now = clock_->Now();
  for (int i = 0; i < states.size(); ++i) {
    const v1::SealedRankState& state = states[i];
    if (state.server_index() != static_cast<uint32_t>(i) || state.segment() != request.segment() ||
        state.rank() != states[0].rank()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Rollback: states[", i, "] is server ", state.server_index(), "'s of segment ", state.segment(), " rank ",
          state.rank(), "; expected server ", i, "'s of segment ", request.segment(), " rank ", states[0].rank()));
    }
    if (!state_key_.empty() && !SealHolds(state_key_, state)) {
      return absl::PermissionDeniedError(
          absl::StrCat("Rollback: states[", i, "] is not sealed by a server of this job"));
    }
    if (absl::AbsDuration(now - absl::FromUnixMillis(state.sealed_at_ms())) > lease) {
      return absl::AbortedError(absl::StrCat(
          "Rollback: server ", i, "'s state was sealed more than a lease (", absl::FormatDuration(lease),
          ") from now; register again for current states"));
    }
  }
  const v1::SealedRankState& mine = states[static_cast<int>(index_)];
  if (mine.incarnation() != incarnation_ || mine.generation() != request.generation()) {
    return absl::AbortedError(absl::StrCat(
        "Rollback: the state of server ", index_, " given is not its current one (it restarted or rolled back "
        "since); register again"));
  }
  if (!StatesDisagree(states)) {
    return absl::FailedPreconditionError(absl::StrCat("Rollback: the servers agree on segment ", request.segment(),
                                                      " rank ", states[0].rank(), " (", DescribeStates(states),
                                                      "): there is nothing to roll back"));
  }
  return absl::OkStatus();
}

void ParameterServer::ForgetRegistrations(const std::vector<uint64_t>& ids) {
  MutexLock lock(&secrets_mu_);
  for (uint64_t id : ids) secrets_.erase(id);
}

absl::Status ParameterServer::CheckRegistration(uint64_t id, const std::string& secret, const std::string& caller,
                                                const char* call, std::optional<uint32_t> segment,
                                                std::shared_ptr<SharedRegion>* region) {
  Secret expected;
  {
    MutexLock lock(&secrets_mu_);
    auto it = secrets_.find(id);
    if (it != secrets_.end()) expected = it->second;
  }
  // Compared in constant time: the secret is what names the registration.
  if (!expected.bytes.empty() && ConstantTimeEqual(expected.bytes, secret) && caller == expected.caller &&
      (!segment.has_value() || *segment == expected.segment)) {
    if (region != nullptr) *region = std::move(expected.region);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat(call, ": no registration of worker ", id,
                                          " with the secret given; call Register first"));
}

bool ParameterServer::StreamOpened(uint32_t segment, uint64_t id, const std::string& secret,
                                   const std::string& caller) {
  if (segment >= shards_.size() || !CheckRegistration(id, secret, caller, "stream", segment).ok()) return false;
  shards_[segment]->Streamed(id, true);
  return true;
}

void ParameterServer::StreamClosed(uint32_t segment, uint64_t id) { shards_[segment]->Streamed(id, false); }

absl::Status ParameterServer::Heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response,
                                        const std::string& caller) {
  SEGPS_RETURN_IF_ERROR(CheckRegistration(request.worker_id(), request.registration_secret(), caller, "Heartbeat"));
  response->set_incarnation(incarnation_);
  for (auto& shard : shards_) {
    if (shard->Renew(request.worker_id())) {
      response->set_live(true);
      return absl::OkStatus();
    }
  }
  response->set_live(false);
  return absl::OkStatus();
}

absl::Status ParameterServer::TakeEpochClocks(const v1::RegisterRequest& request, SegmentShard* shard) {
  if (request.epoch_clocks() == 0) return absl::OkStatus();
  if (!config_.training().has_early_stopping()) {
    return absl::InvalidArgumentError("Register: epoch_clocks is for training.early_stopping, which this job's "
                                      "config does not set");
  }
  if (store_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Register: training.early_stopping ends a segment at a checkpoint, but server ", index_,
        " keeps none: start it with --checkpoint_dir (or set checkpoint.dir)"));
  }
  return shard->SetEpochClocks(request.epoch_clocks());
}

absl::Status ParameterServer::EndSegment(const v1::LeaveRequest& request, v1::LeaveResponse* response) {
  uint32_t segment = 0;
  {
    MutexLock lock(&secrets_mu_);
    auto it = secrets_.find(request.worker_id());
    if (it == secrets_.end()) return absl::NotFoundError("Leave: the registration ended meanwhile");
    segment = it->second.segment;
  }
  SegmentShard* shard = shards_[segment].get();
  const uint64_t clock = request.end_at_clock();
  const std::string name = config_.model().segments(segment).name();
  if (std::optional<uint64_t> ended = shard->EndedAt()) {  // asked again: every server is asked until all say yes
    if (*ended == clock) return absl::OkStatus();
    return absl::OutOfRangeError(absl::StrCat("Leave: segment ", name, " already ended at clock ", *ended));
  }
  if (store_ == nullptr || shard->EpochClocks() == 0 || clock % shard->EpochClocks() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Leave: end_at_clock ", clock, " is no epoch end of segment ", name, " (epochs of ", shard->EpochClocks(),
        " clocks", store_ == nullptr ? ", and this server keeps no checkpoints)" : ")"));
  }
  FlushCheckpoints();  // the cuts taken so far are on disk
  const std::vector<uint64_t> clocks = store_->Clocks(segment);
  if (std::find(clocks.begin(), clocks.end(), clock) == clocks.end()) {
    if (!clocks.empty() && clock < clocks.back()) {  // cut, and deleted: peers ran further ahead than kept
      return absl::FailedPreconditionError(absl::StrCat("Leave: server ", index_, " no longer holds segment ", name,
                                                        "'s checkpoint of clock ", clock, " (it holds ",
                                                        absl::StrJoin(clocks, ","), ")"));
    }
    return absl::UnavailableError(absl::StrCat("Leave: server ", index_, " has not cut segment ", name,
                                               " at clock ", clock, " yet (it holds ", absl::StrJoin(clocks, ","),
                                               "); a worker behind it has still to get there"));
  }
  absl::StatusOr<ShardState> state = store_->Read(segment, clock);
  if (!state.ok()) return absl::DataLossError(absl::StrCat("Leave: ", state.status().message()));
  std::vector<uint64_t> dropped;
  shard->EndAt(*state, absl::StrCat("segment ", name, " stopped early: its rank 0 ended it at its checkpoint of ",
                                    "clock ", clock, ", the best epoch's end (training.early_stopping)"),
               &dropped);
  dropped.erase(std::remove(dropped.begin(), dropped.end(), request.worker_id()), dropped.end());
  ForgetRegistrations(dropped);  // the caller's stays, to ask again
  FlushCheckpoints();  // the final cut, and any taken before the end
  SEGPS_RETURN_IF_ERROR(store_->DropAfter(segment, clock));
  SEGPS_LOG_WARNING << "server " << index_ << ": segment " << name << " stopped early at its checkpoint of clock "
                    << clock << " (training.early_stopping)";
  response->set_next_clock(clock);
  return absl::OkStatus();
}

absl::Status ParameterServer::Leave(const v1::LeaveRequest& request, const std::string& caller,
                                    v1::LeaveResponse* response) {
  SEGPS_RETURN_IF_ERROR(CheckRegistration(request.worker_id(), request.registration_secret(), caller, "Leave"));
  if (request.has_end_at_clock()) return EndSegment(request, response);
  {
    MutexLock lock(&secrets_mu_);
    secrets_.erase(request.worker_id());
  }
  for (auto& shard : shards_) {
    if (std::optional<uint64_t> applied = shard->Leave(request.worker_id())) {
      if (response != nullptr) response->set_next_clock(*applied);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("Leave: worker ", request.worker_id(), " is not registered"));
}

absl::Status ParameterServer::Rollback(const v1::RollbackRequest& request, v1::RollbackResponse* response,
                                       const std::string& caller) {
  absl::StatusOr<SegmentShard*> shard = ShardFor(request.segment(), "Rollback");
  if (!shard.ok()) return Reject(request.segment(), shard.status());
  SEGPS_RETURN_IF_ERROR(
      CheckRegistration(request.worker_id(), request.registration_secret(), caller, "Rollback", request.segment()));
  response->set_incarnation(incarnation_);
  if (request.chain()) {
    absl::Status rolled = RollbackChain(request, response);
    response->set_generation((*shard)->generation());
    return rolled.ok() ? rolled : Reject(request.segment(), rolled);
  }
  if ((*shard)->generation() != request.generation()) {
    response->set_generation((*shard)->generation());  // someone rolled it back already
    return absl::OkStatus();
  }
  if (absl::Status shown = CheckDisagreement(request); !shown.ok()) {
    return Reject(request.segment(), shown);
  }
  const int segment = static_cast<int>(request.segment());
  // Restarted from that checkpoint and untouched since: already there, and
  // its registrations (of workers that agreed on it) stay.
  if ((*shard)->AtRest(request.clock())) {
    response->set_generation((*shard)->generation());
    return absl::OkStatus();
  }
  const std::vector<uint64_t> clocks = store_ == nullptr ? std::vector<uint64_t>() : store_->Clocks(segment);
  if (std::find(clocks.begin(), clocks.end(), request.clock()) == clocks.end()) {
    return Reject(request.segment(), absl::FailedPreconditionError(absl::StrCat(
        "Rollback: server ", index_, " has no checkpoint of segment ", segment, " at clock ", request.clock(),
        store_ == nullptr ? " (it keeps none: start it with --checkpoint_dir)"
                          : absl::StrCat(" (it has clocks ", absl::StrJoin(clocks, ","), ")"))));
  }
  {
    MutexLock lock(&rollback_mu_);
    const absl::Duration since = clock_->Now() - rolled_back_at_[segment];
    if (since < kRollbackInterval) {
      return Reject(request.segment(), absl::UnavailableError(absl::StrCat(
          "Rollback: segment ", segment, " was rolled back ", absl::FormatDuration(since), " ago; at most one "
          "rollback a segment every ", absl::FormatDuration(kRollbackInterval), ", try again")));
    }
  }
  absl::StatusOr<ShardState> state = store_->Read(segment, request.clock());
  if (!state.ok()) {
    store_->Forget(segment, request.clock());
    return absl::FailedPreconditionError(absl::StrCat("Rollback: ", state.status().message()));
  }
  std::vector<uint64_t> dropped;
  const bool rolled_back = (*shard)->Restore(*state, request.generation(), &dropped);
  ForgetRegistrations(dropped);
  if (rolled_back) {
    MutexLock lock(&rollback_mu_);
    rolled_back_at_[segment] = clock_->Now();
  }
  response->set_rolled_back(rolled_back);
  response->set_generation((*shard)->generation());
  if (rolled_back) {
    SEGPS_LOG_WARNING << "server " << index_ << ": " << config_.model().segments(segment).name()
                      << " rolled back to its checkpoint at clock " << request.clock() << " for worker "
                      << request.worker_id() << "; " << dropped.size() << " registrations dropped";
  }
  return absl::OkStatus();
}

void ParameterServer::DescribeLane(uint32_t rank, v1::RegisterResponse* response) {
  if (config_.model().combine() != v1::CHAIN) return;
  for (uint64_t clock : ChainCheckpointClocks()) response->add_chain_checkpoint_clocks(clock);
  for (auto& stage : shards_) {
    const auto [next, partial] = stage->RankPosition(rank);
    response->add_lane_clocks(next);
    response->set_lane_partial(response->lane_partial() || partial);
  }
}

std::vector<uint64_t> ParameterServer::ChainCheckpointClocks() const {
  if (store_ == nullptr || config_.model().combine() != v1::CHAIN) return {};
  std::vector<uint64_t> common = store_->Clocks(0);
  for (int k = 1; k < config_.model().segments_size(); ++k) {
    const std::vector<uint64_t> clocks = store_->Clocks(k);
    std::vector<uint64_t> both;
    std::set_intersection(common.begin(), common.end(), clocks.begin(), clocks.end(), std::back_inserter(both));
    common = std::move(both);
  }
  return common;
}

absl::Status ParameterServer::RollbackChain(const v1::RollbackRequest& request, v1::RollbackResponse* response) {
  if (config_.model().combine() != v1::CHAIN) {
    return absl::InvalidArgumentError("Rollback: chain is for a model of combine: CHAIN");
  }
  const int stages = config_.model().segments_size();
  const uint64_t clock = request.clock();
  MutexLock lock(&rollback_mu_);
  const std::vector<uint64_t> clocks = ChainCheckpointClocks();
  if (std::find(clocks.begin(), clocks.end(), clock) == clocks.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Rollback: server ", index_, " has no checkpoint of every stage of the chain at clock ", clock,
        store_ == nullptr ? " (it keeps none: start it with --checkpoint_dir)"
                          : absl::StrCat(" (every stage has clocks ", absl::StrJoin(clocks, ","), ")")));
  }
  // Stages already at that checkpoint, untouched (restarted from it, or
  // rolled back there by one of their workers), stay as they are.
  std::vector<int> behind;
  for (int k = 0; k < stages; ++k) {
    if (shards_[k]->AtRest(clock)) continue;
    const absl::Duration since = clock_->Now() - rolled_back_at_[k];
    if (since < kRollbackInterval) {
      return absl::UnavailableError(absl::StrCat("Rollback: stage ", k, " was rolled back ",
                                                 absl::FormatDuration(since), " ago; at most one rollback every ",
                                                 absl::FormatDuration(kRollbackInterval), ", try again"));
    }
    behind.push_back(k);
  }
  // Every stage's checkpoint read before any is restored: all or none.
  std::vector<ShardState> states;
  for (int k : behind) {
    absl::StatusOr<ShardState> state = store_->Read(k, clock);
    if (!state.ok()) {
      store_->Forget(k, clock);
      return absl::FailedPreconditionError(absl::StrCat("Rollback: ", state.status().message()));
    }
    states.push_back(*std::move(state));
  }
  std::vector<uint64_t> dropped;
  for (size_t j = 0; j < behind.size(); ++j) {
    shards_[behind[j]]->Restore(states[j], std::nullopt, &dropped);
    rolled_back_at_[behind[j]] = clock_->Now();
  }
  ForgetRegistrations(dropped);
  response->set_rolled_back(!behind.empty());
  if (!behind.empty()) {
    SEGPS_LOG_WARNING << "server " << index_ << ": the chain rolled back to its checkpoints at clock " << clock
                      << " (" << behind.size() << " of its " << stages << " stages were past it) for worker "
                      << request.worker_id() << " of stage " << request.segment() << "; " << dropped.size()
                      << " registrations dropped";
  }
  return absl::OkStatus();
}

}  // namespace segps
