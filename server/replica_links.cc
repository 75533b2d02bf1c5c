#include "server/replica_links.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "segps/v1/replication.grpc.pb.h"
#include "server/failover.h"
#include "server/replica_wire.h"

ABSL_FLAG(int32_t, fault_replica_delay_ms, 0,
          "Fault injection, for tests: each record this server sends a backup waits this long first (a slow link "
          "to its backups: pushes stay unacknowledged meanwhile). 0: none.");

namespace segps {

struct ReplicaLinks::Link {
  uint32_t backup = 0;
  std::shared_ptr<grpc::Channel> channel;
  Mutex mu;
  CondVar wake;
  bool pending ABSL_GUARDED_BY(mu) = false;  // a log gained a record for this backup
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool reported ABSL_GUARDED_BY(mu) = false;  // the current outage was logged
  bool dropped ABSL_GUARDED_BY(mu) = false;   // out of reach for a lease: its copies are dropped
  bool held ABSL_GUARDED_BY(mu) = false;      // no majority let it drop the backup (said once)
  grpc::ClientContext* context ABSL_GUARDED_BY(mu) = nullptr;  // the open stream's, to cancel it
  std::thread thread;
};

grpc::ChannelArguments PeerArguments(const v1::JobConfig& config) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
  args.SetMaxReceiveMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
  // A backup that starts after its primary, or again, is reached within
  // 100 ms to 1 s (gRPC's own backoff starts at 1 s and grows to 2 minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A backup that is paused or cut off keeps its connection open but
  // answers nothing: a ping unanswered for a lease closes the connection,
  // so the link reports it and opens a new one.
  const int lease_ms = static_cast<int>(std::min<uint32_t>(config.cluster().lease_ms(), INT32_MAX));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, lease_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, lease_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

absl::Status CheckAddresses(const ParameterServer& server, const std::vector<std::string>& addresses) {
  const v1::ClusterConfig& cluster = server.config().cluster();
  if (addresses.size() == cluster.num_servers()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "cluster.replicas ", cluster.replicas(), ": server ", server.index(), " needs the ", cluster.num_servers(),
      " servers' addresses to reach its peers (--servers or cluster.server_addresses); it has ", addresses.size()));
}

absl::Status TakeBackRanges(ParameterServer* server, const std::vector<std::string>& addresses,
                            absl::Duration timeout) {
  if (server->replica_logs().empty()) return absl::OkStatus();
  SEGPS_RETURN_IF_ERROR(CheckAddresses(*server, addresses));
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      LoadChannelCredentials(server->config().security());
  if (!credentials.ok()) return credentials.status();
  // Every backup holds every acknowledged push: any one that answers will do.
  const std::vector<uint32_t>& backups = server->replica_logs().front()->backups();
  std::vector<std::unique_ptr<v1::Replication::Stub>> stubs;
  for (uint32_t b : backups) {
    stubs.push_back(v1::Replication::NewStub(
        grpc::CreateCustomChannel(addresses[b], *credentials, PeerArguments(server->config()))));
  }
  server->BeginTakeBack();
  const absl::Time give_up = absl::Now() + timeout;
  absl::Duration delay = absl::Milliseconds(50);
  for (int k = 0, attempt = 0; k < server->shard_map().num_segments(); ++attempt) {
    const size_t which = attempt % backups.size();
    const uint32_t backup = backups[which];
    auto& stub = stubs[which];
    v1::FetchRequest request;
    *request.mutable_hello() = server->Hello(backup);
    request.set_segment(static_cast<uint32_t>(k));
    request.set_range(server->index());
    v1::ReplicaRecord copy;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    const grpc::Status status = stub->Fetch(&context, request, &copy);
    // A backup with no copy (started again itself) may be beside one with.
    if (status.ok() && !copy.has_state() && which + 1 < backups.size()) continue;
    if (status.ok()) {
      SEGPS_RETURN_IF_ERROR(server->TakeBack(k, copy));
      if (copy.has_state()) {
        SEGPS_LOG_INFO << "server " << server->index() << ": took segment " << k << "'s range back from server "
                       << backup << " (record " << copy.seq() << ")";
      }
      ++k;
      continue;
    }
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() + delay > give_up) {
      const absl::Status failed = FromGrpcStatus(status);
      return absl::Status(failed.code(), absl::StrCat("cannot take segment ", k, "'s range back from server ", backup,
                                                      " at ", addresses[backup], ": ", failed.message()));
    }
    if (delay == absl::Milliseconds(50)) {
      SEGPS_LOG_INFO << "server " << server->index() << ": waiting for server " << backup << " at "
                     << addresses[backup] << " to take back its ranges (" << status.error_message() << ")";
    }
    if (which + 1 < backups.size()) continue;  // the next backup at once
    absl::SleepFor(delay);
    delay = std::min(delay * 2, absl::Seconds(1));
  }
  server->EndTakeBack();
  return absl::OkStatus();
}

