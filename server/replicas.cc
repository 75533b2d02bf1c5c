// ParameterServer's part in replication (cluster.replicas;
// docs/replication.md): the logs of its own ranges, its copies of the
// ranges it backs, and the checks on a primary's hello and records. The
// links that carry them are server/replica_links.h and
// server/replication_service.h.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/parameter_server.h"
#include "server/state_seal.h"

namespace segps {

absl::Status ParameterServer::AddReplicas() {
  if (map_.replicas() < 2) return absl::OkStatus();
  for (int k = 0; k < map_.num_segments(); ++k) {
    std::vector<uint32_t> holders = map_.holders(index_);
    holders.erase(holders.begin());  // the primary: this server
    logs_.push_back(std::make_unique<ReplicaLog>(k, index_, std::move(holders)));
    for (uint32_t range : map_.backed_by(index_)) {
      const Range extent = map_.range(k, range);
      absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = CreateOptimizer(config_.optimizer(), extent.count);
      if (!optimizer.ok()) return optimizer.status();
      // A range's state travels in one record.
      const uint64_t state_bytes = extent.count * sizeof(float) * (1 + (*optimizer)->SlotNames().size()) + 4096;
      if (state_bytes > config_.cluster().max_message_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cluster.replicas: segment ", k, " range ", range, "'s values and optimizer state are ", state_bytes,
            " bytes, more than cluster.max_message_bytes (", config_.cluster().max_message_bytes(),
            "); raise it, or add servers"));
      }
      copies_[{k, range}] =
          std::make_unique<ReplicaRange>(k, range, extent, WorkersOf(config_, k), *std::move(optimizer));
    }
  }
  return absl::OkStatus();
}

ReplicaRange* ParameterServer::copy(int segment, uint32_t range) {
  auto it = copies_.find({segment, range});
  return it == copies_.end() ? nullptr : it->second.get();
}

void ParameterServer::SyncReplicas(uint32_t backup) {
  for (auto& shard : shards_) shard->SyncReplica(backup);
}

v1::ReplicaHello ParameterServer::Hello(uint32_t backup) const {
  v1::ReplicaHello hello;
  hello.set_from_server(index_);
  hello.set_to_server(backup);
  hello.set_incarnation(incarnation_);
  hello.set_shard_fingerprint(map_.fingerprint());
  if (!state_key_.empty()) SealHello(state_key_, &hello);
  return hello;
}

