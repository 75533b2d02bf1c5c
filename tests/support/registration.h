// Test helpers that register with a ParameterServer in process: the
// request a server of a job accepts, and a registered rank's first push.
#ifndef SEGPS_TESTS_SUPPORT_REGISTRATION_H_
#define SEGPS_TESTS_SUPPORT_REGISTRATION_H_

#include <gtest/gtest.h>

#include <vector>

#include "common/config.h"
#include "common/tensor_wire.h"
#include "server/parameter_server.h"

namespace segps {

// A registration for segment 0 (its rank left to the server) that `server`
// of `config` accepts.
inline v1::RegisterRequest RegistrationFor(const v1::JobConfig& config, const ParameterServer& server) {
  v1::RegisterRequest request;
  request.set_model_fingerprint(ModelFingerprint(config));
  request.set_shard_fingerprint(server.shard_map().fingerprint());
  return request;
}

// A rank registered with `server`, and its push of `value` to each element
// of segment 0's range 0 at clock 0.
inline v1::PushRequest RegisteredPush(const v1::JobConfig& config, ParameterServer* server, float value) {
  v1::RegisterResponse registered;
  EXPECT_TRUE(server->Register(RegistrationFor(config, *server), &registered).ok());
  const Range range = server->shard_map().range(0, 0);
  v1::PushRequest push;
  push.set_worker_id(registered.worker_id());
  push.set_registration_secret(registered.registration_secret());
  EncodeFloat32(std::vector<float>(range.count, value), range.offset, push.mutable_gradient());
  return push;
}

}  // namespace segps

#endif  // SEGPS_TESTS_SUPPORT_REGISTRATION_H_
