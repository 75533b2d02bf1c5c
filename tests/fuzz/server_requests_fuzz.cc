// libFuzzer target for every decoder of network bytes and the server core
// behind them: an input is a sequence of messages as they arrive on the
// wire, each decoded the way its receiver decodes it and, for requests,
// served by a ParameterServer (transport-free core, fake clock) holding two
// live registrations.
//
// Record format, repeated until the input ends:
//   kind (1 byte)  split (1 byte)  length (2 bytes, little-endian)  bytes
// kind selects the message (see Kind), split is where the bytes are cut
// into two gRPC slices (so that tensor data straddles slices, as it does on
// a socket). A record asks for the harness's own registration by naming
// worker 1 or 2 with an empty secret; a Register whose model fingerprint is
// "=" gets the real fingerprints. Everything else reaches the server as the
// fuzzer wrote it.
//
// Records of the replication service (a backup's stream, Fetch, a copy's
// read) go to a backup of server 0's range, filled with its state.
//
// Built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/run.sh;
// in every other build it is linked with replay_main.cc and replays the
// committed corpus as a unit test.
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/tensor_wire.h"
#include "common/tensor_wire_grpc.h"
#include "server/parameter_server.h"
#include "server/replica_log.h"
#include "server/replica_wire.h"

namespace segps {
namespace {

enum Kind : uint8_t {
  kRegister = 0,
  kPull,
  kPush,
  kHeartbeat,
  kLeave,
  kStats,
  kRollback,
  kPullReply,  // a server's PullResponse as a worker decodes it
  kPushReply,  // a server's PushResponse as a worker decodes it
  kTick,       // time moves on by `split` milliseconds
  // Server to server (cluster.replicas), served by a backup of range 0:
  kReplicaRecord,  // a record on a Replicate stream from server 0
  kFetch,          // a Fetch of a copy
  kCopyPull,       // a PullRequest to the backup, as a reader reads a copy (copy_of)
  kKinds
};

// Two segments over two servers (this is server 0: it also plans shares),
// bounded staleness, balanced shares, two workers each. The same job with
// two copies of each range (cluster.replicas 2) for the backup: server 1,
// holding server 0's range from its state on.
constexpr char kConfig[] = R"pb(
cluster { num_servers: 2 chunk_bytes: 4096 max_waiting_calls: 8 }
model {
  input_width: 5
  num_classes: 3
  segments { name: "a" layers { units: 4 activation: TANH } layers { units: 3 activation: SOFTMAX } }
  segments { name: "b" staleness: 0 layers { units: 3 activation: SOFTMAX } }
}
optimizer { kind: ADAM }
training { staleness: 1 workers_per_segment: 2 batch_size: 8 balance { every_clocks: 2 } }
data { source: SYNTHETIC_SEED }
)pb";

grpc::ByteBuffer Buffer(absl::string_view bytes, size_t split) {
  split = std::min(split, bytes.size());
  grpc::Slice pieces[2] = {grpc::Slice(bytes.data(), split),
                           grpc::Slice(bytes.data() + split, bytes.size() - split)};
  return grpc::ByteBuffer(pieces, 2);
}

// As the service parses a unary request.
template <typename Message>
bool Parse(const grpc::ByteBuffer& bytes, Message* message) {
  grpc::ByteBuffer copy(bytes);
  grpc::ProtoBufferReader reader(&copy);
  return message->ParseFromZeroCopyStream(&reader);
}

// As a worker takes a reply's values: decode, validate against the chunk it
// asked for, widen.
template <typename Response>
void TakeReply(const grpc::ByteBuffer& bytes, int field) {
  Response header;
  v1::TensorSlice tensor;
  Payload values;
  if (!DecodeTensorMessage(bytes, field, &header, &tensor, &values).ok()) return;
  const uint64_t offset = tensor.offset() % 64, count = tensor.count() % 64;
  if (!ValidateTensorSlice(tensor, values.size(), offset, count, "reply values").ok()) return;
  std::vector<float> landed(tensor.count());
  if (!tensor.has_indices()) values.CopyTo(tensor.dtype(), absl::MakeSpan(landed));
  DenseView view(tensor, values);
  view.FirstNonFinite();
  view.ForEachFloatBlock(0, view.count(), [](size_t, absl::Span<const float>) {});
}

class Harness {
 public:
  Harness() : config_(*ParseConfig(kConfig, "fuzz")) {
    ServerOptions options;
    options.clock = &clock_;
    options.tick = absl::ZeroDuration();
    server_ = *ParameterServer::Create(config_, 0, options);
    for (uint32_t segment = 0; segment < 2; ++segment) {
      v1::RegisterRequest request;
      request.set_segment(segment);
      request.set_model_fingerprint("=");
      v1::RegisterResponse response;
      Fill(&request);
      if (!server_->Register(request, &response).ok()) abort();
      secrets_.push_back(response.registration_secret());
    }
    v1::JobConfig replicated = config_;
    replicated.mutable_cluster()->set_replicas(2);
    primary_ = *ParameterServer::Create(replicated, 0, options);
    backup_ = *ParameterServer::Create(replicated, 1, options);
    primary_->SyncReplicas(1);  // each range's whole state, as a link opening sends it
    for (const auto& log : primary_->replica_logs()) {
      for (const ReplicaLog::Record& record : log->Take(1)) {
        if (!backup_->TakeReplica(0, record->record, record->gradient).ok()) abort();
      }
    }
  }
  ~Harness() {
    // Every parked call ends (at its deadline) before the server goes.
    clock_.Advance(absl::Hours(1));
    server_->Tick();
    server_->Drain();
    primary_->Drain();
    backup_->Drain();
  }

