#include "worker/client/segment_session.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/client/membership.h"

namespace segps {

absl::StatusOr<std::unique_ptr<SegmentSession>> SegmentSession::Open(v1::JobConfig config,
                                                                     const std::vector<std::string>& servers,
                                                                     const std::string& segment,
                                                                     std::optional<std::string> rank) {
  std::vector<std::string> names;
  for (const v1::SegmentConfig& s : config.model().segments()) names.push_back(s.name());
  const int k = segment.empty() && names.size() == 1 ? 0 : SegmentIndex(config.model(), segment);
  if (k < 0) {
    const std::string what =
        segment.empty() ? "name the segment" : absl::StrCat("segment '", segment, "' names no segment of the config");
    return absl::InvalidArgumentError(absl::StrCat(what, ": one of ", absl::StrJoin(names, ", ")));
  }
  std::optional<uint32_t> wanted;
  if (rank.has_value() && *rank != "auto") {
    uint32_t r = 0;
    if (!absl::SimpleAtoi(*rank, &r) || r >= WorkersOf(config, k)) {
      return absl::InvalidArgumentError(absl::StrCat("rank must be 'auto' or in [0, ", WorkersOf(config, k),
                                                     ") for segment ", config.model().segments(k).name(), ", got '",
                                                     *rank, "'"));
    }
    wanted = r;
  }
  const std::vector<std::string> addresses = ServerAddresses(absl::StrJoin(servers, ","), config);
  if (addresses.empty()) return absl::InvalidArgumentError("no servers given (and the config lists none)");
  absl::StatusOr<ShardMap> map = ShardMap::Create(config.model(), config.cluster().num_servers(),
                                                  config.cluster().replicas());
  if (!map.ok()) return map.status();
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ConnectGrpc(config, addresses);
  if (!client.ok()) return client.status();
  std::unique_ptr<SegmentSession> session(
      new SegmentSession(std::move(config), *std::move(map), k, *std::move(client)));
  if (rank.has_value()) {
    // Servers may still be starting: retried like a rejoin.
    absl::StatusOr<Registration> joined =
        Rejoin([&] { return session->client_->Register(k, wanted); },
               absl::Milliseconds(session->config_.cluster().recovery_timeout_ms()), Clock::Real(), session->tag_);
    if (!joined.ok()) return joined.status();
    session->rank_ = joined->rank;
    session->clock_ = joined->start_clock;
    session->heartbeat_.emplace(session->client_.get(), absl::Milliseconds(session->config_.cluster().lease_ms()) / 3);
  }
  return session;
}

SegmentSession::SegmentSession(v1::JobConfig config, ShardMap map, int segment,
                               std::unique_ptr<ParameterClient> client)
    : config_(std::move(config)),
      map_(std::move(map)),
      segment_(segment),
      tag_(config_.model().segments(segment).name()),
      client_(std::move(client)) {}

SegmentSession::~SegmentSession() {
  absl::Status closed = Close();
  if (!closed.ok()) SEGPS_LOG_WARNING << tag_ << ": " << closed.message();
}

absl::Status SegmentSession::Usable(const char* call) const {
  if (closed_) return absl::FailedPreconditionError(absl::StrCat(call, ": the session of ", tag_, " is closed"));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SegmentSession::Pull(absl::Span<float> dest) {
  SEGPS_RETURN_IF_ERROR(Usable("pull"));
  if (dest.size() != size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull: segment ", tag_, " has ", size(), " parameters; the buffer holds ", dest.size()));
  }
  for (;;) {
    PulledAt at;
    if (prefetch_.has_value()) {
      at = prefetch_->Wait();
      prefetch_.reset();
      if (at.ok()) std::copy(spare_.begin(), spare_.end(), dest.begin());
      if (at.ok() && StalenessOf(config_, segment_) == 0) steps_ += 1;  // its push came back applied
    } else {
      at = client_->Pull(segment_, clock_, dest);
    }
    if (at.ok()) {
      pulled_ = !reader();
      return at;
    }
    if (reader()) return at.status();
    SEGPS_RETURN_IF_ERROR(Recover(at.status()));
  }
}

absl::Status SegmentSession::Push(absl::Span<const float> gradient) {
  SEGPS_RETURN_IF_ERROR(Usable("push"));
  if (reader()) {
    return absl::FailedPreconditionError(absl::StrCat("push: a reader of ", tag_, " has no rank to push as"));
  }
  if (!pulled_) {
    return absl::FailedPreconditionError(absl::StrCat("push: pull the parameters of clock ", clock_,
                                                      " first: a gradient is of the parameters it was computed on"));
  }
  if (gradient.size() != size()) {
    return absl::InvalidArgumentError(absl::StrCat("push: segment ", tag_, " has ", size(),
                                                   " parameters; the gradient holds ", gradient.size()));
  }
  std::shared_ptr<const EncodedPush> push = client_->Encode(segment_, clock_, gradient);
  pulled_ = false;
  clock_ += 1;
  spare_.resize(size());
  if (StalenessOf(config_, segment_) == 0) {
    // The next step needs this one applied anyway: one round for both.
    prefetch_ = client_->StartSendAndPull(std::move(push), absl::MakeSpan(spare_));
    return absl::OkStatus();
  }
  in_flight_.push_back(client_->StartSend(std::move(push)));
  while (in_flight_.size() > PushesInFlight(config_, segment_)) SEGPS_RETURN_IF_ERROR(Settle());
  prefetch_ = client_->StartPull(segment_, clock_, absl::MakeSpan(spare_));
  return absl::OkStatus();
}

void SegmentSession::Abandon() {
  for (Completion<absl::Status>& push : in_flight_) (void)push.Wait();  // failed or applied: the servers tell
  in_flight_.clear();
  if (prefetch_.has_value()) (void)prefetch_->Wait();
  prefetch_.reset();
}

absl::Status SegmentSession::Settle() {
  absl::Status sent = in_flight_.front().Wait();
  in_flight_.pop_front();
  if (sent.ok()) {
    steps_ += 1;
    return sent;
  }
  return Recover(sent);
}

absl::Status SegmentSession::Recover(const absl::Status& failure) {
  if (!Recoverable(failure)) return absl::Status(failure.code(), absl::StrCat(tag_, ": ", failure.message()));
  // The pushes in flight fail or are abandoned: the servers say where to go on.
  heartbeat_.reset();
  client_->Interrupt(failure);
  Abandon();
  absl::StatusOr<Registration> again =
      Rejoin([&] { return client_->Register(segment_, rank_); },
             absl::Milliseconds(config_.cluster().recovery_timeout_ms()), Clock::Real(), tag_);
  if (!again.ok()) {
    return absl::Status(again.status().code(), absl::StrCat(again.status().message(), " (it failed at clock ", clock_,
                                                            ": ", failure.message(), ")"));
  }
  SEGPS_LOG_WARNING << tag_ << "/" << *rank_ << ": " << failure.message() << "; rejoined, continuing at clock "
                    << again->start_clock << " (was at " << clock_ << ")";
  clock_ = again->start_clock;
  pulled_ = false;
  recoveries_ += 1;
  heartbeat_.emplace(client_.get(), absl::Milliseconds(config_.cluster().lease_ms()) / 3);
  return absl::OkStatus();
}

absl::Status SegmentSession::Close() {
  if (closed_) return absl::OkStatus();
  absl::Status status;
  while (!in_flight_.empty() && status.ok()) status = Settle();
  // A push that pulls (staleness 0) is a push: it must land before leaving.
  if (status.ok() && prefetch_.has_value() && StalenessOf(config_, segment_) == 0) {
    status = prefetch_->Wait().status();
    prefetch_.reset();
    if (status.ok()) steps_ += 1;
  }
  closed_ = true;
  absl::StatusOr<std::vector<uint64_t>> left = status.ok() && !reader() ? client_->Leave(std::nullopt)
                                                                         : std::vector<uint64_t>{};
  // Leaving ends a prefetch that waits on peers; a failure ends what is left.
  if (!status.ok() || !left.ok()) client_->Interrupt(status.ok() ? left.status() : status);
  Abandon();
  heartbeat_.reset();
  return status.ok() ? left.status() : status;
}

}  // namespace segps
