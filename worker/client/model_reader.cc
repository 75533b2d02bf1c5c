#include "worker/client/model_reader.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/security.h"
#include "common/server_route.h"
#include "common/tensor_wire.h"
#include "worker/client/ps_client.h"

namespace segps {
namespace {

// A server out of reach, for now or for good.
bool Transient(const absl::Status& status) { return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status); }

// The backup's copies of every segment's range `range`, as the primary's Stats would give them.
std::optional<v1::StatsResponse> ViewOf(const v1::JobConfig& config, const ShardMap& map, uint32_t range,
                                        const v1::StatsResponse& backup) {
  v1::StatsResponse view;
  view.set_server_index(range);
  view.set_model_fingerprint(backup.model_fingerprint());
  view.set_shard_fingerprint(backup.shard_fingerprint());
  view.set_incarnation(backup.incarnation());
  for (int k = 0; k < map.num_segments(); ++k) {
    auto copy = std::find_if(backup.replicas().begin(), backup.replicas().end(), [&](const v1::ReplicaStats& r) {
      // A filled copy has taken a record, or a state with updates: a
      // primary started again stamps its first state with record 0.
      return r.segment() == static_cast<uint32_t>(k) && r.range() == range && (r.seq() > 0 || r.updates() > 0);
    });
    if (copy == backup.replicas().end()) return std::nullopt;  // a copy not yet filled
    v1::SegmentStats* segment = view.add_segments();
    segment->set_segment(static_cast<uint32_t>(k));
    segment->set_name(config.model().segments(k).name());
    segment->set_offset(map.range(k, range).offset);
    segment->set_count(map.range(k, range).count);
    segment->set_clock(copy->clock());
    segment->set_updates(copy->updates());
  }
  return view;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelReader>> ModelReader::Connect(const v1::JobConfig& config,
                                                                  const std::vector<std::string>& addresses) {
  absl::StatusOr<ShardMap> map = MapOfServers(config, addresses);
  if (!map.ok()) return map.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = LoadChannelCredentials(config.security());
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(std::min<uint64_t>(config.cluster().max_message_bytes(), INT32_MAX)));
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs;
  for (const std::string& address : addresses) {
    stubs.push_back(v1::ParameterServer::NewStub(grpc::CreateCustomChannel(address, *credentials, args)));
  }
  return std::unique_ptr<ModelReader>(new ModelReader(config, *std::move(map), addresses, std::move(stubs)));
}

ModelReader::ModelReader(const v1::JobConfig& config, ShardMap map, std::vector<std::string> addresses,
                         std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs)
    : config_(config),
      map_(std::move(map)),
      addresses_(std::move(addresses)),
      stubs_(std::move(stubs)),
      deadline_(absl::Milliseconds(config.cluster().rpc_deadline_ms())) {}

void ModelReader::StandIn(uint32_t i, uint32_t from, bool taken_over, const std::string& why) {
  if (!out_of_reach_.insert(i).second) return;
  SEGPS_LOG_WARNING << "server " << i << " at " << addresses_[i] << " is out of reach (" << why
                    << "); its ranges are read from server " << from
                    << (taken_over ? ", which took them over" : "'s copy") << " (cluster.replicas "
                    << map_.replicas() << ")";
}

template <typename T>
absl::StatusOr<T> ModelReader::FromHolders(uint32_t i,
                                           absl::FunctionRef<absl::StatusOr<T>(uint32_t, bool)> attempt) {
  const absl::Time give_up = absl::Now() + 2 * deadline_;
  absl::Duration delay = absl::Milliseconds(100);
  while (true) {
    std::string why;  // the primary's failure
    absl::Status last = absl::UnavailableError("no holder was asked");
    for (const uint32_t holder : map_.holders(i)) {
      if (holder == i && out_of_reach_.count(i) > 0) continue;  // read from a stand-in since
      if (holder != i) {
        absl::StatusOr<T> served = attempt(holder, true);
        if (served.ok()) StandIn(i, holder, true, why);
        if (served.ok()) return served;
      }
      absl::StatusOr<T> got = attempt(holder, false);
      if (got.ok() && holder != i) StandIn(i, holder, false, why);
      if (got.ok() || !Transient(got.status())) return got;
      if (holder == i) why = std::string(got.status().message());
      last = got.status();
    }
    if (absl::Now() + delay > give_up) return last;
    absl::SleepFor(delay);
    delay = std::min(delay * 2, absl::Seconds(1));
  }
}

absl::StatusOr<v1::StatsResponse> ModelReader::StatsOf(uint32_t i) {
  absl::StatusOr<v1::StatsResponse> stats =
      FromHolders<v1::StatsResponse>(i, [&](uint32_t holder, bool taken_over) -> absl::StatusOr<v1::StatsResponse> {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
        if (taken_over) context.AddMetadata(kServerHeader, absl::StrCat(i));
        v1::StatsResponse stats;
        const grpc::Status status = stubs_[holder]->Stats(&context, v1::StatsRequest(), &stats);
        if (!status.ok()) return FromGrpcStatus(status);
        if (holder == i || taken_over) return stats;
        std::optional<v1::StatsResponse> view = ViewOf(config_, map_, i, stats);
        if (!view.has_value()) {
          return absl::UnavailableError(absl::StrCat("server ", holder, "'s copy of its range holds no state yet"));
        }
        return *std::move(view);
      });
  if (stats.ok()) return stats;
  return absl::Status(stats.status().code(), absl::StrCat("Stats of server ", i, " at ", addresses_[i], ": ",
                                                          stats.status().message()));
}

absl::StatusOr<std::vector<v1::StatsResponse>> ModelReader::Stats() {
  std::vector<v1::StatsResponse> servers;
  for (uint32_t i = 0; i < map_.num_servers(); ++i) {
    absl::StatusOr<v1::StatsResponse> stats = StatsOf(i);
    if (!stats.ok()) return stats.status();
    servers.push_back(*std::move(stats));
  }
  return servers;
}

absl::Status ModelReader::PullRange(uint32_t holder, bool taken_over, int segment, uint32_t range,
                                    absl::Span<float> out) {
  const Range extent = map_.range(segment, range);
  const uint64_t per_call = std::max<uint64_t>(config_.cluster().chunk_bytes() / sizeof(float), 1024);
  for (uint64_t offset = extent.offset; offset < extent.end(); offset += per_call) {
    v1::PullRequest request;
    request.set_segment(static_cast<uint32_t>(segment));
    request.set_reader(true);
    request.set_offset(offset);
    request.set_count(std::min(per_call, extent.end() - offset));
    request.set_dtype(v1::FLOAT32);
    if (holder != range && !taken_over) request.set_copy_of(range);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
    if (taken_over) context.AddMetadata(kServerHeader, absl::StrCat(range));
    v1::PullResponse response;
    const grpc::Status status = stubs_[holder]->Pull(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    const v1::TensorSlice& values = response.values();
    if (values.dtype() != v1::FLOAT32 || values.offset() != request.offset() || values.count() != request.count() ||
        values.data().size() != request.count() * sizeof(float)) {
      return absl::DataLossError(absl::StrCat("Pull of segment ", segment, " [", request.offset(), ", ",
                                              request.offset() + request.count(), ") from server ", holder,
                                              ": the reply holds other elements"));
    }
    DecodeFloat32(values, out.subspan(offset, request.count()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> ModelReader::Pull() {
  std::vector<std::vector<float>> params;
  for (int k = 0; k < map_.num_segments(); ++k) {
    std::vector<float>& values = params.emplace_back(map_.segment_size(k));
    for (uint32_t i = 0; i < map_.num_servers(); ++i) {
      const absl::StatusOr<bool> pulled = FromHolders<bool>(i, [&](uint32_t holder, bool taken_over) -> absl::StatusOr<bool> {
        SEGPS_RETURN_IF_ERROR(PullRange(holder, taken_over, k, i, absl::MakeSpan(values)));
        return true;
      });
      if (!pulled.ok()) {
        return absl::Status(pulled.status().code(),
                            absl::StrCat("reading segment ", config_.model().segments(k).name(), "'s range on server ",
                                         i, " at ", addresses_[i], ": ", pulled.status().message()));
      }
    }
  }
  return params;
}

}  // namespace segps
