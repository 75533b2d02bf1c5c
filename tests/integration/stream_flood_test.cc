// Floods against a real server process on loopback: of silent streams and
// unary calls (the server holds at most one host's share of them, ends the
// calls that send no request at their deadline, and gives the memory back
// once the flood ends), and of connections beyond its
// file descriptors (once they close, the server serves again by itself).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/sanitizers.h"
#include "common/tensor_wire_grpc.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

// Resident memory of process `pid` in MiB (/proc).
double RssMiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

// The server's open calls (streams, unary calls), or nothing while it
// refuses the probe (its host's share is taken).
std::optional<std::pair<uint32_t, uint32_t>> OpenCalls(v1::ParameterServer::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse stats;
  if (!stub.Stats(&context, v1::StatsRequest(), &stats).ok()) return std::nullopt;
  return std::pair{stats.open_streams(), stats.open_unary_calls()};
}

// `connections` x `each` calls of `method` that send their headers and no
// request, and how they end.
class SilentCalls {
 public:
  SilentCalls(const std::string& address, const char* method, int connections, int each) {
    for (int c = 0; c < connections; ++c) {
      grpc::ChannelArguments args;
      args.SetInt("segps.test.connection", c);  // a connection each
      stubs_.push_back(std::make_unique<grpc::GenericStub>(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
      for (int i = 0; i < each; ++i) {
        calls_.push_back(std::make_unique<Call>());
        Call& call = *calls_.back();
        call.io = stubs_.back()->PrepareCall(&call.context, method, &queue_);
        call.io->StartCall(&kStarted);
        call.io->Finish(&call.status, &call);
      }
    }
  }
  ~SilentCalls() {
    for (auto& call : calls_) call->context.TryCancel();
    while (ended_ < calls_.size() && Next(absl::Minutes(2))) {
    }
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
  }

  // Waits until `count` calls have ended or `within` passes; how many have.
  size_t WaitEnded(size_t count, absl::Duration within) {
    const absl::Time give_up = absl::Now() + within;
    while (ended_ < count && Next(give_up - absl::Now())) {
    }
    return ended_;
  }
  size_t size() const { return calls_.size(); }
  // Calls that ended with `code`, and when the first of them did.
  size_t Ended(grpc::StatusCode code) const { return absl::c_count(codes_, code); }
  absl::Time first_end(grpc::StatusCode code) const { return first_end_.at(code); }
  const grpc::Status& any(grpc::StatusCode code) const { return example_.at(code); }

 private:
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> io;
    grpc::Status status;
  };
  static inline char kStarted = 0;  // tags every call's start; a Call* tags its end
  bool Next(absl::Duration within) {
    void* tag = nullptr;
    bool ok = false;
    if (within <= absl::ZeroDuration() ||
        queue_.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + within)) != grpc::CompletionQueue::GOT_EVENT) {
      return false;
    }
    if (tag == &kStarted) return true;
    const Call& call = *static_cast<const Call*>(tag);
    ++ended_;
    codes_.push_back(call.status.error_code());
    first_end_.try_emplace(call.status.error_code(), absl::Now());
    example_.try_emplace(call.status.error_code(), call.status);
    return true;
  }

  grpc::CompletionQueue queue_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::vector<std::unique_ptr<Call>> calls_;
  size_t ended_ = 0;
  std::vector<grpc::StatusCode> codes_;
  std::map<grpc::StatusCode, absl::Time> first_end_;
  std::map<grpc::StatusCode, grpc::Status> example_;
};

constexpr char kTeacher[] = SEGPS_SOURCE_DIR "/deploy/configs/teacher.pbtxt";

// Waits until the server holds no call but the probe; its RSS then.
double RssOnceQuiet(ServerProcesses& servers, v1::ParameterServer::Stub& probe) {
  // The probe's own call counts until the server has finished it.
  std::optional<std::pair<uint32_t, uint32_t>> open;
  for (const absl::Time give_up = absl::Now() + absl::Minutes(2); absl::Now() < give_up;) {
    open = OpenCalls(probe);
    if (open == std::pair<uint32_t, uint32_t>{0, 1}) break;
    servers.processes[0]->Wait(absl::Milliseconds(50));  // reads its output meanwhile
  }
  EXPECT_EQ(open, (std::pair<uint32_t, uint32_t>{0, 1}));
  return RssMiB(servers.processes[0]->pid());
}