absl::Status ParameterServer::CheckPeer(const v1::ReplicaHello& hello, const char* call) const {
  if (hello.to_server() != index_) {
    return absl::FailedPreconditionError(absl::StrCat(call, ": this is server ", index_, ", not server ",
                                                      hello.to_server(), "; check the server addresses"));
  }
  if (hello.shard_fingerprint() != map_.fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, ": server ", hello.from_server(), " has shard map ", hello.shard_fingerprint(), ", this server ",
        map_.fingerprint(), " (another model, server count or cluster.replicas)"));
  }
  if (authenticated_ && (state_key_.empty() || !HelloSealHolds(state_key_, hello))) {
    return absl::PermissionDeniedError(absl::StrCat(
        call, ": the hello is not sealed with the servers' key (the token file's `server` line); only a server "
              "of this job calls it"));
  }
  if (hello.from_server() >= map_.num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": hello from_server ", hello.from_server(),
                                                   " is not a server of this job (", map_.num_servers(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::CheckHello(const v1::ReplicaHello& hello) const {
  SEGPS_RETURN_IF_ERROR(CheckPeer(hello, "Replicate"));
  const std::vector<uint32_t> backed = map_.backed_by(index_);
  if (std::find(backed.begin(), backed.end(), hello.from_server()) == backed.end()) {
    return absl::FailedPreconditionError(absl::StrCat("Replicate: server ", index_, " backs no range of server ",
                                                      hello.from_server(), " with cluster.replicas ",
                                                      map_.replicas()));
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::TakeReplica(uint32_t from, const v1::ReplicaRecord& record,
                                          const Payload& gradient) {
  if (record.range() != from) {
    return absl::InvalidArgumentError(absl::StrCat("Replicate: server ", from, " sent a record of range ",
                                                   record.range(), ", which it is not the primary of"));
  }
  ReplicaRange* range = record.segment() < static_cast<uint32_t>(map_.num_segments())
                            ? copy(static_cast<int>(record.segment()), record.range())
                            : nullptr;
  if (range == nullptr) {
    return absl::NotFoundError(absl::StrCat("Replicate: server ", index_, " holds no copy of segment ",
                                            record.segment(), " range ", record.range()));
  }
  return range->Take(record, gradient);
}

absl::Status ParameterServer::TakeBack(int segment, const v1::ReplicaRecord& copy) {
  if (!copy.has_state()) return absl::OkStatus();  // the backup held nothing yet: the job had not begun
  const Range range = map_.range(segment, index_);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = CreateOptimizer(config_.optimizer(), range.count);
  if (!optimizer.ok()) return optimizer.status();
  // Checked as a backup checks a state, before anything changes.
  ReplicaRange check(segment, index_, range, WorkersOf(config_, segment), *std::move(optimizer));
  SEGPS_RETURN_IF_ERROR(check.Take(copy, Payload()));
  shards_[segment]->TakeBack(copy.state());
  taken_back_ = true;
  return absl::OkStatus();
}

void ParameterServer::ServeAlone() {
  for (auto& log : logs_) {
    for (uint32_t backup : log->backups()) log->Drop(backup);
  }
}

std::vector<v1::ReplicaRecord> ParameterServer::HandOver(const std::string& why) {
  std::vector<v1::ReplicaRecord> states;
  for (auto& shard : shards_) states.push_back(shard->HandOver(why));
  return states;
}

absl::StatusOr<v1::ReplicaRecord> ParameterServer::Fetch(const v1::FetchRequest& request) const {
  SEGPS_RETURN_IF_ERROR(CheckHello(request.hello()));
  auto it = copies_.find({static_cast<int>(request.segment()), request.range()});
  if (it == copies_.end() || request.range() != request.hello().from_server()) {
    return absl::NotFoundError(absl::StrCat("Fetch: server ", index_, " holds no copy of segment ", request.segment(),
                                            " range ", request.range(), " for server ",
                                            request.hello().from_server()));
  }
  return it->second->StateRecord();
}

absl::Status ParameterServer::ReadCopy(const v1::PullRequest& request, ReadValues& read,
                                       v1::PullResponse* response) {
  if (!request.reader() || request.worker_id() != 0 || !request.registration_secret().empty()) {
    return absl::InvalidArgumentError("Pull copy_of: only a reader (reader true, worker_id 0) reads a copy");
  }
  if (request.rows_size() > 0 || request.rows_only() || request.has_reply_region_offset()) {
    return absl::InvalidArgumentError("Pull copy_of: a copy's values are read without rows and without a region");
  }
  const int segment = static_cast<int>(request.segment());
  ReplicaRange* copy = this->copy(segment, request.copy_of());
  if (copy == nullptr) {
    return absl::NotFoundError(absl::StrCat("Pull copy_of: server ", index_, " holds no copy of segment ", segment,
                                            " range ", request.copy_of(), " (cluster.replicas ", map_.replicas(),
                                            ")"));
  }
  absl::StatusOr<Range> chunk = PulledChunk(request, map_.range(segment, request.copy_of()), "Pull copy_of", "the copy's");
  if (!chunk.ok()) return chunk.status();
  absl::StatusOr<v1::DType> dtype = PulledDType(request, "Pull copy_of");
  if (!dtype.ok()) return dtype.status();
  ReplicaRange::Position at;
  SEGPS_RETURN_IF_ERROR(copy->Read(*chunk, [&](absl::Span<const float> values) { read(values, *dtype); }, &at));
  response->set_clock(at.clock);
  response->set_updates(at.updates);
  response->set_incarnation(incarnation_);
  v1::TensorSlice* values = response->mutable_values();
  values->set_offset(chunk->offset);
  values->set_count(chunk->count);
  values->set_dtype(*dtype);
  return absl::OkStatus();
}

void ParameterServer::FillReplicaStats(bool digests, v1::StatsResponse* response) {
  size_t waiting = 0;
  for (auto& log : logs_) waiting += log->Waiting();
  response->set_waiting_for_backups(static_cast<uint32_t>(waiting));
  for (int k = 0; digests && k < response->segments_size(); ++k) {
    response->mutable_segments(k)->set_digest(shards_[k]->Digest());
  }
  for (const auto& [key, range] : copies_) {
    v1::ReplicaStats* stats = response->add_replicas();
    stats->set_segment(static_cast<uint32_t>(key.first));
    stats->set_range(key.second);
    const ReplicaRange::Position at = range->position();
    stats->set_seq(at.seq);
    stats->set_clock(at.clock);
    stats->set_updates(at.updates);
    if (digests) stats->set_digest(range->Digest());
  }
}

}  // namespace segps
