#include "worker/client/request_streams.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace segps {

std::optional<absl::Duration> Backoff::Next() {
  if (absl::Now() + delay_ >= give_up_) return std::nullopt;
  const absl::Duration wait = delay_;
  delay_ = std::min(delay_ * 2, cap_);
  return wait;
}

bool SleepBeforeRetry(Backoff* backoff) {
  const std::optional<absl::Duration> wait = backoff->Next();
  if (!wait.has_value()) return false;
  absl::SleepFor(*wait);
  return true;
}

RequestStreams::RequestStreams(CompletionLoop* loop, ServerRoutes* routes, const char* method)
    : loop_(loop), method_(method), routes_(routes), streams_(routes->size()) {
  for (size_t i = 0; i < routes->size(); ++i) {
    for (Op op : {Op::kStart, Op::kWrite, Op::kRead, Op::kFinish}) {
      streams_[i].tags[static_cast<int>(op)] = {};
      streams_[i].tags[static_cast<int>(op)].owner = this;
      streams_[i].tags[static_cast<int>(op)].server = i;
      streams_[i].tags[static_cast<int>(op)].op = op;
    }
  }
  watchdog_.tag.owner = retry_.tag.owner = this;
  watchdog_.tag.op = Op::kWatchdog;
  retry_.tag.op = Op::kBackoff;
}

RequestStreams::~RequestStreams() {
  loop_->Hold();  // closing takes the streams' last completions
  std::vector<Callback> callbacks;
  bool closed;
  {
    MutexLock lock(&mu_);
    Close();
    callbacks.swap(callbacks_);
    closed = JustClosed();
  }
  RunCallbacks(std::move(callbacks), closed);
  closed_.Wait();
  loop_->Release();
}

// The caller's thread starts the exchange when the streams are idle: its
// first messages go out without a hand-off to the loop's thread.
void RequestStreams::Start(std::unique_ptr<Exchange> exchange) {
  std::vector<Callback> callbacks;
  {
    MutexLock lock(&mu_);
    if (closing_) {
      callbacks_.push_back(
          {std::move(exchange->done), absl::CancelledError(absl::StrCat(exchange->call, ": the client is closing"))});
    } else {
      if (!exchange->caller_drives) loop_->Hold();
      queue_.push_back(std::move(exchange));
      Next();
    }
    callbacks.swap(callbacks_);
  }
  RunCallbacks(std::move(callbacks), false);
}

void RequestStreams::RunCallbacks(std::vector<Callback> callbacks, bool closed) {
  for (Callback& c : callbacks) {
    std::move(c.done)(std::move(c.status));
    if (c.release) loop_->Release();
  }
  if (closed) closed_.CountDown();
}

void RequestStreams::Next() {
  if (current_ != nullptr || queue_.empty()) return;
  current_ = std::move(queue_.front());
  queue_.pop_front();
  backoff_.emplace(current_->budget, routes_->retry_cap());
  pending_.resize(current_->requests.size());
  for (size_t j = 0; j < pending_.size(); ++j) pending_[j] = j;
  BeginAttempt();
}

void RequestStreams::BeginAttempt() {
  in_attempt_ = true;
  results_.assign(pending_.size(), absl::OkStatus());
  remaining_ = pending_.size();
  for (size_t k = 0; k < pending_.size(); ++k) streams_[current_->servers[pending_[k]]].unsent.push_back(k);
  progress_ = absl::Now();
  const absl::Time due = progress_ + current_->patience;
  if (!watchdog_.armed) {
    Arm(&watchdog_, due);
  } else if (watchdog_due_ > due) {
    watchdog_.alarm.Cancel();  // fires at once; OnWatchdog sets it for this attempt
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].unsent.empty()) continue;
    if (streams_[i].io == nullptr) Open(i);
    Pump(i);
  }
  if (remaining_ == 0 && !AnyBusy()) EndAttempt();  // an exchange of no requests
}

