// Seals a server's statement of a rank's state (v1::SealedRankState) with
// the key the servers share and no client holds, so that a worker can
// carry the states of every server to one of them (RollbackRequest.states)
// and that server can tell them from states the worker made up.
//
// The seal is HMAC-SHA256 over a fixed encoding of the state's fields (not
// its protobuf bytes, which no two versions need encode alike).
#ifndef SEGPS_SERVER_STATE_SEAL_H_
#define SEGPS_SERVER_STATE_SEAL_H_

#include <string>

#include "segps/v1/parameter_server.pb.h"
#include "segps/v1/replication.pb.h"

namespace segps {

// Sets state->seal from the other fields; `key` must not be empty.
void SealState(const std::string& key, v1::SealedRankState* state);

// Whether state.seal is the one SealState gives its fields under `key`
// (compared in constant time).
bool SealHolds(const std::string& key, const v1::SealedRankState& state);

// The same for a primary's hello to a backup (ReplicaHello.proof): only a
// server, which holds the key, can write a backup.
void SealHello(const std::string& key, v1::ReplicaHello* hello);
bool HelloSealHolds(const std::string& key, const v1::ReplicaHello& hello);

}  // namespace segps

#endif  // SEGPS_SERVER_STATE_SEAL_H_
