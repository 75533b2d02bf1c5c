#include "worker/client/server_routes.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/server_route.h"

namespace segps {

void ServerRoutes::Way::Prepare(grpc::ClientContext* context) const {
  if (!header.empty()) context->AddMetadata(kServerHeader, header);
}

ServerRoutes::Way ServerRoutes::Way::Own(std::shared_ptr<grpc::Channel> channel, std::string name) {
  Way own;
  own.stub = v1::ParameterServer::NewStub(channel);
  own.generic = std::make_shared<grpc::GenericStub>(channel);
  own.name = std::move(name);
  return own;
}

ServerRoutes::ServerRoutes(std::vector<Way> own)
    : ways_(own.size()), current_(new std::atomic<size_t>[own.size()]) {
  for (size_t i = 0; i < own.size(); ++i) {
    ways_[i].push_back(std::move(own[i]));
    current_[i].store(0);
  }
}

namespace {

std::vector<ServerRoutes::Way> OwnWays(const std::vector<std::string>& addresses,
                                       const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                       const grpc::ChannelArguments& args) {
  std::vector<ServerRoutes::Way> own;
  for (size_t i = 0; i < addresses.size(); ++i) {
    own.push_back(ServerRoutes::Way::Own(grpc::CreateCustomChannel(addresses[i], credentials, args),
                                         absl::StrCat("server ", i, " (", addresses[i], ")")));
  }
  return own;
}

}  // namespace

ServerRoutes::ServerRoutes(const ShardMap& map, const std::vector<std::string>& addresses,
                           const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                           const grpc::ChannelArguments& args, absl::Duration lease)
    : ServerRoutes(OwnWays(addresses, credentials, args)) {
  if (map.replicas() < 2) return;
  retry_cap_ = std::clamp(lease / 20, absl::Milliseconds(20), absl::Seconds(1));
  for (auto& ways : ways_) ways.front().patience = lease;
  for (size_t i = 0; i < addresses.size(); ++i) {
    const uint32_t backup = map.holders(static_cast<uint32_t>(i))[1];
    Way through = ways_[backup].front();  // the backup's channel and stubs, shared
    through.name = absl::StrCat("server ", i, " (through server ", backup, " at ", addresses[backup], ")");
    through.header = absl::StrCat(i);
    through.patience = lease;
    ways_[i].push_back(std::move(through));
  }
}

const ServerRoutes::Way& ServerRoutes::way(size_t i) const { return ways_[i][current_[i].load()]; }

void ServerRoutes::Failed(size_t i) {
  size_t now = current_[i].load();
  current_[i].compare_exchange_strong(now, (now + 1) % ways_[i].size());
}

}  // namespace segps
