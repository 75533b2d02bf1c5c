// The primary's side of replication (cluster.replicas): one stream to each
// server that backs a range of this one (proto/segps/v1/replication.proto).
// A link opens its stream with the server's sealed hello, has the server
// restart the backup's records from each range's whole state
// (ParameterServer::SyncReplicas), then sends the logs' records as they
// come and hands the backup's acknowledgements to the logs, which release
// the pushes that waited for them. A stream that fails is opened again
// with backoff (50 ms doubling to 1 s), from the state again; meanwhile
// pushes wait, and the log says so once per outage. A backup out of reach
// for a lease (cluster.lease_ms; a paused one is found out by keepalive
// pings within two more) is dropped, if a majority of the servers answers
// this one and none voted it gone (server/failover.h): pushes are
// acknowledged without it until its link opens again, the log says so, and
// segps_server_backup_reachable is 0 (the SegpsBackupUnreachable alert).
// A backup that took this server's ranges over refuses its stream: the
// server stops (Failover::Stop).
//
// Thread safety: a thread per link; Start and the destructor from one
// thread, the destructor once the server no longer takes pushes (its gRPC
// server shut down): a push's log wakes the links.
#ifndef SEGPS_SERVER_REPLICA_LINKS_H_
#define SEGPS_SERVER_REPLICA_LINKS_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/channel_arguments.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "server/parameter_server.h"
#include "server/server_metrics.h"

namespace segps {

class Failover;

// A server's channels to its peers: messages of cluster.max_message_bytes,
// reconnects within 100 ms to 1 s, keepalive pings every lease.
grpc::ChannelArguments PeerArguments(const v1::JobConfig& config);
// cluster.replicas: `addresses` must be every server's (--servers or
// cluster.server_addresses); INVALID_ARGUMENT naming both counts otherwise.
absl::Status CheckAddresses(const ParameterServer& server, const std::vector<std::string>& addresses);

// A server started again without its ranges (cluster.replicas) takes each
// back from a backup's copy before it serves workers, which it refuses
// meanwhile; a backup that holds no copy yet (the job begins) leaves the
// range as it is. Each backup is asked in turn (any holds every acknowledged
// push), all again with backoff until
// `timeout` (cluster.recovery_timeout_ms). Call before ReplicaLinks::Start:
// a link would replace the backup's copy with this server's own state.
absl::Status TakeBackRanges(ParameterServer* server, const std::vector<std::string>& addresses,
                            absl::Duration timeout);

class ReplicaLinks {
 public:
  // Links `server` (which outlives them) to its backups at `addresses`
  // (every server's, in index order). None with one copy. A backup is
  // dropped only once `failover` (which outlives them) finds a majority of
  // the servers answering and none that voted this run gone; a backup or
  // a server that says this run was taken over stops the server
  // (Failover::Stop). `metrics` (may be null) hears whether each backup is
  // reachable.
  static absl::StatusOr<std::unique_ptr<ReplicaLinks>> Start(ParameterServer* server,
                                                             std::vector<std::string> addresses,
                                                             Failover* failover, ServerMetrics* metrics = nullptr);
  ~ReplicaLinks();

 private:
  struct Link;
  ReplicaLinks(ParameterServer* server, std::vector<std::string> addresses, Failover* failover,
               ServerMetrics* metrics);
  // Keeps backup `backup`'s stream open until the links stop.
  void Run(Link* link);
  // The backup has been out of reach for `down`, a lease or more: its
  // copies are dropped (ReplicaLog::Drop) until a stream opens again, if a
  // majority allows (whether it did).
  bool Drop(Link* link, absl::Duration down);
  // The backup acknowledged the stream's first record: it is reachable,
  // and holds this server's state.
  void Reached(Link* link);
  // One stream's life: whether the backup acknowledged anything on it
  // (why it ended in `error`). A backup that took this run over stops the
  // server.
  bool Stream(Link* link, std::string* error);

  ParameterServer* const server_;
  const std::vector<std::string> addresses_;
  Failover* const failover_;
  ServerMetrics* const metrics_;  // may be null
  const absl::Duration record_delay_;  // --fault_replica_delay_ms
  std::vector<std::unique_ptr<Link>> links_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_REPLICA_LINKS_H_
