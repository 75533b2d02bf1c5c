// Failover (cluster.replicas; docs/replication.md): a range's first backup
// takes the range over when its primary stops answering, with no restart
// and no rollback.
//
// - Watch: the backup pings each primary it is first backup of every 20th
//   of a lease (grpc.health.v1 Check, a tenth of a lease to answer; a
//   voter gives it a 20th).
// - Take over: once the primary has not answered for a lease, the backup
//   stops taking its records (its streams are refused from then on) and
//   asks every other server (Suspect) whether it cannot reach the primary
//   either. With a majority of the servers, itself included, it serves the
//   primary's ranges from its copies: a second ParameterServer of the
//   primary's index in this process, started as a restarted primary is,
//   taken back from the copies. Calls that name the primary's index
//   (kServerHeader) reach it through this server's listener. A voter
//   remembers its vote against that run of the primary (its incarnation).
// - Fence: a primary that is refused by its backup for a take-over, or
//   that is about to go on without a backup and hears from the servers
//   that it was voted gone, stops (Stop): it acknowledges nothing more. A
//   primary drops a backup only while a majority of the servers answers
//   it, so a primary cut off from the others acknowledges nothing alone.
// - Hand back: a primary started again (a new run) fetches its ranges from
//   here as from any backup: the ranges taken over stop serving (their
//   registrations end, so no push lands after the state is read) and their
//   state is what it takes back.
//
// Thread safety: every method may be called concurrently.
#ifndef SEGPS_SERVER_FAILOVER_H_
#define SEGPS_SERVER_FAILOVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sync.h"
#include "segps/v1/replication.pb.h"
#include "server/parameter_server.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace segps {

class Failover {
 public:
  // Watches the primaries `server` (which outlives this) is first backup
  // of; `addresses` are every server's. Nothing to watch with one copy, and
  // none taken over without addresses.
  // `options` make the servers of ranges taken over (no metrics, no
  // checkpoints of their own); their metrics, if any, hear what is taken
  // over (segps_server_serving_taken_over).
  static absl::StatusOr<std::unique_ptr<Failover>> Start(ParameterServer* server,
                                                         std::vector<std::string> addresses,
                                                         const ServerOptions& options);
  ~Failover();

  // The server that serves calls for server `index` here: this one, or a
  // primary whose ranges were taken over here; UNAVAILABLE naming why for
  // any other.
  absl::StatusOr<ParameterServer*> Route(uint32_t index);
  // The servers of ranges taken over answer their waiting calls and wait no
  // more, as ParameterServer::Drain (the listener stops), until Reopen.
  void Drain();
  void Reopen();

  // The backup's side. A record of primary `from` (`hello` its stream's
  // first record's) is taken by this server's copy unless that run of it
  // was taken over (ABORTED, naming the take-over), all under the lock a
  // take-over reads the copies under: a record is in the state taken over
  // or refused. A push's gradient bytes are `gradient`.
  absl::Status Take(const v1::ReplicaHello& hello, const v1::ReplicaRecord& record, const Payload& gradient);
  // A stream's first record: refused as Take's; `cancel` ends the stream
  // on a take-over (Closed before the stream's context goes).
  absl::StatusOr<uint64_t> Opened(const v1::ReplicaHello& hello, std::function<void()> cancel);
  void Closed(uint32_t from, uint64_t stream);
  // Fetch: a primary started again takes back the ranges taken over here
  // (handed back), else this server's copies.
  absl::StatusOr<v1::ReplicaRecord> Fetch(const v1::FetchRequest& request);
  // Suspect, its hello checked.
  v1::SuspectResponse Suspect(const v1::SuspectRequest& request);

  // The primary's side: whether it may go on without `backup`. OK: a
  // majority of the servers answers and none voted this run gone;
  // UNAVAILABLE: no majority answers (ask again later); ABORTED: it was
  // taken over (call Stop).
  absl::Status MayDrop(uint32_t backup);
  // This run was taken over: refuses every call and ends the process.
  [[noreturn]] void Stop(const std::string& why);

 private:
  struct Watched;
  Failover(ParameterServer* server, std::vector<std::string> addresses, const ServerOptions& options);
  void Watch();
  // How often a primary is asked, and how long it has to answer.
  absl::Duration Every() const;
  // Whether server `index` answers a health check within `deadline`.
  bool Answers(uint32_t index, absl::Duration deadline);
  // Primary `primary` has not answered for `down`: take its ranges over
  // if a majority agrees.
  void TakeOver(Watched* watched, absl::Duration down);
  // The servers that cannot reach `primary` (this one counted), asking
  // each other one with `take_over`.
  std::vector<uint32_t> Voters(uint32_t primary, uint64_t incarnation);
  // Serves `primary`'s ranges here from this server's copies.
  absl::Status Serve(uint32_t primary, uint64_t incarnation, const std::vector<uint32_t>& voters,
                     absl::Duration down);
  // ABORTED if `hello`'s run was taken over here.
  absl::Status Refusal(const v1::ReplicaHello& hello) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterServer* const server_;
  const std::vector<std::string> addresses_;
  ServerOptions options_;
  const absl::Duration lease_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<Watched>> watched_;
  Mutex mu_;
  CondVar wake_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // By primary: its stream's last hello's incarnation, and how to end it.
  std::map<uint32_t, uint64_t> incarnations_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::pair<uint64_t, std::function<void()>>> streams_ ABSL_GUARDED_BY(mu_);
  uint64_t next_stream_ ABSL_GUARDED_BY(mu_) = 0;
  // Runs taken over here (primary -> incarnation), and their servers.
  std::map<uint32_t, uint64_t> taken_over_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::unique_ptr<ParameterServer>> serving_ ABSL_GUARDED_BY(mu_);
  // Ranges handed back to a primary's new run: its incarnation, each
  // segment's state. Their servers stay (calls in flight may hold them).
  std::map<uint32_t, std::pair<uint64_t, std::vector<v1::ReplicaRecord>>> handed_back_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<ParameterServer>> retired_ ABSL_GUARDED_BY(mu_);
  // Votes this server gave: runs it found out of reach for a take-over.
  std::map<uint32_t, uint64_t> voted_gone_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_FAILOVER_H_
