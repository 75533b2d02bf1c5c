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
  // A link reopened to a stage starting again: a channel of its own (not
  // one sharing the dead connection's backoff), retried every 100 ms.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
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
    // A stream becomes the link once its first message comes from the
    // predecessor (model, stage and replica); another stream, silent or
    // not, neither holds the link nor reaches the stage. A predecessor that
    // recovered opens a new stream, which ends the one before.
    v1::Activations message;
    if (!stream->Read(&message)) return grpc::Status::OK;
    absl::StatusOr<MicroBatch> first = Check(message);
    if (!first.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(first.status().message()));
    uint64_t session;
    {
      MutexLock lock(&mu_);
      if (finished_) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("Exchange: stage ", end_.stage, " replica ", end_.replica,
                                         " has finished training"));
      }
      if (context_ != nullptr) context_->TryCancel();
      session = ++session_;
      floor_ = session;  // what the streams before left unread is dropped
      DropBelowFloor();
      stream_ = stream;
      context_ = context;
    }
    bool done = first->done;
    Put(session, *std::move(first));
    const Served served = Serve(session, context, stream, &done);
    MutexLock lock(&mu_);
    while (writing_) changed_.Wait(&mu_);
    if (session_ == session) {
      stream_ = nullptr;
      context_ = nullptr;
      finished_ = done;
    }
    return served;
  }

  absl::StatusOr<MicroBatch> Receive(absl::Duration patience) override {
    MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + patience;
    while (items_.empty() && absl::Now() < deadline) ready_.WaitWithDeadline(&mu_, deadline);
    if (items_.empty()) {
      return absl::DeadlineExceededError(absl::StrCat("no message from ", end_.peer, " within ",
                                                      absl::FormatDuration(patience)));
    }
    Item& item = items_.front();
    if (consumed_ != 0 && item.session != consumed_) {
      return absl::UnavailableError(absl::StrCat(end_.peer, " reopened the link (it recovered)"));
    }
    consumed_ = item.session;  // the stage reads this stream now: a reset ends it
    if (!item.batch.ok()) return item.batch.status();  // an error stays, for every later Receive
    absl::StatusOr<MicroBatch> batch = std::move(item.batch);
    items_.pop_front();
    return batch;
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
      if (session_ != consumed_) return absl::UnavailableError(absl::StrCat(end_.peer, " reopened the link"));
      writing_ = true;
    }
    const bool sent = stream->Write(message);
    MutexLock lock(&mu_);
    writing_ = false;
    changed_.SignalAll();
    if (!sent) return absl::UnavailableError(absl::StrCat(end_.peer, " went away"));
    return absl::OkStatus();
  }

  void Reset() override {
    MutexLock lock(&mu_);
    if (consumed_ == 0) return;  // nothing taken since the last reset: a newer stream stays
    if (session_ == consumed_ && context_ != nullptr) context_->TryCancel();
    floor_ = std::max(floor_, consumed_ + 1);
    DropBelowFloor();
    consumed_ = 0;
  }

 private:
  using Served = grpc::Status;
  struct Item {
    uint64_t session;
    absl::StatusOr<MicroBatch> batch;
  };

  // Reads the stream of `session` to its end, or until a newer one takes the link.
  Served Serve(uint64_t session, grpc::ServerContext* context,
               grpc::ServerReaderWriter<v1::Gradients, v1::Activations>* stream, bool* done) {
    v1::Activations message;
    absl::Time heard = absl::Now();
    while (!*done && stream->Read(&message)) {
      heard = absl::Now();
      absl::StatusOr<MicroBatch> batch = Check(message);
      if (!batch.ok()) {
        Put(session, batch.status());
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(batch.status().message()));
      }
      *done = batch->done;
      Put(session, *std::move(batch));
    }
    if (*done) return grpc::Status::OK;
    // A cancelled call lost its connection: the peer died, or it stopped
    // answering the keepalive ping sent a lease after the last traffic (or
    // this end reset it, or a newer stream took the link: Put drops those).
    Put(session, absl::UnavailableError(
                     context->IsCancelled()
                         ? absl::StrCat(end_.peer, " lost the link before training ended: nothing came for ",
                                        absl::FormatDuration(absl::Trunc(absl::Now() - heard, absl::Milliseconds(100))),
                                        ", then the connection dropped or stopped answering pings")
                         : absl::StrCat(end_.peer, " closed the link before training ended")));
    return grpc::Status::OK;
  }

  void DropBelowFloor() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!items_.empty() && items_.front().session < floor_) items_.pop_front();
  }

  void Put(uint64_t session, absl::StatusOr<MicroBatch> batch) {
    MutexLock lock(&mu_);
    if (session < floor_) return;
    items_.push_back({session, std::move(batch)});
    ready_.SignalAll();
  }

  absl::StatusOr<MicroBatch> Check(const v1::Activations& m) const {
    return CheckActivations(m, end_);
  }

  const LinkEnd end_;  // whose activations it takes, and their shape
  std::vector<Token> tokens_;  // set by Start, before the server serves
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  Mutex mu_;
  CondVar changed_, ready_;
  // The link's streams are numbered from 1; the newest holds the link.
  uint64_t session_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ServerReaderWriter<v1::Gradients, v1::Activations>* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ServerContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Messages (or the error that ended a stream) for the stage, oldest first;
  // those of streams before `floor_` are dropped.
  std::deque<Item> items_ ABSL_GUARDED_BY(mu_);
  uint64_t floor_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t consumed_ ABSL_GUARDED_BY(mu_) = 0;  // the stream the stage took from since its reset
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class DownstreamImpl final : public Downstream {
 public:
  DownstreamImpl(const v1::JobConfig& config, int stage, uint32_t replica, const std::string& address)
      : config_(config),
        address_(address),
        fingerprint_(ModelFingerprint(config)),
        stage_(stage),
        replica_(replica),
        width_(config.model().segments(stage).layers(config.model().segments(stage).layers_size() - 1).units()),
        peer_(absl::StrCat("stage ", stage + 1, " (", config.model().segments(stage + 1).name(), ") replica ", replica,
                           " at ", address)) {}
  ~DownstreamImpl() override { Close(); }

  absl::Status Start() {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = LoadChannelCredentials(config_.security());
    if (!credentials.ok()) return credentials.status();
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(address_, *credentials, LinkArguments(config_));
    // The next stage may still be starting (or starting again): wait for it, but not for ever.
    const absl::Duration patience = absl::Milliseconds(config_.cluster().recovery_timeout_ms());
    if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + patience))) {
      return absl::UnavailableError(absl::StrCat("cannot reach ", peer_, " within ", absl::FormatDuration(patience),
                                                 " (cluster.recovery_timeout_ms)"));
    }
    stub_ = v1::PipelineStage::NewStub(channel);
    context_ = std::make_unique<grpc::ClientContext>();
    context_->set_wait_for_ready(true);
    inbox_ = std::make_unique<Inbox<v1::Gradients>>();
    reader_ended_ = false;
    stream_ = stub_->Exchange(context_.get());
    reader_ = std::thread([this, stream = stream_.get(), inbox = inbox_.get()] {
      v1::Gradients message;
      while (stream->Read(&message)) inbox->Put(std::move(message));
      reader_ended_ = true;
      inbox->Put(absl::UnavailableError(absl::StrCat(peer_, " closed the link")));
    });
    return absl::OkStatus();
  }

  absl::Status Reopen() override {
    Close();
    sent_.clear();
    return Start();
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
    if (stream_ == nullptr) return Ended("went away");
    absl::StatusOr<v1::Gradients> message = inbox_->Take(patience, peer_);
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
  // Ends the stream in place, if any (the next stage sees it cancelled).
  void Close() {
    if (stream_ == nullptr) return;
    context_->TryCancel();
    if (reader_.joinable()) reader_.join();
    stream_->Finish().IgnoreError();
    stream_ = nullptr;
  }

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
  const v1::JobConfig& config_;
  const std::string address_;
  const std::string fingerprint_;
  const int stage_;
  const uint32_t replica_;
  const uint64_t width_;
  const std::string peer_;
  std::unique_ptr<v1::PipelineStage::Stub> stub_;
  // One stream at a time, made again by Reopen.
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::Activations, v1::Gradients>> stream_;
  std::thread reader_;
  std::atomic<bool> reader_ended_{false};
  std::unique_ptr<Inbox<v1::Gradients>> inbox_;
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
  absl::Status started = link->Start();
  if (!started.ok()) return started;
  return std::unique_ptr<Downstream>(std::move(link));
}

}  // namespace segps
