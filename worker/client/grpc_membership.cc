#include "worker/client/grpc_membership.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "worker/client/request_streams.h"

namespace segps {

GrpcMembershipStub::GrpcMembershipStub(ServerRoutes* routes, size_t index, absl::Duration deadline,
                                       std::shared_ptr<RegionHolder> regions, std::string host)
    : routes_(routes), index_(index), deadline_(deadline), regions_(std::move(regions)),
      host_(regions_ != nullptr ? std::move(host) : "") {}

absl::Status GrpcMembershipStub::Register(const v1::RegisterRequest& request, v1::RegisterResponse* response) {
  v1::RegisterRequest offered = request;
  offered.set_host(host_);
  absl::Status status = WithRetries([&](const ServerRoutes::Way& way, grpc::ClientContext* context) {
    context->set_wait_for_ready(true);  // servers may still be starting
    return way.stub->Register(context, offered, response);
  });
  if (status.ok()) OfferRegion(*response);
  return status;
}

absl::Status GrpcMembershipStub::Rollback(const v1::RollbackRequest& request, v1::RollbackResponse* response) {
  return WithRetries([&](const ServerRoutes::Way& way, grpc::ClientContext* context) {
    return way.stub->Rollback(context, request, response);
  });
}

std::string GrpcMembershipStub::Name() const { return routes_->way(index_).name; }

template <typename F>
absl::Status GrpcMembershipStub::WithRetries(F call) {
  Backoff backoff(deadline_ * 4, routes_->retry_cap());
  while (true) {
    grpc::ClientContext context;
    const ServerRoutes::Way& way = routes_->way(index_);
    context.set_deadline(absl::ToChronoTime(absl::Now() + std::min({backoff.left(), deadline_, way.patience})));
    way.Prepare(&context);
    const absl::Status status = FromGrpcStatus(call(way, &context));
    if (status.ok() || !IsTransient(status)) return status;
    routes_->Failed(index_);  // the server may be gone: its ranges may be served the other way
    if (!SleepBeforeRetry(&backoff)) return status;
  }
}

void GrpcMembershipStub::OfferRegion(const v1::RegisterResponse& response) {
  region_worker_.store(0, std::memory_order_release);
  const std::shared_ptr<RegionArena> arena = regions_ != nullptr ? regions_->get() : nullptr;
  if (arena == nullptr || response.region_socket().empty()) {
    if (said_ != 0 && arena != nullptr) {
      SEGPS_LOG_INFO << Name() << ": tensors over TCP (the server is on another host, or takes no shared memory)";
    }
    said_ = 0;
    return;
  }
  const absl::Status offered =
      arena->Offer(response.region_socket(), response.worker_id(), response.registration_secret(), deadline_);
  if (!offered.ok()) {
    SEGPS_LOG_WARNING << Name() << ": tensors over TCP; the shared region was not taken: " << offered.message();
    said_ = 0;
    return;
  }
  region_worker_.store(response.worker_id(), std::memory_order_release);
  if (said_ != 1) SEGPS_LOG_INFO << Name() << ": tensors through shared memory (same host)";
  said_ = 1;
}

}  // namespace segps
