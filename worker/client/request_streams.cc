#include "worker/client/request_streams.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace segps {

RequestStreams::RequestStreams(const std::vector<std::shared_ptr<grpc::Channel>>& channels, const char* method)
    : method_(method), streams_(channels.size()) {
  for (size_t i = 0; i < channels.size(); ++i) {
    stubs_.push_back(std::make_unique<grpc::GenericStub>(channels[i]));
    for (Op op : {Op::kStart, Op::kWrite, Op::kRead, Op::kFinish}) {
      streams_[i].tags[static_cast<int>(op)] = {i, op};
    }
  }
}

RequestStreams::~RequestStreams() {
  auto open = [this] {
    for (const Stream& s : streams_) {
      if (s.io != nullptr) return true;
    }
    return false;
  };
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].io != nullptr) Break(i, absl::CancelledError("closing"));
  }
  while (open()) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq_.Next(&tag, &ok)) break;
    const Tag& t = *static_cast<Tag*>(tag);
    Stream& s = streams_[t.server];
    switch (t.op) {
      case Op::kStart: s.starting = false; break;
      case Op::kWrite: s.writing = false; break;
      case Op::kRead: s.reading = false; break;
      case Op::kFinish:
        s.finishing = false;
        s.io.reset();
        s.context.reset();
        continue;
    }
    FinishIfIdle(t.server);
  }
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
}

void RequestStreams::Open(size_t server) {
  Stream& s = streams_[server];
  s.context = std::make_unique<grpc::ClientContext>();
  s.io = stubs_[server]->PrepareCall(s.context.get(), method_, &cq_);
  s.started = s.broken = false;
  s.status = grpc::Status();
  s.break_cause = absl::OkStatus();
  s.io->StartCall(&s.tags[static_cast<int>(Op::kStart)]);
  s.starting = true;
}

void RequestStreams::Pump(size_t server, size_t window, const std::vector<size_t>& pending,
                          const std::vector<grpc::ByteBuffer>& requests) {
  Stream& s = streams_[server];
  if (s.io == nullptr || !s.started || s.broken) return;
  // gRPC allows one write and one read outstanding per stream.
  if (!s.writing && !s.unsent.empty() && s.unanswered.size() < window) {
    const size_t k = s.unsent.front();
    s.unsent.pop_front();
    s.io->Write(requests[pending[k]], &s.tags[static_cast<int>(Op::kWrite)]);
    s.writing = true;
    s.unanswered.push_back(k);
  }
  if (!s.reading && !s.unanswered.empty()) {
    s.io->Read(&s.reply, &s.tags[static_cast<int>(Op::kRead)]);
    s.reading = true;
  }
}

void RequestStreams::Break(size_t server, absl::Status cause) {
  Stream& s = streams_[server];
  if (!s.broken) {
    s.broken = true;
    // A stream that failed by itself carries the server's status; only one
    // the client gives up on is cancelled (which would mask that status).
    if (!cause.ok()) {
      s.break_cause = std::move(cause);
      s.context->TryCancel();
    }
  }
  FinishIfIdle(server);
}

void RequestStreams::FinishIfIdle(size_t server) {
  Stream& s = streams_[server];
  if (s.io == nullptr || !s.broken || Busy(s)) return;
  s.io->Finish(&s.status, &s.tags[static_cast<int>(Op::kFinish)]);
  s.finishing = true;
}

bool RequestStreams::AnyBusy() const {
  for (const Stream& s : streams_) {
    if (Busy(s)) return true;
  }
  return false;
}

void RequestStreams::BreakStalled(absl::Duration patience) {
  for (size_t i = 0; i < streams_.size(); ++i) {
    const Stream& s = streams_[i];
    if (!s.unsent.empty() || !s.unanswered.empty()) {
      Break(i, absl::DeadlineExceededError(absl::StrCat("no reply within ", absl::FormatDuration(patience))));
    }
  }
}

void RequestStreams::Finished(size_t i, absl::FunctionRef<void(size_t, absl::Status)> settle) {
  Stream& s = streams_[i];
  s.finishing = false;
  absl::Status status = !s.break_cause.ok() ? s.break_cause
                        : s.status.ok()     ? absl::UnavailableError("the server ended the stream")
                                            : FromGrpcStatus(s.status);
  const bool failed = !s.unanswered.empty() || !s.unsent.empty();
  for (std::deque<size_t>* left : {&s.unanswered, &s.unsent}) {
    for (size_t k : *left) settle(k, status);
    left->clear();
  }
  s.io.reset();
  s.context.reset();
  // A request that failed for good fails the exchange: the others are
  // abandoned rather than waited for (a pull parked on a peer that this
  // failure also stops would wait for its deadline).
  if (!failed || IsTransient(status)) return;
  for (size_t j = 0; j < streams_.size(); ++j) {
    const Stream& other = streams_[j];
    if (j != i && !other.broken && (!other.unsent.empty() || !other.unanswered.empty())) {
      Break(j, absl::AbortedError(absl::StrCat("abandoned: server ", i, " failed: ", status.message())));
    }
  }
}

std::vector<absl::Status> RequestStreams::Exchange(const std::vector<size_t>& servers,
                                                   const std::vector<grpc::ByteBuffer>& requests, size_t window,
                                                   absl::Duration patience, const TakeReply& take,
                                                   const std::vector<size_t>& pending) {
  const size_t count = pending.size();
  std::vector<absl::Status> results(count);
  size_t remaining = count;
  auto settle = [&](size_t k, absl::Status status) {
    results[k] = std::move(status);
    --remaining;
  };
  for (size_t k = 0; k < count; ++k) streams_[servers[pending[k]]].unsent.push_back(k);
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].unsent.empty()) continue;
    if (streams_[i].io == nullptr) Open(i);
    Pump(i, window, pending, requests);
  }
  absl::Time progress = absl::Now();
  while (remaining > 0 || AnyBusy()) {
    void* tag = nullptr;
    bool ok = false;
    if (cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(progress + patience)) ==
        grpc::CompletionQueue::NextStatus::TIMEOUT) {
      BreakStalled(patience);
      progress = absl::Now();
      continue;
    }
    progress = absl::Now();
    const size_t i = static_cast<Tag*>(tag)->server;
    Stream& s = streams_[i];
    switch (static_cast<Tag*>(tag)->op) {
      case Op::kStart:
        s.starting = false;
        s.started = ok;
        break;
      case Op::kWrite:
        s.writing = false;
        break;
      case Op::kRead:
        s.reading = false;
        if (ok) {
          const size_t k = s.unanswered.front();
          s.unanswered.pop_front();
          settle(k, take(pending[k], &s.reply));
          s.reply.Clear();
        }
        break;
      case Op::kFinish:
        Finished(i, settle);
        continue;
    }
    if (!ok) Break(i, absl::OkStatus());
    FinishIfIdle(i);
    Pump(i, window, pending, requests);
  }
  return results;
}

}  // namespace segps
