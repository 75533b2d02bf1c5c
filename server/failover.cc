#include "server/failover.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "segps/v1/replication.grpc.pb.h"
#include "server/replica_links.h"

namespace segps {

struct Failover::Watched {
  uint32_t primary = 0;
  absl::Time answered = absl::InfinitePast();  // the last health check it answered
  bool seen = false;                           // it answered once since this server started
  bool refused_said = false;                   // a take-over without a majority was logged
};

Failover::Failover(ParameterServer* server, std::vector<std::string> addresses, const ServerOptions& options)
    : server_(server),
      addresses_(std::move(addresses)),
      options_(options),
      lease_(absl::Milliseconds(server->config().cluster().lease_ms())) {}

absl::StatusOr<std::unique_ptr<Failover>> Failover::Start(ParameterServer* server,
                                                          std::vector<std::string> addresses,
                                                          const ServerOptions& options) {
  std::unique_ptr<Failover> failover(new Failover(server, std::move(addresses), options));
  const ShardMap& map = server->shard_map();
  if (map.replicas() < 2 || failover->addresses_.empty()) return failover;  // takes no range over
  SEGPS_RETURN_IF_ERROR(CheckAddresses(*server, failover->addresses_));
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      LoadChannelCredentials(server->config().security());
  if (!credentials.ok()) return credentials.status();
  // A server started again is reached within a ping's time, not after
  // gRPC's reconnect backoff (which would read as silence).
  grpc::ChannelArguments args = PeerArguments(server->config());
  const int every_ms = static_cast<int>(absl::ToInt64Milliseconds(failover->Every()));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, every_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, every_ms);
  for (const std::string& address : failover->addresses_) {
    failover->channels_.push_back(grpc::CreateCustomChannel(address, *credentials, args));
  }
  for (uint32_t primary : map.backed_by(server->index())) {
    if (map.holders(primary)[1] != server->index()) continue;  // only its first backup takes it over
    failover->watched_.push_back(std::make_unique<Watched>());
    failover->watched_.back()->primary = primary;
  }
  if (!failover->watched_.empty()) failover->thread_ = std::thread([raw = failover.get()] { raw->Watch(); });
  return failover;
}

Failover::~Failover() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

bool Failover::Answers(uint32_t index, absl::Duration deadline) {
  grpc::health::v1::Health::Stub stub(channels_[index]);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  context.set_wait_for_ready(true);  // a connection being made counts within the deadline
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  return stub.Check(&context, request, &response).ok();
}

absl::Duration Failover::Every() const { return std::max(lease_ / 20, absl::Milliseconds(20)); }

void Failover::Watch() {
  const absl::Duration every = Every();
  while (true) {
    for (auto& watched : watched_) {
      {
        MutexLock lock(&mu_);
        if (stop_) return;
        if (serving_.count(watched->primary) > 0) {
          // Served here: a run started again later gets a whole lease.
          watched->answered = absl::Now();
          continue;
        }
      }
      // A tenth of a lease to answer: a live server on a loaded machine is
      // not taken for gone (it would have to miss every ping of a lease).
      if (Answers(watched->primary, std::max(lease_ / 10, every))) {
        watched->answered = absl::Now();
        watched->seen = true;
        watched->refused_said = false;
        continue;
      }
      const absl::Duration down = absl::Now() - watched->answered;
      if (watched->seen && down >= lease_) TakeOver(watched.get(), down);
    }
    MutexLock lock(&mu_);
    if (!stop_) wake_.WaitWithDeadline(&mu_, absl::Now() + every);
    if (stop_) return;
  }
}

void Failover::TakeOver(Watched* watched, absl::Duration down) {
  const uint32_t primary = watched->primary;
  uint64_t incarnation = 0;
  {
    MutexLock lock(&mu_);
    auto known = incarnations_.find(primary);
    if (known == incarnations_.end()) return;  // it never wrote here: this server holds nothing of it
    incarnation = known->second;
    taken_over_[primary] = incarnation;  // its records are refused from now on
    if (auto open = streams_.find(primary); open != streams_.end()) open->second.second();
  }
  if (!watched->refused_said) {
    SEGPS_LOG_INFO << "server " << server_->index() << ": primary server " << primary << " has not answered for "
                   << absl::FormatDuration(down) << "; asking the other servers whether they reach it";
  }
  const std::vector<uint32_t> voters = Voters(primary, incarnation);
  const size_t majority = addresses_.size() / 2 + 1;
  absl::Status served =
      voters.size() >= majority
          ? Serve(primary, incarnation, voters, down)
          : absl::UnavailableError(absl::StrCat("only servers ", absl::StrJoin(voters, ", "), " of ",
                                                addresses_.size(), " cannot reach it (a majority is ", majority,
                                                ")"));
  if (served.ok()) {
    watched->answered = absl::Now();  // a run started again later gets a whole lease
    return;
  }
  {
    MutexLock lock(&mu_);
    taken_over_.erase(primary);
  }
  if (!std::exchange(watched->refused_said, true)) {
    SEGPS_LOG_WARNING << "server " << server_->index() << ": primary server " << primary << " at "
                      << addresses_[primary] << " has not answered for " << absl::FormatDuration(down)
                      << ", but its ranges are not taken over: " << served.message();
  }
}

