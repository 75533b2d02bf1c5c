// The seed inputs of server_requests_fuzz.cc: one record of each kind as a
// well-behaved peer sends it, tensors in every dtype, dense and sparse, and
// a few sequences (register, push, pull, tick). `segps-fuzz-replay
// --write_seeds DIR` writes them; tests/fuzz/corpus holds them and what the
// fuzzer found from them.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/half_float.h"
#include "common/tensor_wire.h"
#include "common/tensor_wire_grpc.h"
#include "segps/v1/parameter_server.pb.h"
#include "segps/v1/replication.pb.h"

namespace segps {
namespace {

// Matches the harness: kinds, worker ids 1 (segment 0) and 2 (segment 1),
// server 0's range of segment 0 is [0, 20).
enum Kind : uint8_t {
  kRegister, kPull, kPush, kHeartbeat, kLeave, kStats, kRollback, kPullReply, kPushReply, kTick,
  kReplicaRecord, kFetch, kCopyPull
};
constexpr uint64_t kRange = 20;  // replicas 2 keeps the same ranges

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string Record(Kind kind, const std::string& bytes, uint8_t split = 0) {
  std::string r;
  r.push_back(static_cast<char>(kind));
  r.push_back(static_cast<char>(split));
  r.push_back(static_cast<char>(bytes.size() & 0xff));
  r.push_back(static_cast<char>(bytes.size() >> 8));
  return r + bytes;
}

// A tensor message as the real sender builds it: header plus data slice.
template <typename Message>
std::string WithTensor(const Message& header, int field, v1::DType dtype, uint64_t count, bool sparse) {
  std::vector<float> values(count);
  for (uint64_t i = 0; i < count; ++i) values[i] = 0.01f * static_cast<float>(i + 1);
  v1::TensorSlice tensor;
  tensor.set_offset(0);
  tensor.set_count(count);
  tensor.set_dtype(dtype);
  if (sparse) {
    std::vector<uint32_t> at = {1, 5, 7};
    tensor.set_indices(std::string(reinterpret_cast<const char*>(at.data()), at.size() * sizeof(uint32_t)));
    values.resize(at.size());
  }
  return Flatten(EncodeTensorMessage(header, field, tensor, EncodeValues(values, dtype)));
}

std::string Push(uint64_t clock, v1::DType dtype, bool sparse, bool pull) {
  v1::PushRequest p;
  p.set_segment(0);
  p.set_worker_id(1);
  p.set_clock(clock);
  p.set_pull(pull);
  p.set_samples(8);
  p.set_samples_per_second(1000);
  return Record(kPush, WithTensor(p, v1::PushRequest::kGradientFieldNumber, dtype, kRange, sparse), 37);
}

std::string Pull(uint64_t worker, uint64_t clock, bool reader) {
  v1::PullRequest p;
  p.set_segment(worker == 2 ? 1 : 0);
  p.set_worker_id(worker);
  p.set_clock(clock);
  p.set_reader(reader);
  return Record(kPull, p.SerializeAsString());
}

}  // namespace

std::vector<std::pair<std::string, std::string>> FuzzSeeds() {
  std::vector<std::pair<std::string, std::string>> seeds;
  v1::RegisterRequest reg;
  reg.set_segment(0);
  reg.set_rank(1);
  reg.set_model_fingerprint("=");
  seeds.emplace_back("register", Record(kRegister, reg.SerializeAsString()));
  reg.set_any_rank(true);
  reg.set_join_clock(3);
  seeds.emplace_back("register_any_rank", Record(kRegister, reg.SerializeAsString()));
  seeds.emplace_back("pull", Pull(1, 0, false));
  seeds.emplace_back("pull_reader", Pull(0, 0, true));
  const std::pair<const char*, v1::DType> dtypes[] = {
      {"float32", v1::FLOAT32}, {"bfloat16", v1::BFLOAT16}, {"float16", v1::FLOAT16}};
  for (const auto& [name, dtype] : dtypes) {
    seeds.emplace_back(std::string("push_") + name, Push(0, dtype, false, false));
    seeds.emplace_back(std::string("push_sparse_") + name, Push(0, dtype, true, false));
    v1::PullResponse reply;
    reply.set_clock(1);
    seeds.emplace_back(std::string("pull_reply_") + name,
                       Record(kPullReply, WithTensor(reply, v1::PullResponse::kValuesFieldNumber, dtype, 16, false), 9));
    v1::PushResponse pushed;
    pushed.set_applied(true);
    seeds.emplace_back(std::string("push_reply_") + name,
                       Record(kPushReply, WithTensor(pushed, v1::PushResponse::kValuesFieldNumber, dtype, 16, false), 9));
  }
  v1::HeartbeatRequest beat;
  beat.set_worker_id(1);
  seeds.emplace_back("heartbeat", Record(kHeartbeat, beat.SerializeAsString()));
  v1::LeaveRequest leave;
  leave.set_worker_id(2);
  seeds.emplace_back("leave", Record(kLeave, leave.SerializeAsString()));
  seeds.emplace_back("stats", Record(kStats, v1::StatsRequest().SerializeAsString()));
  v1::RollbackRequest rollback;
  rollback.set_worker_id(1);
  rollback.set_segment(0);
  seeds.emplace_back("rollback", Record(kRollback, rollback.SerializeAsString()));
  // Replication: a push record following the state (seq 1), a record out
  // of order, a Fetch, and a reader's read of the copy.
  v1::ReplicaRecord record;
  record.set_segment(0);
  record.set_range(0);
  record.set_seq(1);
  v1::AppliedPush* applied = record.mutable_push();
  applied->set_rank(0);
  applied->set_step(1);
  applied->set_scale(1);
  std::vector<float> gradient(kRange, 0.5f);
  EncodeFloat32(gradient, 0, record.mutable_gradient());
  seeds.emplace_back("replica_push", Record(kReplicaRecord, record.SerializeAsString(), 11));
  record.set_seq(3);
  seeds.emplace_back("replica_gap", Record(kReplicaRecord, record.SerializeAsString()));
  v1::FetchRequest fetch;
  fetch.mutable_hello()->set_from_server(0);
  fetch.mutable_hello()->set_to_server(1);
  seeds.emplace_back("fetch", Record(kFetch, fetch.SerializeAsString()));
  v1::PullRequest copy;
  copy.set_reader(true);
  copy.set_copy_of(0);
  seeds.emplace_back("copy_pull", Record(kCopyPull, copy.SerializeAsString()));
  // Sequences: two steps of push-with-pull, a pull that parks and times out.
  seeds.emplace_back("steps", Push(0, v1::FLOAT32, false, true) + Push(1, v1::BFLOAT16, false, true) +
                                  Pull(1, 2, false) + Record(kTick, "", 60) + Pull(2, 0, false));
  seeds.emplace_back("parked_then_leave", Pull(1, 5, false) + Record(kLeave, leave.SerializeAsString()) +
                                              Record(kTick, "", 200) + Push(0, v1::FLOAT16, true, true));
  return seeds;
}

}  // namespace segps
