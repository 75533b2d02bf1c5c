#include "worker/train/pipeline_link.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "common/sync.h"
#include "common/tensor_wire.h"
#include "segps/v1/pipeline.grpc.pb.h"
#include "worker/train/link_messages.h"

namespace segps {
namespace {

// Messages (or the error that ended them) handed from a reading thread to
// the training thread.
template <typename T>
class Inbox {
 public:
  void Put(absl::StatusOr<T> item) {
    MutexLock lock(&mu_);
    items_.push_back(std::move(item));
    ready_.SignalAll();
  }
  // The next item, or DEADLINE_EXCEEDED naming `what` after `patience`.
  absl::StatusOr<T> Take(absl::Duration patience, const std::string& what) {
    MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + patience;
    while (items_.empty() && absl::Now() < deadline) ready_.WaitWithDeadline(&mu_, deadline);
    if (items_.empty()) {
      return absl::DeadlineExceededError(absl::StrCat("no message from ", what, " within ",
                                                      absl::FormatDuration(patience)));
    }
    absl::StatusOr<T> item = std::move(items_.front());
    // An error stays, for every later Take.
    if (item.ok()) items_.pop_front();
    return item;
  }

 private:
  Mutex mu_;
  CondVar ready_;
  std::deque<absl::StatusOr<T>> items_ ABSL_GUARDED_BY(mu_);
};

// `slice` as `count` float32 values at offset 0, or why it is not.
// Both ends of a link: a neighbour that is paused or cut off leaves the
// stream open and silent but stops answering pings, so each end pings a
// lease after the last traffic and gives up after another; and each takes
// the other's pings however long a pass runs without data.
std::vector<std::pair<const char*, int>> LinkKeepalive(const v1::JobConfig& config) {
  const int lease_ms = static_cast<int>(std::min<uint32_t>(config.cluster().lease_ms(), INT32_MAX));
  return {{GRPC_ARG_KEEPALIVE_TIME_MS, lease_ms},
          {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, lease_ms},
          {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
          {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0},
          {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, lease_ms / 2},
          {GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0}};
}

grpc::ChannelArguments LinkArguments(const v1::JobConfig& config) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
  args.SetMaxSendMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
  for (const auto& [name, value] : LinkKeepalive(config)) args.SetInt(name, value);
  return args;
}

class UpstreamImpl final : public Upstream, public v1::PipelineStage::Service {
 public:
  UpstreamImpl(const v1::JobConfig& config, int stage, uint32_t replica)
      : end_{ModelFingerprint(config), stage, replica, SegmentInputWidth(config.model(), stage),
             config.model().loss() == v1::MSE ? 0 : config.model().num_classes(),
             absl::StrCat("stage ", stage - 1, " (", config.model().segments(stage - 1).name(), ") replica ",
                          replica)} {}
  ~UpstreamImpl() override {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      server_->Wait();
    }
  }

  absl::Status Start(const v1::JobConfig& config, const std::string& listen) {
    absl::StatusOr<Security> security = LoadSecurity(config.security());
    if (!security.ok()) return security.status();
    tokens_ = security->tokens;
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentials(*security);
    if (!credentials.ok()) return credentials.status();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(listen, *credentials, &port);
    builder.SetMaxReceiveMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
    builder.SetMaxSendMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
    for (const auto& [name, value] : LinkKeepalive(config)) builder.AddChannelArgument(name, value);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
    address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
    return absl::OkStatus();
  }

  const std::string& address() const override { return address_; }