  void Serve(uint8_t kind, uint8_t split, absl::string_view bytes) {
    const grpc::ByteBuffer buffer = Buffer(bytes, split);
    const absl::Time deadline = clock_.Now() + absl::Milliseconds(50);
    switch (kind % kKinds) {
      case kRegister: {
        v1::RegisterRequest request;
        v1::RegisterResponse response;
        if (Parse(buffer, &request) && Fill(&request)) server_->Register(request, &response).IgnoreError();
        break;
      }
      case kPull: {
        v1::PullRequest request;
        if (!Parse(buffer, &request)) break;
        Own(request.worker_id(), request.mutable_registration_secret());
        auto response = std::make_shared<v1::PullResponse>();
        server_->Pull(request, deadline, [](absl::Span<const float>, v1::DType) {}, response.get(),
                      [response](absl::Status) {});
        break;
      }
      case kPush: {
        v1::PushRequest header;
        v1::TensorSlice tensor;
        Payload data;
        if (!DecodeTensorMessage(buffer, v1::PushRequest::kGradientFieldNumber, &header, &tensor, &data).ok()) break;
        *header.mutable_gradient() = std::move(tensor);
        Own(header.worker_id(), header.mutable_registration_secret());
        auto response = std::make_shared<v1::PushResponse>();
        server_->Push(header, std::move(data), deadline, [](absl::Span<const float>, v1::DType) {}, response.get(),
                      [response](absl::Status) {});
        break;
      }
      case kHeartbeat: {
        v1::HeartbeatRequest request;
        v1::HeartbeatResponse response;
        if (!Parse(buffer, &request)) break;
        Own(request.worker_id(), request.mutable_registration_secret());
        server_->Heartbeat(request, &response).IgnoreError();
        break;
      }
      case kLeave: {
        v1::LeaveRequest request;
        if (!Parse(buffer, &request)) break;
        Own(request.worker_id(), request.mutable_registration_secret());
        server_->Leave(request).IgnoreError();
        break;
      }
      case kStats: {
        v1::StatsRequest request;
        v1::StatsResponse response;
        if (Parse(buffer, &request)) server_->Stats(request, &response);
        break;
      }
      case kRollback: {
        v1::RollbackRequest request;
        v1::RollbackResponse response;
        if (!Parse(buffer, &request)) break;
        Own(request.worker_id(), request.mutable_registration_secret());
        server_->Rollback(request, &response).IgnoreError();
        break;
      }
      case kPullReply:
        TakeReply<v1::PullResponse>(buffer, v1::PullResponse::kValuesFieldNumber);
        break;
      case kPushReply:
        TakeReply<v1::PushResponse>(buffer, v1::PushResponse::kValuesFieldNumber);
        break;
      case kTick:
        clock_.Advance(absl::Milliseconds(split));
        server_->Tick();
        break;
      default:
        ServeReplica(kind % kKinds, buffer, deadline);
        break;
    }
  }

 private:
  void ServeReplica(uint8_t kind, const grpc::ByteBuffer& buffer, absl::Time deadline) {
    switch (kind) {
      case kReplicaRecord: {
        // As the Replicate stream takes it: the gradient's bytes left in the buffer.
        v1::ReplicaRecord record;
        Payload gradient;
        if (DecodeRecord(buffer, &record, &gradient).ok()) backup_->TakeReplica(0, record, gradient).IgnoreError();
        break;
      }
      case kFetch: {
        v1::FetchRequest request;
        if (Parse(buffer, &request)) backup_->Fetch(request).IgnoreError();
        break;
      }
      case kCopyPull: {
        v1::PullRequest request;
        if (!Parse(buffer, &request)) break;
        auto response = std::make_shared<v1::PullResponse>();
        backup_->Pull(request, deadline, [](absl::Span<const float>, v1::DType) {}, response.get(),
                      [response](absl::Status) {});
        break;
      }
      default:
        break;
    }
  }

  // The harness's own registration's secret where the fuzzer asks for it.
  void Own(uint64_t worker, std::string* secret) const {
    if (secret->empty() && worker >= 1 && worker <= secrets_.size()) *secret = secrets_[worker - 1];
  }
  bool Fill(v1::RegisterRequest* request) const {
    if (request->model_fingerprint() == "=") {
      request->set_model_fingerprint(ModelFingerprint(config_));
      request->set_shard_fingerprint(server_ ? server_->shard_map().fingerprint() : "");
    }
    return true;
  }

  const v1::JobConfig config_;
  FakeClock clock_;
  std::unique_ptr<ParameterServer> server_;
  std::unique_ptr<ParameterServer> primary_, backup_;  // replicas 2: server 0's range and its copy
  std::vector<std::string> secrets_;
};

}  // namespace
}  // namespace segps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool routed = (segps::RouteProtobufLogs(), true);  // as segps-server does
  (void)routed;
  segps::Harness harness;
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = size;
  while (left >= 4) {
    const uint8_t kind = static_cast<uint8_t>(p[0]), split = static_cast<uint8_t>(p[1]);
    const size_t length = std::min<size_t>(static_cast<uint8_t>(p[2]) | (static_cast<uint8_t>(p[3]) << 8), left - 4);
    harness.Serve(kind, split, absl::string_view(p + 4, length));
    p += 4 + length;
    left -= 4 + length;
  }
  return 0;
}