ReplicaLinks::ReplicaLinks(ParameterServer* server, std::vector<std::string> addresses, Failover* failover,
                           ServerMetrics* metrics)
    : server_(server), addresses_(std::move(addresses)), failover_(failover), metrics_(metrics),
      record_delay_(absl::Milliseconds(absl::GetFlag(FLAGS_fault_replica_delay_ms))) {}

absl::StatusOr<std::unique_ptr<ReplicaLinks>> ReplicaLinks::Start(ParameterServer* server,
                                                                   std::vector<std::string> addresses,
                                                                   Failover* failover, ServerMetrics* metrics) {
  const v1::JobConfig& config = server->config();
  std::unique_ptr<ReplicaLinks> links(new ReplicaLinks(server, std::move(addresses), failover, metrics));
  if (server->replica_logs().empty()) return links;
  SEGPS_RETURN_IF_ERROR(CheckAddresses(*server, links->addresses_));
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = LoadChannelCredentials(config.security());
  if (!credentials.ok()) return credentials.status();
  const grpc::ChannelArguments args = PeerArguments(config);
  for (uint32_t backup : server->replica_logs().front()->backups()) {
    auto link = std::make_unique<Link>();
    link->backup = backup;
    link->channel = grpc::CreateCustomChannel(links->addresses_[backup], *credentials, args);
    links->links_.push_back(std::move(link));
  }
  for (auto& log : server->replica_logs()) {
    log->SetWake([raw = links.get()](uint32_t backup) {
      for (auto& link : raw->links_) {
        if (link->backup != backup) continue;
        MutexLock lock(&link->mu);
        link->pending = true;
        link->wake.SignalAll();
      }
    });
  }
  for (auto& link : links->links_) {
    if (metrics != nullptr) metrics->ObserveBackup(link->backup, false);
  }
  for (auto& link : links->links_) link->thread = std::thread([raw = links.get(), l = link.get()] { raw->Run(l); });
  return links;
}

ReplicaLinks::~ReplicaLinks() {
  for (auto& log : server_->replica_logs()) log->SetWake(nullptr);
  for (auto& link : links_) {
    MutexLock lock(&link->mu);
    link->stop = true;
    if (link->context != nullptr) link->context->TryCancel();
    link->wake.SignalAll();
  }
  for (auto& link : links_) {
    if (link->thread.joinable()) link->thread.join();
  }
}

void ReplicaLinks::Run(Link* link) {
  const std::string who =
      absl::StrCat("server ", server_->index(), ": backup server ", link->backup, " at ", addresses_[link->backup]);
  const absl::Duration lease = absl::Milliseconds(server_->config().cluster().lease_ms());
  absl::Duration delay = absl::Milliseconds(50);
  // An outage is reported once it lasts a second (a backup starting or
  // restarting is back sooner), and once more when it ends. One that lasts
  // a lease drops the backup's copies: pushes stop waiting for it.
  std::optional<absl::Time> down_since;
  while (true) {
    std::string error;
    const bool served = Stream(link, &error);
    const absl::Time now = absl::Now();
    if (served) {
      delay = absl::Milliseconds(50);
      down_since = now;
    }
    if (!down_since.has_value()) down_since = now;
    bool drop = false;
    {
      MutexLock lock(&link->mu);
      if (link->stop) return;
      if (!link->reported && now - *down_since >= std::min(absl::Seconds(1), lease)) {
        SEGPS_LOG_WARNING << who << " is unreachable for " << absl::FormatDuration(now - *down_since) << " ("
                          << error << "); pushes to this server's ranges wait for it for up to a lease ("
                          << absl::FormatDuration(lease) << ")";
        link->reported = true;
      }
      drop = !link->dropped && now - *down_since >= lease;
    }
    // Outside the link's lock: the pushes released are answered here.
    if (drop && Drop(link, now - *down_since)) {
      MutexLock lock(&link->mu);
      link->dropped = true;
    }
    MutexLock lock(&link->mu);
    // Woken at the lease's end to drop the backup, if not by a record sooner
    // (a drop no majority allowed is asked again after the backoff).
    const absl::Time until =
        link->dropped || link->held ? now + delay : std::min(now + delay, *down_since + lease);
    if (!link->stop) link->wake.WaitWithDeadline(&link->mu, until);
    delay = std::min(delay * 2, absl::Seconds(1));
  }
}

