#include "server/state_seal.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdint>

#include "common/security.h"

namespace segps {
namespace {

void Append(std::string* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(value >> (8 * i)));
}

// Every field but the seal, each at a fixed width, after a tag naming what
// the bytes are (so that no other message sealed with the key reads alike).
std::string Encoding(const v1::SealedRankState& state) {
  std::string bytes = "segps.v1.SealedRankState";
  Append(&bytes, state.server_index());
  Append(&bytes, state.incarnation());
  Append(&bytes, state.generation());
  Append(&bytes, state.segment());
  Append(&bytes, state.rank());
  Append(&bytes, state.has_rank_clock() ? 1 : 0);
  Append(&bytes, state.rank_clock());
  Append(&bytes, state.partial() ? 1 : 0);
  Append(&bytes, static_cast<uint64_t>(state.sealed_at_ms()));
  return bytes;
}

std::string Encoding(const v1::ReplicaHello& hello) {
  std::string bytes = "segps.v1.ReplicaHello";
  Append(&bytes, hello.from_server());
  Append(&bytes, hello.to_server());
  Append(&bytes, hello.incarnation());
  Append(&bytes, hello.shard_fingerprint().size());
  bytes += hello.shard_fingerprint();
  return bytes;
}

template <typename Message>
std::string Mac(const std::string& key, const Message& message) {
  const std::string bytes = Encoding(message);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(bytes.data()),
       bytes.size(), mac, &length);
  return std::string(reinterpret_cast<const char*>(mac), length);
}

}  // namespace

void SealState(const std::string& key, v1::SealedRankState* state) { state->set_seal(Mac(key, *state)); }

bool SealHolds(const std::string& key, const v1::SealedRankState& state) {
  return ConstantTimeEqual(Mac(key, state), state.seal());
}

void SealHello(const std::string& key, v1::ReplicaHello* hello) { hello->set_proof(Mac(key, *hello)); }

bool HelloSealHolds(const std::string& key, const v1::ReplicaHello& hello) {
  return ConstantTimeEqual(Mac(key, hello), hello.proof());
}

}  // namespace segps