// One host's share of open calls is half of cluster.max_open_calls (4096):
// the rest of a flood from one host is refused at its headers (a probe from
// that host too, while the flood lasts).
TEST(StreamFlood, SilentStreamsOverManyConnectionsAreCappedAndTheirMemoryReturns) {
#if defined(SEGPS_TSAN)
  GTEST_SKIP() << "under ThreadSanitizer a server takes minutes over 8,000 streams (930 MiB, 2 minutes to end "
                  "them): the cap is checked in the other builds";
#endif
  ServerProcesses servers = StartServers(kTeacher, 2);
  ASSERT_TRUE(servers.ok()) << servers.Output();
  auto probe = v1::ParameterServer::NewStub(
      grpc::CreateChannel(servers.addresses[0], grpc::InsecureChannelCredentials()));
  const double resting = RssOnceQuiet(servers, *probe);
  double during = 0;
  size_t refused = 0;
  {
    SilentCalls flood(servers.addresses[0], kPullStreamMethod, 40, 200);
    EXPECT_EQ(flood.WaitEnded(flood.size() - 2048, absl::Minutes(1)), flood.size() - 2048);
    refused = flood.Ended(grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(refused, flood.size() - 2048);
    EXPECT_EQ(flood.WaitEnded(flood.size(), absl::Seconds(1)), flood.size() - 2048) << "a held stream ended";
    EXPECT_EQ(OpenCalls(*probe), std::nullopt) << "the probe's host holds its share";
    during = RssMiB(servers.processes[0]->pid());
  }
  const double after = RssOnceQuiet(servers, *probe);
  std::cout << "server RSS " << resting << " MiB at rest, " << during << " MiB holding 2048 silent streams (" << refused
            << " refused), " << after << " MiB after they closed" << std::endl;
  // Measured here: 13 MiB at rest, 60 MiB holding 2048, 30 MiB after (with
  // no server-wide cap, no host share and no trim: 147 MiB holding all 8000,
  // 147 after).
#if !defined(SEGPS_ASAN) && !defined(SEGPS_TSAN)  // their allocators keep what they free
  EXPECT_LT(during - resting, 160.0);
  EXPECT_LT(after - resting, 40.0) << "the flood's memory stayed";
#endif
}

// Unary calls that send their headers and never their request: the server
// holds them from their headers (within the host's share) and ends them
// with DEADLINE_EXCEEDED once cluster.rpc_deadline_ms has passed.
TEST(StreamFlood, SilentUnaryCallsAreCappedAndEndedAtTheirDeadline) {
#if defined(SEGPS_TSAN)
  GTEST_SKIP() << "under ThreadSanitizer a server takes minutes over thousands of calls: checked in the other builds";
#endif
  const std::string dir = MakeTempDir();
  std::ifstream teacher(kTeacher);
  std::string config((std::istreambuf_iterator<char>(teacher)), std::istreambuf_iterator<char>());
  ASSERT_NE(config.find("lease_ms: 10000"), std::string::npos);
  config = absl::StrReplaceAll(config, {{"lease_ms: 10000", "lease_ms: 10000 rpc_deadline_ms: 4000"}});
  WriteFile(dir + "/job.pbtxt", config);
  ServerProcesses servers = StartServers(dir + "/job.pbtxt", 2);
  ASSERT_TRUE(servers.ok()) << servers.Output();
  auto probe = v1::ParameterServer::NewStub(
      grpc::CreateChannel(servers.addresses[0], grpc::InsecureChannelCredentials()));
  const double resting = RssOnceQuiet(servers, *probe);
  const absl::Time start = absl::Now();
  SilentCalls flood(servers.addresses[0], "/segps.v1.ParameterServer/Pull", 40, 100);
  EXPECT_EQ(flood.WaitEnded(flood.size() - 2048, absl::Seconds(30)), flood.size() - 2048);
  const double during = RssMiB(servers.processes[0]->pid());
  EXPECT_EQ(flood.Ended(grpc::StatusCode::RESOURCE_EXHAUSTED), flood.size() - 2048);
  EXPECT_EQ(flood.WaitEnded(flood.size(), absl::Minutes(1)), flood.size());
  ASSERT_EQ(flood.Ended(grpc::StatusCode::DEADLINE_EXCEEDED), 2048u);
  EXPECT_GE(flood.first_end(grpc::StatusCode::DEADLINE_EXCEEDED) - start, absl::Seconds(4)) << "ended early";
  EXPECT_THAT(flood.any(grpc::StatusCode::DEADLINE_EXCEEDED).error_message(),
              testing::HasSubstr("Pull: no request within cluster.rpc_deadline_ms"));
  const double after = RssOnceQuiet(servers, *probe);
  std::cout << "server RSS " << resting << " MiB at rest, " << during << " MiB holding 2048 silent unary calls, "
            << after << " MiB after their deadline" << std::endl;
#if !defined(SEGPS_ASAN)  // its allocator keeps what it frees
  EXPECT_LT(during - resting, 160.0);
  EXPECT_LT(after - resting, 40.0) << "the flood's memory stayed";
#endif
}

// A server run with 40 descriptors: 60 connections exhaust them, and gRPC
// abandons its listener ("Failed accept4: Too many open files", which the
// server reads in gRPC's log); once they close, the server starts its
// listener again on the same port and answers calls.
TEST(StreamFlood, AServerOutOfDescriptorsServesAgainOnceTheyAreFree) {
#if defined(SEGPS_ASAN) || defined(SEGPS_TSAN)
  GTEST_SKIP() << "the sanitizers' runtimes need descriptors of their own (UBSan's checks open a pipe): a server "
                  "starved of them reports its runtime's failure, not its own";
#endif
  std::unique_ptr<Subprocess> server = Subprocess::Start(
      {"/bin/bash", "-c", "ulimit -n 40 && exec " + BinaryPath("segps-server") + " --config " + kTeacher +
                              " --index 0 --listen 127.0.0.1:0"});
  const std::optional<std::string> listening = server->WaitForLine("segps-server listening on ", absl::Minutes(1));
  ASSERT_TRUE(listening.has_value()) << server->output();
  const std::string address = listening->substr(listening->rfind(' ') + 1);
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::vector<int> flood;
  for (int i = 0; i < 60; ++i) {
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    flood.push_back(fd);
  }
  EXPECT_TRUE(server->WaitForLine("Too many open files", absl::Seconds(30)).has_value()) << server->output();
  for (int fd : flood) close(fd);
  const std::optional<std::string> again = server->WaitForLine("listening again on", absl::Seconds(30));
  ASSERT_TRUE(again.has_value()) << server->output();
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(address.substr(0, address.find_first_of(" \n")), grpc::InsecureChannelCredentials()));
  EXPECT_NE(OpenCalls(*stub), std::nullopt);  // answers
  server->Signal(SIGTERM);
  EXPECT_TRUE(server->Wait(absl::Seconds(30)).has_value());
}

}  // namespace
}  // namespace segps
