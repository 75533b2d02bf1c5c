// A hostile client on the wire: while the teacher job trains (2 servers, 4
// workers, separate processes on loopback), a client that knows only the
// .proto files sends server 0 random and malformed requests on every method,
// unary and streaming, from a fixed seed. No call may get INTERNAL or
// UNKNOWN, every worker must finish, and the ensemble must reach its bar.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "segps/v1/parameter_server.pb.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

constexpr const char* kUnary[] = {"Register", "Pull", "Push", "Heartbeat", "Leave", "Stats", "Rollback"};
constexpr const char* kStreams[] = {"PushStream", "PullStream"};

class HostileClient {
 public:
  HostileClient(const std::string& address, uint32_t seed)
      : stub_(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())), rng_(seed) {}

  // One random call: a method, and one request (a stream: a few) for it.
  void Call() {
    const bool stream = Coin(0.15);
    const std::string method = stream ? kStreams[Below(2)] : kUnary[Below(7)];
    std::vector<std::string> requests;
    for (size_t i = 0, n = stream ? 1 + Below(4) : 1; i < n; ++i) requests.push_back(Request(method));
    const grpc::Status status = stream ? Stream(method, requests) : Unary(method, requests[0]);
    ++codes_[method][status.error_code()];
    if (status.error_code() == grpc::StatusCode::INTERNAL || status.error_code() == grpc::StatusCode::UNKNOWN) {
      ADD_FAILURE() << method << " answered " << status.error_code() << ": " << status.error_message();
    }
  }

  // Calls per method and status code.
  const std::map<std::string, std::map<grpc::StatusCode, int>>& codes() const { return codes_; }

 private:
  size_t Below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool Coin(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::string Bytes(size_t max) {
    std::string s(Below(max + 1), '\0');
    for (char& c : s) c = static_cast<char>(Below(256));
    return s;
  }
  // A small number most of the time (a real segment, rank, worker or
  // clock), anything now and then.
  uint64_t Number(uint64_t small) { return Coin(0.9) ? Below(small) : rng_(); }

  // A request for `method`: a well-formed message with random fields, the
  // same bytes damaged, or bytes that are no message at all.
  std::string Request(const std::string& method) {
    const double kind = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (kind < 0.15) return Bytes(64);
    std::string bytes = Message(method);
    if (kind < 0.35 && !bytes.empty()) {
      if (Coin(0.5)) {
        bytes.resize(Below(bytes.size()));  // cut short
      } else {
        for (size_t i = 0, n = 1 + Below(4); i < n; ++i) bytes[Below(bytes.size())] ^= static_cast<char>(1 + Below(255));
      }
    }
    return bytes;
  }

  v1::TensorSlice Tensor() {
    v1::TensorSlice t;
    t.set_offset(Number(4000));
    t.set_count(Number(4000));
    t.set_dtype(static_cast<v1::DType>(Below(5)));
    const size_t width = t.dtype() == v1::FLOAT32 ? 4 : 2;
    t.set_data(Coin(0.5) ? std::string(t.count() * width % 20000, '\0') : Bytes(256));
    if (Coin(0.2)) t.set_indices(Bytes(64));
    return t;
  }

  std::string Message(const std::string& method) {
    if (method == "Register") {
      v1::RegisterRequest r;
      r.set_segment(Number(3));
      r.set_rank(Number(3));
      r.set_model_fingerprint(Bytes(16));
      r.set_shard_fingerprint(Bytes(16));
      r.set_any_rank(Coin(0.3));
      if (Coin(0.3)) r.set_join_clock(Number(2000));
      return r.SerializeAsString();
    }
    if (method == "Pull" || method == "PullStream") {
      v1::PullRequest r;
      r.set_segment(Number(3));
      r.set_reader(Coin(0.6));
      if (!r.reader() || Coin(0.2)) r.set_worker_id(Number(40));
      r.set_clock(Number(2000));
      r.set_offset(Coin(0.5) ? 0 : Number(4000));
      r.set_count(Coin(0.5) ? 0 : Number(4000));
      r.set_dtype(static_cast<v1::DType>(Below(5)));
      if (Coin(0.5)) r.set_registration_secret(Bytes(16));
      return r.SerializeAsString();
    }
    if (method == "Push" || method == "PushStream") {
      v1::PushRequest r;
      r.set_segment(Number(3));
      r.set_worker_id(Number(40));
      r.set_clock(Number(2000));
      *r.mutable_gradient() = Tensor();
      r.set_pull(Coin(0.5));
      if (Coin(0.5)) r.set_registration_secret(Bytes(16));
      if (Coin(0.5)) r.set_samples(Number(200));
      r.set_samples_per_second(static_cast<float>(Number(100000)));
      return r.SerializeAsString();
    }
    if (method == "Heartbeat") {
      v1::HeartbeatRequest r;
      r.set_worker_id(Number(40));
      r.set_registration_secret(Bytes(16));
      return r.SerializeAsString();
    }
    if (method == "Leave") {
      v1::LeaveRequest r;
      r.set_worker_id(Number(40));
      r.set_registration_secret(Bytes(16));
      return r.SerializeAsString();
    }
    if (method == "Rollback") {
      v1::RollbackRequest r;
      r.set_segment(Number(3));
      r.set_worker_id(Number(40));
      r.set_registration_secret(Bytes(16));
      r.set_clock(Number(2000));
      r.set_generation(Number(4));
      return r.SerializeAsString();
    }
    return v1::StatsRequest().SerializeAsString();
  }

  static grpc::ByteBuffer Buffer(const std::string& bytes) {
    grpc::Slice slice(bytes);
    return grpc::ByteBuffer(&slice, 1);
  }
  static std::string Path(const std::string& method) { return "/segps.v1.ParameterServer/" + method; }

  grpc::Status Unary(const std::string& method, const std::string& bytes) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::CompletionQueue cq;
    grpc::ByteBuffer request = Buffer(bytes), reply;
    grpc::Status status;
    auto call = stub_.PrepareUnaryCall(&context, Path(method), request, &cq);
    call->StartCall();
    call->Finish(&reply, &status, this);
    Next(&cq);
    return status;
  }

  // Writes each request and reads its reply until one fails, then ends the stream.
  grpc::Status Stream(const std::string& method, const std::vector<std::string>& requests) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::CompletionQueue cq;
    auto call = stub_.PrepareCall(&context, Path(method), &cq);
    call->StartCall(this);
    bool ok = Next(&cq);
    for (size_t i = 0; ok && i < requests.size(); ++i) {
      const grpc::ByteBuffer request = Buffer(requests[i]);
      call->Write(request, this);
      grpc::ByteBuffer reply;
      ok = Next(&cq);
      if (ok) {
        call->Read(&reply, this);
        ok = Next(&cq);
      }
    }
    if (ok) {
      call->WritesDone(this);
      Next(&cq);
    }
    grpc::Status status;
    call->Finish(&status, this);
    Next(&cq);
    return status;
  }

  static bool Next(grpc::CompletionQueue* cq) {
    void* tag;
    bool ok = false;
    EXPECT_TRUE(cq->Next(&tag, &ok));
    return ok;
  }

  grpc::GenericStub stub_;
  std::mt19937_64 rng_;
  std::map<std::string, std::map<grpc::StatusCode, int>> codes_;
};

