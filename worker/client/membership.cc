#include "worker/client/membership.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/rank_states.h"
#include "common/status_macros.h"

namespace segps {

Membership::Membership(std::vector<MembershipStub*> servers, std::string model_fingerprint,
                       std::string shard_fingerprint, std::map<std::string, std::string> fingerprint_parts)
    : servers_(std::move(servers)),
      model_fingerprint_(std::move(model_fingerprint)),
      shard_fingerprint_(std::move(shard_fingerprint)),
      fingerprint_parts_(std::move(fingerprint_parts)),
      worker_ids_(servers_.size(), 0),
      secrets_(servers_.size()),
      incarnations_(servers_.size(), 0) {}

absl::Status Membership::Annotate(const absl::Status& status, size_t i, const char* call) const {
  return absl::Status(status.code(), absl::StrCat(call, " to ", servers_[i]->Name(), ": ", status.message()));
}

absl::StatusOr<Registration> Membership::Register(int segment, std::optional<uint32_t> rank, v1::SharePlan* plan) {
  v1::RegisterRequest request;
  request.set_segment(segment);
  request.set_rank(rank.value_or(0));
  request.set_any_rank(!rank.has_value());
  request.set_model_fingerprint(model_fingerprint_);
  request.mutable_fingerprint_parts()->insert(fingerprint_parts_.begin(), fingerprint_parts_.end());
  request.set_shard_fingerprint(shard_fingerprint_);
  request.set_epoch_clocks(epoch_clocks_);
  // Each rollback moves a generation on; a few in a row mean servers that
  // keep failing, which the caller's recovery retries.
  for (int attempt = 0; attempt < 4; ++attempt) {
    request.clear_join_clock();
    std::vector<v1::RegisterResponse> responses(servers_.size());
    for (size_t i = 0; i < servers_.size(); ++i) {
      SEGPS_RETURN_IF_ERROR(RegisterWith(i, request, &responses[i]));
      // Server 0 picks the rank if asked; the others are told the same.
      request.set_rank(responses[0].rank());
      request.set_any_rank(false);
    }
    absl::StatusOr<std::optional<uint64_t>> aligned = Agree(segment, responses);
    if (!aligned.ok()) return aligned.status();
    if (!aligned->has_value()) continue;  // rolled back: register again
    const uint64_t start = **aligned;
    request.set_join_clock(start);
    bool changed = false;
    for (size_t i = 0; i < servers_.size() && !changed; ++i) {
      // A server that knew the rank keeps it at its own clock until told.
      const uint64_t held = responses[i].has_rank_clock() ? responses[i].rank_clock() : responses[i].start_clock();
      if (held != start) {
        const uint64_t incarnation = responses[i].incarnation(), generation = responses[i].generation();
        SEGPS_RETURN_IF_ERROR(RegisterWith(i, request, &responses[i]));
        // Restarted, or rolled back by another worker, since it answered:
        // what was agreed may not hold there; agree again.
        changed = responses[i].incarnation() != incarnation || responses[i].generation() != generation;
        if (changed) break;
      }
      incarnations_[i] = responses[i].incarnation();
    }
    if (changed) continue;
    if (plan != nullptr) *plan = responses[0].plan();
    Registration registration;
    registration.start_clock = start;
    registration.rank = responses[0].rank();
    for (const v1::RegisterResponse& r : responses) registration.known = registration.known || r.has_rank_clock();
    registration.chain_checkpoint_clocks =
        CommonClocks(responses, &v1::RegisterResponse::chain_checkpoint_clocks);
    registration.lane_clock = LaneClock(responses);
    for (const v1::RegisterResponse& r : responses) registration.generations.push_back(r.generation());
    return registration;
  }
  return absl::UnavailableError(absl::StrCat("Register: segment ", segment,
                                             " was rolled back or a server restarted 4 times in a row while "
                                             "registering; the servers keep failing"));
}

std::vector<uint64_t> Membership::CommonClocks(
    const std::vector<v1::RegisterResponse>& responses,
    const google::protobuf::RepeatedField<uint64_t>& (v1::RegisterResponse::*clocks)() const) {
  if (responses.empty()) return {};
  std::vector<uint64_t> common((responses[0].*clocks)().begin(), (responses[0].*clocks)().end());
  for (const v1::RegisterResponse& r : responses) {
    std::vector<uint64_t> both;
    std::set_intersection(common.begin(), common.end(), (r.*clocks)().begin(), (r.*clocks)().end(),
                          std::back_inserter(both));
    common = std::move(both);
  }
  return common;
}

std::optional<uint64_t> Membership::LaneClock(const std::vector<v1::RegisterResponse>& responses) {
  if (responses.empty() || responses[0].lane_clocks().empty()) return std::nullopt;
  const uint64_t clock = responses[0].lane_clocks(0);
  for (const v1::RegisterResponse& r : responses) {
    if (r.lane_partial()) return std::nullopt;
    for (uint64_t c : r.lane_clocks()) {
      if (c != clock) return std::nullopt;
    }
  }
  return clock;
}

absl::Status Membership::RegisterWith(size_t i, v1::RegisterRequest request, v1::RegisterResponse* response) {
  // This worker's own registration there, if it has one: a rank a live
  // worker holds is taken over only by that worker.
  request.set_replaces_worker_id(worker_ids_[i]);
  request.set_replaces_secret(secrets_[i]);
  absl::Status status = servers_[i]->Register(request, response);
  if (!status.ok()) return Annotate(status, i, "Register");
  if (response->server_index() != i) {
    return Annotate(absl::FailedPreconditionError(absl::StrCat("this is server ", response->server_index(),
                                                               ", listed at position ", i,
                                                               "; give the servers in index order")),
                    i, "Register");
  }
  worker_ids_[i] = response->worker_id();
  secrets_[i] = response->registration_secret();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<uint64_t>> Membership::Agree(int segment,
                                                          const std::vector<v1::RegisterResponse>& responses) {
  for (size_t i = 0; i < responses.size(); ++i) {
    // Restarted: fine where it restored a checkpoint or took its range back from a backup.
    if (incarnations_[i] != 0 && incarnations_[i] != responses[i].incarnation() &&
        responses[i].checkpoint_clocks().empty() && !responses[i].taken_back()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Register: ", servers_[i]->Name(), " restarted with no checkpoint of segment ", segment,
          ", so its parameters started over; the job cannot recover. Give the servers a checkpoint "
          "directory (--checkpoint_dir or checkpoint.dir)"));
    }
  }
  RankStates states;
  std::set<uint64_t> rank_clocks;
  uint64_t furthest = 0;
  for (const v1::RegisterResponse& r : responses) {
    *states.Add() = r.sealed();
    if (r.has_rank_clock()) rank_clocks.insert(r.rank_clock());
    furthest = std::max(furthest, r.start_clock());
  }
  if (!StatesDisagree(states)) return std::optional<uint64_t>(furthest);
  // They differ only on which of the pushes this worker holds reached them.
  bool held = held_steps_.has_value();
  for (const v1::RegisterResponse& r : responses) {
    held = held && r.has_rank_clock() && r.rank_clock() >= held_steps_->first &&
           r.rank_clock() <= held_steps_->last + 1;
  }
  if (held && !rank_clocks.empty()) {
    const uint64_t lowest = *rank_clocks.begin();
    SEGPS_LOG_WARNING << "segment " << segment << " rank " << responses[0].rank() << ": the servers disagree on its clock ("
                      << DescribeStates(states) << "), only on which of its steps " << held_steps_->first << " to "
                      << held_steps_->last << " reached them; sending steps " << lowest << " to "
                      << held_steps_->last << " again";
    return std::optional<uint64_t>(lowest);
  }
  // The newest checkpoint clock every server holds.
  const std::vector<uint64_t> common = CommonClocks(responses, &v1::RegisterResponse::checkpoint_clocks);
  const std::string who = absl::StrCat("segment ", segment, " rank ", responses[0].rank());
  if (common.empty()) {
    // No checkpoint to agree on: continue from the lowest clock; servers
    // further on acknowledge the repeated pushes without applying them.
    const uint64_t lowest = rank_clocks.empty() ? furthest : *rank_clocks.begin();
    SEGPS_LOG_WARNING << who << ": the servers disagree on its clock (" << DescribeStates(states)
                      << ") and share no checkpoint; continuing from clock " << lowest;
    return std::optional<uint64_t>(lowest);
  }
  const uint64_t target = common.back();
  SEGPS_LOG_WARNING << who << ": the servers disagree (" << DescribeStates(states)
                    << "); rolling the segment back to its checkpoint at clock " << target;
  SEGPS_RETURN_IF_ERROR(RollBack(segment, target, responses, states));
  return std::optional<uint64_t>();
}