std::vector<uint32_t> Failover::Voters(uint32_t primary, uint64_t incarnation) {
  std::vector<uint32_t> voters = {server_->index()};
  for (uint32_t k = 0; k < addresses_.size(); ++k) {
    if (k == primary || k == server_->index()) continue;
    v1::SuspectRequest request;
    *request.mutable_hello() = server_->Hello(k);
    request.set_server(primary);
    request.set_incarnation(incarnation);
    request.set_take_over(true);
    v1::SuspectResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + lease_ / 2));
    const grpc::Status status = v1::Replication::NewStub(channels_[k])->Suspect(&context, request, &response);
    if (status.ok() && !response.reachable()) voters.push_back(k);
  }
  return voters;
}

absl::Status Failover::Serve(uint32_t primary, uint64_t incarnation, const std::vector<uint32_t>& voters,
                             absl::Duration down) {
  v1::JobConfig config = server_->config();
  config.mutable_checkpoint()->clear_dir();  // the primary's checkpoints are its own
  ServerOptions options = options_;
  options.metrics = nullptr;
  options.checkpoint_dir.clear();
  absl::StatusOr<std::unique_ptr<ParameterServer>> created = ParameterServer::Create(config, primary, options);
  if (!created.ok()) return created.status();
  ParameterServer* taken = created->get();
  taken->BeginTakeBack();
  std::vector<uint64_t> records;
  {
    MutexLock lock(&mu_);  // no record lands meanwhile (Take holds it)
    for (int k = 0; k < server_->shard_map().num_segments(); ++k) {
      ReplicaRange* copy = server_->copy(k, primary);
      if (copy == nullptr) return absl::NotFoundError(absl::StrCat("this server holds no copy of segment ", k));
      const v1::ReplicaRecord state = copy->StateRecord();
      if (!state.has_state()) return absl::FailedPreconditionError("its copies hold no state yet");
      SEGPS_RETURN_IF_ERROR(taken->TakeBack(k, state));
      records.push_back(state.seq());
    }
  }
  taken->ServeAlone();
  taken->EndTakeBack();
  {
    MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("the server stops");
    serving_[primary] = *std::move(created);
    handed_back_.erase(primary);
  }
  if (options_.metrics != nullptr) options_.metrics->ObserveTakenOver(primary, true);
  SEGPS_LOG_WARNING << "server " << server_->index() << ": took over server " << primary << "'s ranges (records "
                    << absl::StrJoin(records, ", ") << "): it has not answered for " << absl::FormatDuration(down)
                    << " (cluster.lease_ms " << absl::ToInt64Milliseconds(lease_) << "), and servers "
                    << absl::StrJoin(voters, ", ") << " of " << addresses_.size()
                    << " cannot reach it. Calls for server " << primary
                    << " are served here, with one copy fewer than cluster.replicas "
                    << server_->shard_map().replicas() << ", until it is started again (incarnation "
                    << incarnation << " is refused from now on)";
  return absl::OkStatus();
}

absl::StatusOr<ParameterServer*> Failover::Route(uint32_t index) {
  if (index == server_->index()) return server_;
  if (index >= server_->shard_map().num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("header segps-server names server ", index, "; the job has ",
                                                   server_->shard_map().num_servers()));
  }
  MutexLock lock(&mu_);
  if (auto serving = serving_.find(index); serving != serving_.end()) return serving->second.get();
  if (handed_back_.count(index) > 0) {
    return absl::UnavailableError(absl::StrCat("server ", server_->index(), " handed server ", index,
                                               "'s ranges back to it (started again): call server ", index));
  }
  return absl::UnavailableError(absl::StrCat("server ", server_->index(), " serves no ranges of server ", index,
                                             ": it has not taken them over"));
}

void Failover::Drain() {
  MutexLock lock(&mu_);
  for (auto& [primary, taken] : serving_) taken->Drain();
  for (auto& taken : retired_) taken->Drain();
}

void Failover::Reopen() {
  MutexLock lock(&mu_);
  for (auto& [primary, taken] : serving_) taken->Reopen();
}

absl::Status Failover::Refusal(const v1::ReplicaHello& hello) const {
  auto taken = taken_over_.find(hello.from_server());
  if (taken == taken_over_.end() || taken->second != hello.incarnation()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("server ", server_->index(), " took over server ", hello.from_server(),
                                         "'s ranges (its run ", hello.incarnation(),
                                         " stopped answering): that run acknowledges nothing more"));
}