TEST(WireFuzz, RandomAndMalformedCallsOnEveryMethodWhileTheTeacherJobTrainsToItsBar) {
  const std::string dir = MakeTempDir();
  const std::string config = dir + "/teacher.pbtxt";
  WriteFile(config, ReadFile(std::string(SEGPS_SOURCE_DIR) + "/deploy/configs/teacher.pbtxt"));
  ServerProcesses servers = StartServers(config, 2);
  ASSERT_TRUE(servers.ok()) << servers.Output();

  std::atomic<bool> trained{false};
  HostileClient hostile(servers.addresses[0], 20261204);
  int calls = 0;
  std::thread fuzz([&] {
    const absl::Time give_up = absl::Now() + absl::Minutes(3);
    while ((!trained.load() || calls < 2000) && absl::Now() < give_up) {
      hostile.Call();
      ++calls;
    }
  });

  std::vector<std::unique_ptr<Subprocess>> workers;
  for (const char* segment : {"relu64", "tanh128"}) {
    for (int rank = 0; rank < 2; ++rank) {
      workers.push_back(Subprocess::Start({BinaryPath("segps-worker"), "--config", config, "--segment", segment,
                                           "--rank", std::to_string(rank), "--servers", servers.Joined()}));
    }
  }
  for (auto& worker : workers) {
    std::optional<int> status = worker->Wait(absl::Minutes(4));
    EXPECT_TRUE(status.has_value() && ExitedOk(*status)) << worker->output();
  }
  trained = true;
  fuzz.join();

  std::unique_ptr<Subprocess> eval =
      Subprocess::Start({BinaryPath("segps-eval"), "--config", config, "--servers", servers.Joined()});
  std::optional<int> status = eval->Wait(absl::Minutes(2));
  ASSERT_TRUE(status.has_value() && ExitedOk(*status)) << eval->output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(eval->output(), m, std::regex("ENSEMBLE.* accuracy *([0-9.]+)%"))) << eval->output();
  EXPECT_GT(std::stod(m[1]), 90.0) << eval->output();

  // The client reached past parsing: every method was called, and the
  // answers include successes and each kind of refusal a stranger earns.
  std::map<grpc::StatusCode, int> all;
  std::string table;
  for (const auto& [method, codes] : hostile.codes()) {
    absl::StrAppend(&table, method, ":");
    for (const auto& [code, n] : codes) {
      all[code] += n;
      absl::StrAppend(&table, " ", code, "x", n);
    }
    absl::StrAppend(&table, "\n");
  }
  std::printf("%d hostile calls (status code x calls):\n%s", calls, table.c_str());
  EXPECT_EQ(hostile.codes().size(), 9u) << table;
  for (grpc::StatusCode code : {grpc::StatusCode::OK, grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::NOT_FOUND,
                                grpc::StatusCode::FAILED_PRECONDITION}) {
    EXPECT_GT(all[code], 0) << "no call answered " << code << "\n" << table;
  }
}

}  // namespace
}  // namespace segps