bool ReplicaLinks::Drop(Link* link, absl::Duration down) {
  const uint32_t backup = link->backup;
  const absl::Status allowed = failover_ != nullptr ? failover_->MayDrop(backup) : absl::OkStatus();
  if (absl::IsAborted(allowed)) failover_->Stop(std::string(allowed.message()));
  if (!allowed.ok()) {
    MutexLock lock(&link->mu);
    if (std::exchange(link->held, true)) return false;  // said once an outage
    SEGPS_LOG_WARNING << "server " << server_->index() << ": backup server " << backup << " is out of reach for "
                      << absl::FormatDuration(down) << ", and pushes go on waiting for it: " << allowed.message();
    return false;
  }
  for (auto& log : server_->replica_logs()) log->Drop(backup);
  const uint32_t replicas = server_->shard_map().replicas();
  SEGPS_LOG_WARNING << "server " << server_->index() << ": backup server " << backup << " at "
                    << addresses_[backup] << " is out of reach for " << absl::FormatDuration(down)
                    << ": its copies of this server's ranges are dropped, and pushes are acknowledged with one copy "
                       "fewer than cluster.replicas "
                    << replicas << " until it is back and filled again";
  return true;
}

void ReplicaLinks::Reached(Link* link) {
  if (metrics_ != nullptr) metrics_->ObserveBackup(link->backup, true);
  MutexLock lock(&link->mu);
  if (link->dropped) {
    SEGPS_LOG_INFO << "server " << server_->index() << ": backup server " << link->backup
                   << " is filled again from this server's state";
  } else if (link->reported) {
    SEGPS_LOG_INFO << "server " << server_->index() << ": backup server " << link->backup
                   << " takes its records again";
  }
  link->reported = false;
  link->dropped = false;
  link->held = false;
}

bool ReplicaLinks::Stream(Link* link, std::string* error) {
  grpc::ClientContext context;
  {
    MutexLock lock(&link->mu);
    if (link->stop) return false;
    link->context = &context;
  }
  std::unique_ptr<ReplicateStream> stream = OpenReplicate(link->channel.get(), &context);
  std::atomic<bool> broken{false};
  std::atomic<bool> ended{false};  // the backup ended the stream: its status says why
  bool served = false;
  ReplicaChange hello;
  *hello.record.mutable_hello() = server_->Hello(link->backup);
  if (stream->Write(EncodeRecord(hello))) {
    // From here on every range this backup holds starts from its state.
    server_->SyncReplicas(link->backup);
    std::thread reader([&] {
      grpc::ByteBuffer bytes;
      v1::ReplicaAck ack;
      const auto& logs = server_->replica_logs();
      while (stream->Read(&bytes)) {
        if (!DecodeAck(&bytes, &ack)) {  // not an acknowledgement: the stream is of no use
          context.TryCancel();
          break;
        }
        if (!served) Reached(link);
        served = true;
        if (ack.segment() < logs.size()) logs[ack.segment()]->Acked(link->backup, ack.seq());
      }
      if (metrics_ != nullptr) metrics_->ObserveBackup(link->backup, false);
      ended = true;
      broken = true;
      MutexLock lock(&link->mu);
      link->wake.SignalAll();
    });
    while (!broken) {
      for (auto& log : server_->replica_logs()) {
        for (const ReplicaLog::Record& record : log->Take(link->backup)) {
          if (record_delay_ > absl::ZeroDuration()) absl::SleepFor(record_delay_);
          if (!broken && !stream->Write(EncodeRecord(*record))) broken = true;
        }
      }
      MutexLock lock(&link->mu);
      while (!link->pending && !link->stop && !broken) link->wake.Wait(&link->mu);
      link->pending = false;
      if (link->stop) broken = true;
    }
    if (!ended) context.TryCancel();  // the reader waits for the backup otherwise
    reader.join();
  }
  const grpc::Status status = stream->Finish();
  *error = status.ok() ? "the stream ended" : status.error_message();
  if (status.error_code() == grpc::StatusCode::ABORTED && failover_ != nullptr) failover_->Stop(*error);
  MutexLock lock(&link->mu);
  link->context = nullptr;
  return served;
}

}  // namespace segps