absl::StatusOr<uint64_t> Failover::Opened(const v1::ReplicaHello& hello, std::function<void()> cancel) {
  MutexLock lock(&mu_);
  SEGPS_RETURN_IF_ERROR(Refusal(hello));
  incarnations_[hello.from_server()] = hello.incarnation();
  streams_[hello.from_server()] = {++next_stream_, std::move(cancel)};
  return next_stream_;
}

void Failover::Closed(uint32_t from, uint64_t stream) {
  MutexLock lock(&mu_);
  if (auto open = streams_.find(from); open != streams_.end() && open->second.first == stream) streams_.erase(open);
}

absl::Status Failover::Take(const v1::ReplicaHello& hello, const v1::ReplicaRecord& record,
                            const Payload& gradient) {
  MutexLock lock(&mu_);
  SEGPS_RETURN_IF_ERROR(Refusal(hello));
  return server_->TakeReplica(hello.from_server(), record, gradient);
}

absl::StatusOr<v1::ReplicaRecord> Failover::Fetch(const v1::FetchRequest& request) {
  SEGPS_RETURN_IF_ERROR(server_->CheckHello(request.hello()));
  const uint32_t primary = request.hello().from_server();
  MutexLock lock(&mu_);
  auto serving = serving_.find(primary);
  if (serving != serving_.end() && request.hello().incarnation() != taken_over_[primary]) {
    std::vector<v1::ReplicaRecord> states = serving->second->HandOver(
        absl::StrCat("server ", primary, " is back (started again): server ", server_->index(),
                     " handed its ranges back to it; call server ", primary));
    for (size_t k = 0; k < states.size(); ++k) {
      states[k].set_segment(static_cast<uint32_t>(k));
      states[k].set_range(primary);
    }
    handed_back_[primary] = {request.hello().incarnation(), std::move(states)};
    retired_.push_back(std::move(serving->second));
    serving_.erase(serving);
    SEGPS_LOG_WARNING << "server " << server_->index() << ": server " << primary
                      << " is back (started again): its ranges are handed back to it";
    if (options_.metrics != nullptr) options_.metrics->ObserveTakenOver(primary, false);
  }
  if (auto handed = handed_back_.find(primary);
      handed != handed_back_.end() && handed->second.first == request.hello().incarnation()) {
    if (request.segment() >= handed->second.second.size()) {
      return absl::NotFoundError(absl::StrCat("Fetch: no segment ", request.segment()));
    }
    return handed->second.second[request.segment()];
  }
  if (serving != serving_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("Fetch: server ", server_->index(), " serves server ", primary,
                                                      "'s ranges since it took them over from this very run"));
  }
  return server_->Fetch(request);
}

v1::SuspectResponse Failover::Suspect(const v1::SuspectRequest& request) {
  const uint32_t asker = request.hello().from_server();
  v1::SuspectResponse response;
  bool serving = false;
  {
    MutexLock lock(&mu_);
    serving = serving_.count(request.server()) > 0;
    // The asker's run, voted gone here or taken over by this server.
    const auto names_asker = [&](const std::map<uint32_t, uint64_t>& runs) {
      auto run = runs.find(asker);
      return run != runs.end() && run->second == request.hello().incarnation();
    };
    response.set_asker_replaced(names_asker(voted_gone_) || names_asker(taken_over_));
  }
  const bool reachable = request.server() == server_->index() || channels_.empty() ||
                         (!serving && request.server() < addresses_.size() &&
                          Answers(request.server(), Every()));
  response.set_reachable(reachable);
  if (!reachable && request.take_over() && request.server() < server_->shard_map().num_servers()) {
    MutexLock lock(&mu_);
    voted_gone_[request.server()] = request.incarnation();
  }
  return response;
}

absl::Status Failover::MayDrop(uint32_t backup) {
  size_t answered = 1;  // this server
  for (uint32_t k = 0; k < channels_.size(); ++k) {
    if (k == backup || k == server_->index()) continue;
    v1::SuspectRequest request;
    *request.mutable_hello() = server_->Hello(k);
    request.set_server(backup);
    v1::SuspectResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + lease_ / 2));
    if (!v1::Replication::NewStub(channels_[k])->Suspect(&context, request, &response).ok()) continue;
    if (response.asker_replaced()) {
      return absl::AbortedError(absl::StrCat("server ", k, " voted this run gone: its ranges were taken over"));
    }
    ++answered;
  }
  const size_t majority = addresses_.size() / 2 + 1;
  if (answered >= majority) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("only ", answered, " of ", addresses_.size(),
                                             " servers answer this one (a majority is ", majority, ")"));
}

void Failover::Stop(const std::string& why) {
  SEGPS_LOG_ERROR << "server " << server_->index() << " stops: " << why
                  << ". Another server serves its ranges; start this one again to take them back";
  server_->Drain();
  std::cout.flush();
  std::cerr.flush();
  _exit(3);
}

}  // namespace segps