void RequestStreams::Arm(Timer* timer, absl::Time when) {
  timer->armed = true;
  if (timer == &watchdog_) watchdog_due_ = when;
  timer->alarm.Set(loop_->queue(), absl::ToChronoTime(when), CompletionLoop::Tag(&timer->tag));
}

void RequestStreams::OnEvent(size_t server, Op op, bool ok) {
  std::vector<Callback> callbacks;
  bool closed = false;
  {
    MutexLock lock(&mu_);
    switch (op) {
      case Op::kWatchdog:
        OnWatchdog(ok);
        break;
      case Op::kBackoff:
        retry_.armed = false;
        if (closing_) {
          Complete(absl::CancelledError(absl::StrCat(current_->call, ": the client is closing")));
        } else {
          BeginAttempt();
        }
        break;
      default:
        OnStreamEvent(server, op, ok);
    }
    callbacks.swap(callbacks_);
    if (closing_) closed = JustClosed();
  }
  RunCallbacks(std::move(callbacks), closed);
}

void RequestStreams::OnWatchdog(bool fired) {
  watchdog_.armed = false;
  if (closing_ || !in_attempt_) return;
  if (fired && absl::Now() - progress_ >= current_->patience) {
    BreakStalled();
    progress_ = absl::Now();
  }
  Arm(&watchdog_, progress_ + current_->patience);
}

void RequestStreams::OnStreamEvent(size_t i, Op op, bool ok) {
  progress_ = absl::Now();
  Stream& s = streams_[i];
  switch (op) {
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
        Settle(k, current_->take(pending_[k], &s.reply));
        s.reply.Clear();
      }
      break;
    default:  // kFinish
      Finished(i);
      ok = true;
  }
  if (!ok) Break(i, absl::OkStatus());
  FinishIfIdle(i);
  Pump(i);
  if (in_attempt_ && remaining_ == 0 && !AnyBusy()) EndAttempt();
}

void RequestStreams::Settle(size_t k, absl::Status status) {
  results_[k] = std::move(status);
  --remaining_;
}

// As one call: the first failure for good ends the exchange; transient
// failures are tried again after a backoff while the budget lasts.
void RequestStreams::EndAttempt() {
  in_attempt_ = false;
  std::vector<size_t> failed;
  absl::Status first_failure;
  for (size_t k = 0; k < pending_.size(); ++k) {
    if (results_[k].ok()) continue;
    const size_t server = current_->servers[pending_[k]];
    if (!IsTransient(results_[k]) || closing_) return Complete(Annotate(results_[k], server));
    if (failed.empty()) first_failure = Annotate(results_[k], server);
    failed.push_back(pending_[k]);
  }
  if (failed.empty()) return Complete(absl::OkStatus());
  const std::optional<absl::Duration> wait = backoff_->Next();
  if (!wait.has_value()) return Complete(first_failure);
  pending_ = std::move(failed);
  if (current_->on_resend) current_->on_resend();
  Arm(&retry_, absl::Now() + *wait);
}

void RequestStreams::Complete(absl::Status status) {
  callbacks_.push_back({std::move(current_->done), std::move(status), !current_->caller_drives});
  current_.reset();
  if (!closing_) Next();
}

absl::Status RequestStreams::Annotate(const absl::Status& status, size_t server) const {
  return absl::Status(status.code(),
                      absl::StrCat(current_->call, " to ", routes_->way(server).name, ": ", status.message()));
}

void RequestStreams::Close() {
  closing_ = true;
  for (std::unique_ptr<Exchange>& queued : queue_) {
    callbacks_.push_back({std::move(queued->done),
                          absl::CancelledError(absl::StrCat(queued->call, ": the client is closing")),
                          !queued->caller_drives});
  }
  queue_.clear();
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].io != nullptr) Break(i, absl::CancelledError("the client is closing"));
  }
  if (watchdog_.armed) watchdog_.alarm.Cancel();
  if (retry_.armed) retry_.alarm.Cancel();  // its event fails the exchange
}