absl::Status Membership::RollBack(int segment, uint64_t target, const std::vector<v1::RegisterResponse>& responses,
                                  const RankStates& states) {
  for (size_t i = 0; i < servers_.size(); ++i) {
    v1::RollbackRequest rollback;
    rollback.set_segment(segment);
    *rollback.mutable_states() = states;  // the proof that they disagree
    rollback.set_worker_id(responses[i].worker_id());
    rollback.set_registration_secret(responses[i].registration_secret());
    rollback.set_clock(target);
    rollback.set_generation(responses[i].generation());
    v1::RollbackResponse reply;
    absl::Status status = servers_[i]->Rollback(rollback, &reply);
    // States gone stale since they were sealed (a slow server, one paused):
    // register again for current ones.
    if (absl::IsAborted(status)) {
      SEGPS_LOG_INFO << "Rollback to " << servers_[i]->Name() << ": " << status.message();
      return absl::OkStatus();
    }
    // A registration already dropped by someone else's rollback is fine: register again.
    if (!status.ok() && !absl::IsNotFound(status)) return Annotate(status, i, "Rollback");
    // Another worker rolled the segment back first (servers are taken in
    // one order, so server 0 decides who): its rollback stands, and rolling
    // the next servers back again would only drop its registrations there.
    if (!status.ok() || (!reply.rolled_back() && reply.generation() != responses[i].generation())) {
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Membership::RollBackChain(int segment, uint64_t clock) {
  for (size_t i = 0; i < servers_.size(); ++i) {
    v1::RollbackRequest rollback;
    rollback.set_segment(segment);
    rollback.set_chain(true);
    rollback.set_worker_id(worker_ids_[i]);
    rollback.set_registration_secret(secrets_[i]);
    rollback.set_clock(clock);
    v1::RollbackResponse reply;
    const absl::Status status = servers_[i]->Rollback(rollback, &reply);
    // A registration another stage's rollback dropped: the chain went back already.
    if (!status.ok() && !absl::IsNotFound(status)) return Annotate(status, i, "Rollback");
  }
  return absl::OkStatus();
}

bool Recoverable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<Registration> Rejoin(absl::FunctionRef<absl::StatusOr<Registration>()> attempt,
                                    absl::Duration timeout, Clock* clock, const std::string& tag) {
  const absl::Time since = clock->Now();
  absl::Duration delay = absl::Milliseconds(50);
  absl::StatusOr<Registration> again = attempt();
  while (!again.ok()) {
    if (!IsTransient(again.status()) || clock->Now() + delay - since > timeout) {
      return absl::Status(again.status().code(),
                          absl::StrCat(tag, ": could not rejoin the servers within ", absl::FormatDuration(timeout),
                                       " (cluster.recovery_timeout_ms): ", again.status().message()));
    }
    if (delay == absl::Milliseconds(50)) {
      SEGPS_LOG_INFO << tag << ": " << again.status().message() << "; trying again for up to "
                     << absl::FormatDuration(timeout);
    }
    clock->SleepFor(delay);
    delay = std::min(delay * 2, absl::Seconds(1));
    again = attempt();
  }
  return again;
}

}  // namespace segps