  grpc::Status Exchange(grpc::ServerContext* context,
                        grpc::ServerReaderWriter<v1::Gradients, v1::Activations>* stream) override {
    if (absl::Status allowed = AuthorizeCall(CallerOf(*context, tokens_), true, "Exchange"); !allowed.ok()) {
      return grpc::Status(static_cast<grpc::StatusCode>(allowed.code()), std::string(allowed.message()));
    }
    // The link is the first stream whose first message comes from the
    // predecessor (model, stage and replica); another stream, silent or
    // not, neither holds the link nor reaches the stage.
    v1::Activations message;
    if (!stream->Read(&message)) return grpc::Status::OK;
    absl::StatusOr<MicroBatch> first = Check(message);
    if (!first.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(first.status().message()));
    {
      MutexLock lock(&mu_);
      if (stream_ != nullptr || finished_) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("Exchange: stage ", end_.stage, " replica ", end_.replica,
                                         " already has its link from ", end_.peer));
      }
      stream_ = stream;
    }
    grpc::Status ended = grpc::Status::OK;
    bool done = first->done;
    inbox_.Put(*std::move(first));
    absl::Time heard = absl::Now();
    while (!done && stream->Read(&message)) {
      heard = absl::Now();
      absl::StatusOr<MicroBatch> batch = Check(message);
      if (!batch.ok()) {
        ended = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(batch.status().message()));
        inbox_.Put(batch.status());
        break;
      }
      done = batch->done;
      inbox_.Put(*std::move(batch));
    }
    if (!done && ended.ok()) {
      // A cancelled call lost its connection: the peer died, or it stopped
      // answering the keepalive ping sent a lease after the last traffic.
      inbox_.Put(absl::UnavailableError(
          context->IsCancelled()
              ? absl::StrCat(end_.peer, " lost the link before training ended: nothing came for ",
                             absl::FormatDuration(absl::Trunc(absl::Now() - heard, absl::Milliseconds(100))),
                             ", then the connection dropped or stopped answering pings")
              : absl::StrCat(end_.peer, " closed the link before training ended")));
    }
    MutexLock lock(&mu_);
    while (writing_) changed_.Wait(&mu_);
    stream_ = nullptr;
    finished_ = done;
    return ended;
  }

  absl::StatusOr<MicroBatch> Receive(absl::Duration patience) override {
    return inbox_.Take(patience, end_.peer);
  }

  absl::Status SendGradient(uint64_t clock, uint32_t micro_batch, absl::Span<const float> values) override {
    v1::Gradients message;
    message.set_clock(clock);
    message.set_micro_batch(micro_batch);
    EncodeFloat32(values, 0, message.mutable_values());
    grpc::ServerReaderWriter<v1::Gradients, v1::Activations>* stream;
    {
      MutexLock lock(&mu_);
      stream = stream_;
      if (stream == nullptr) return absl::UnavailableError(absl::StrCat(end_.peer, " is not connected"));
      writing_ = true;
    }
    const bool sent = stream->Write(message);
    MutexLock lock(&mu_);
    writing_ = false;
    changed_.SignalAll();
    if (!sent) return absl::UnavailableError(absl::StrCat(end_.peer, " went away"));
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<MicroBatch> Check(const v1::Activations& m) const {
    return CheckActivations(m, end_);
  }

  const LinkEnd end_;  // whose activations it takes, and their shape
  std::vector<Token> tokens_;  // set by Start, before the server serves
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  Inbox<MicroBatch> inbox_;
  Mutex mu_;
  CondVar changed_;
  grpc::ServerReaderWriter<v1::Gradients, v1::Activations>* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class DownstreamImpl final : public Downstream {
 public:
  DownstreamImpl(const v1::JobConfig& config, int stage, uint32_t replica, const std::string& address)
      : fingerprint_(ModelFingerprint(config)),
        stage_(stage),
        replica_(replica),
        width_(config.model().segments(stage).layers(config.model().segments(stage).layers_size() - 1).units()),
        peer_(absl::StrCat("stage ", stage + 1, " (", config.model().segments(stage + 1).name(), ") replica ", replica,
                           " at ", address)) {}
  ~DownstreamImpl() override {
    if (stream_ == nullptr) return;
    context_.TryCancel();
    if (reader_.joinable()) reader_.join();
    stream_->Finish().IgnoreError();
  }

  absl::Status Start(const v1::JobConfig& config, const std::string& address) {
    absl::StatusOr<Security> security = LoadSecurity(config.security());
    if (!security.ok()) return security.status();
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = ChannelCredentials(*security);
    if (!credentials.ok()) return credentials.status();
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(address, *credentials, LinkArguments(config));
    // The next stage may still be starting: wait for it, but not for ever.
    const absl::Duration patience = absl::Milliseconds(config.cluster().recovery_timeout_ms());
    if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + patience))) {
      return absl::UnavailableError(absl::StrCat("cannot reach ", peer_, " within ", absl::FormatDuration(patience),
                                                 " (cluster.recovery_timeout_ms)"));
    }
    stub_ = v1::PipelineStage::NewStub(channel);
    context_.set_wait_for_ready(true);
    stream_ = stub_->Exchange(&context_);
    reader_ = std::thread([this] {
      v1::Gradients message;
      while (stream_->Read(&message)) inbox_.Put(std::move(message));
      reader_ended_ = true;
      inbox_.Put(absl::UnavailableError(absl::StrCat(peer_, " closed the link")));
    });
    return absl::OkStatus();
  }

  absl::Status Send(uint64_t clock, uint32_t epoch, uint32_t micro_batch, uint32_t batch_rows,
                    absl::Span<const float> values, absl::Span<const int32_t> labels) override {
    if (stream_ == nullptr) return Ended("went away");  // it ended before
    const uint32_t rows = static_cast<uint32_t>(labels.size());
    v1::Activations message;
    message.set_model_fingerprint(fingerprint_);
    message.set_stage(static_cast<uint32_t>(stage_));
    message.set_replica(replica_);
    message.set_clock(clock);
    message.set_epoch(epoch);
    message.set_micro_batch(micro_batch);
    message.set_batch_rows(batch_rows);
    message.set_rows(rows);
    EncodeFloat32(values, 0, message.mutable_values());
    message.set_labels(std::string(reinterpret_cast<const char*>(labels.data()), labels.size() * sizeof(int32_t)));
    sent_.push_back({clock, micro_batch, rows});
    if (!stream_->Write(message)) return Ended("went away");
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<float>> ReceiveGradient(absl::Duration patience) override {
    if (sent_.empty()) return absl::FailedPreconditionError("no micro-batch awaits its gradient");
    absl::StatusOr<v1::Gradients> message = inbox_.Take(patience, peer_);
    if (!message.ok()) return reader_ended_ ? Ended("closed the link") : message.status();
    const Sent expected = sent_.front();
    sent_.pop_front();
    if (message->clock() != expected.clock || message->micro_batch() != expected.micro_batch) {
      return absl::InvalidArgumentError(absl::StrCat(peer_, " answered clock ", message->clock(), " micro-batch ",
                                                     message->micro_batch(), ", expected clock ", expected.clock,
                                                     " micro-batch ", expected.micro_batch));
    }
    return LinkValues(message->values(), uint64_t{expected.rows} * width_, "Exchange gradients");
  }

  absl::Status Finish() override {
    v1::Activations message;
    message.set_model_fingerprint(fingerprint_);
    message.set_stage(static_cast<uint32_t>(stage_));
    message.set_replica(replica_);
    message.set_done(true);
    if (stream_ == nullptr || !stream_->Write(message) || !stream_->WritesDone()) return Ended("went away");
    reader_.join();
    const grpc::Status status = stream_->Finish();
    stream_ = nullptr;
    if (!status.ok()) return absl::UnavailableError(absl::StrCat(peer_, ": ", status.error_message()));
    return absl::OkStatus();
  }

 private:
  // The call is over (a write failed, or the reader saw its end): gRPC's
  // status for it says why, e.g. its keepalive verdict on a neighbour that
  // stopped answering pings (paused, or cut off) or the reset of one that died.
  absl::Status Ended(absl::string_view what) {
    if (stream_ == nullptr) return absl::UnavailableError(absl::StrCat(peer_, " ", what));
    reader_.join();
    const grpc::Status status = stream_->Finish();
    stream_ = nullptr;
    return absl::UnavailableError(
        absl::StrCat(peer_, " ", what, ": ", status.ok() ? "it ended the stream" : status.error_message()));
  }

  struct Sent {
    uint64_t clock;
    uint32_t micro_batch, rows;
  };
  const std::string fingerprint_;
  const int stage_;
  const uint32_t replica_;
  const uint64_t width_;
  const std::string peer_;
  std::unique_ptr<v1::PipelineStage::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::Activations, v1::Gradients>> stream_;
  std::thread reader_;
  std::atomic<bool> reader_ended_{false};
  Inbox<v1::Gradients> inbox_;
  std::deque<Sent> sent_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Upstream>> Upstream::Listen(const v1::JobConfig& config, int stage, uint32_t replica,
                                                           const std::string& listen) {
  auto link = std::make_unique<UpstreamImpl>(config, stage, replica);
  absl::Status started = link->Start(config, listen);
  if (!started.ok()) return started;
  return std::unique_ptr<Upstream>(std::move(link));
}

absl::StatusOr<std::unique_ptr<Downstream>> Downstream::Connect(const v1::JobConfig& config, int stage,
                                                                uint32_t replica, const std::string& address) {
  auto link = std::make_unique<DownstreamImpl>(config, stage, replica, address);
  absl::Status started = link->Start(config, address);
  if (!started.ok()) return started;
  return std::unique_ptr<Downstream>(std::move(link));
}

}  // namespace segps