bool RequestStreams::JustClosed() {
  if (closed_counted_ || current_ != nullptr || watchdog_.armed || retry_.armed) return false;
  for (const Stream& s : streams_) {
    if (s.io != nullptr) return false;
  }
  closed_counted_ = true;
  return true;
}

void RequestStreams::Open(size_t server) {
  Stream& s = streams_[server];
  s.context = std::make_unique<grpc::ClientContext>();
  const ServerRoutes::Way& way = routes_->way(server);
  way.Prepare(s.context.get());
  s.io = way.generic->PrepareCall(s.context.get(), method_, loop_->queue());
  s.started = s.broken = false;
  s.status = grpc::Status();
  s.break_cause = absl::OkStatus();
  s.io->StartCall(CompletionLoop::Tag(&s.tags[static_cast<int>(Op::kStart)]));
  s.starting = true;
}

void RequestStreams::Pump(size_t server) {
  Stream& s = streams_[server];
  if (s.io == nullptr || !s.started || s.broken || current_ == nullptr) return;
  // gRPC allows one write and one read outstanding per stream.
  if (!s.writing && !s.unsent.empty() && s.unanswered.size() < current_->window) {
    const size_t k = s.unsent.front();
    s.unsent.pop_front();
    s.io->Write(current_->requests[pending_[k]], CompletionLoop::Tag(&s.tags[static_cast<int>(Op::kWrite)]));
    s.writing = true;
    s.unanswered.push_back(k);
  }
  if (!s.reading && !s.unanswered.empty()) {
    s.io->Read(&s.reply, CompletionLoop::Tag(&s.tags[static_cast<int>(Op::kRead)]));
    s.reading = true;
  }
}

void RequestStreams::Interrupt(const absl::Status& cause) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < streams_.size(); ++i) {
    const Stream& s = streams_[i];
    if (s.io != nullptr && (!s.unsent.empty() || !s.unanswered.empty())) Break(i, cause);
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
  s.io->Finish(&s.status, CompletionLoop::Tag(&s.tags[static_cast<int>(Op::kFinish)]));
  s.finishing = true;
}

bool RequestStreams::AnyBusy() const {
  for (const Stream& s : streams_) {
    if (Busy(s)) return true;
  }
  return false;
}

void RequestStreams::BreakStalled() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    const Stream& s = streams_[i];
    if (!s.unsent.empty() || !s.unanswered.empty()) {
      Break(i, absl::DeadlineExceededError(
                   absl::StrCat("no reply within ", absl::FormatDuration(current_->patience))));
    }
  }
}

void RequestStreams::Finished(size_t i) {
  Stream& s = streams_[i];
  s.finishing = false;
  absl::Status status = !s.break_cause.ok() ? s.break_cause
                        : s.status.ok()     ? absl::UnavailableError("the server ended the stream")
                                            : FromGrpcStatus(s.status);
  const bool failed = !s.unanswered.empty() || !s.unsent.empty();
  for (std::deque<size_t>* left : {&s.unanswered, &s.unsent}) {
    for (size_t k : *left) Settle(k, status);
    left->clear();
  }
  s.io.reset();
  s.context.reset();
  // The server may be gone: the stream opens the other way next (its ranges
  // may be served there: worker/client/server_routes.h).
  if (failed && IsTransient(status)) routes_->Failed(i);
  // A request that failed for good fails the exchange: the others are
  // abandoned rather than waited for (a pull parked on a peer that this
  // failure also stops would wait for its deadline).
  if (!failed || IsTransient(status)) return;
  for (size_t j = 0; j < streams_.size(); ++j) {
    const Stream& other = streams_[j];
    if (j != i && !other.broken && (!other.unsent.empty() || !other.unanswered.empty())) {
      Break(j, absl::AbortedError(absl::StrCat("abandoned: ", routes_->way(i).name, " failed: ", status.message())));
    }
  }
}

}  // namespace segps
