// Registration's calls to one server over gRPC (client/membership.h's
// MembershipStub), and, where the server runs on this host, the hand-over
// of the client's shared region for the new registration
// (client/region_arena.h).
#ifndef SEGPS_WORKER_CLIENT_GRPC_MEMBERSHIP_H_
#define SEGPS_WORKER_CLIENT_GRPC_MEMBERSHIP_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "segps/v1/parameter_server.grpc.pb.h"
#include "worker/client/membership.h"
#include "worker/client/region_arena.h"
#include "worker/client/server_routes.h"

namespace segps {

// Each call retried with backoff within four RPC deadlines while the
// server is unreachable or starting.
class GrpcMembershipStub final : public MembershipStub {
 public:
  // `regions`: the client's shared regions, or null (cluster.shared_memory
  // off); `host`: this host's SameHostIdentity, offered where there are regions.
  // Server `index` of `routes` (which outlive the stub): a try that finds
  // it gone makes the next go its other way (ServerRoutes::Failed).
  GrpcMembershipStub(ServerRoutes* routes, size_t index, absl::Duration deadline,
                     std::shared_ptr<RegionHolder> regions, std::string host);

  absl::Status Register(const v1::RegisterRequest& request, v1::RegisterResponse* response) override;
  absl::Status Rollback(const v1::RollbackRequest& request, v1::RollbackResponse* response) override;
  std::string Name() const override;

  // The registration with this server that holds the client's current
  // region (0: none): its tensors may lie there.
  uint64_t region_worker() const { return region_worker_.load(std::memory_order_acquire); }

 private:
  template <typename F>
  absl::Status WithRetries(F call);
  // Hands the region over for the registration `response` made, if the
  // server offered to take it; says once which way tensors go.
  void OfferRegion(const v1::RegisterResponse& response);

  ServerRoutes* const routes_;
  const size_t index_;
  const absl::Duration deadline_;
  const std::shared_ptr<RegionHolder> regions_;
  const std::string host_;  // SameHostIdentity, where there are regions
  std::atomic<uint64_t> region_worker_{0};
  int said_ = -1;  // which way tensors went when last said: 1 region, 0 TCP
};

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_GRPC_MEMBERSHIP_H_
