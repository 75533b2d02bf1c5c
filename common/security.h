// TLS and bearer tokens for every segps gRPC endpoint (the config's
// `security`, or flags of the same meaning on every binary).
//
// Servers: TLS with a certificate and key; with require_client_cert, only
// clients whose certificate chains to the CA (mutual TLS); with a token
// file, every call must carry `authorization: Bearer TOKEN` for one of its
// lines, checked in constant time by an auth metadata processor, and the
// role of the token on each call decides what that call may do (CallerOf,
// AuthorizeCall). Clients:
// verify the server against the CA, present their certificate if given,
// and send the first token of their token file with every call.
#ifndef SEGPS_COMMON_SECURITY_H_
#define SEGPS_COMMON_SECURITY_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"

namespace segps {

// kServer is no caller's role: a token file's `server` line is the key
// the servers seal their states with (Security::state_key).
enum class Role { kWorker, kReader, kServer };

struct Token {
  Role role = Role::kWorker;
  std::string secret;
};

// The files a SecurityConfig names, read and checked.
struct Security {
  std::string ca_cert, cert, key;  // PEM text; empty where not given
  bool require_client_cert = false;
  std::vector<Token> tokens;  // the worker and reader lines, in file order
  // The token file's `server` line: a secret of the servers alone (never in
  // a client's file), the key of their sealed rank states
  // (server/state_seal.h). Empty without one.
  std::string state_key;
  bool tls() const { return !cert.empty() || !ca_cert.empty(); }
};

// Overrides `config`'s security fields with the flags given on the command
// line (--tls_ca, --tls_cert, --tls_key, --token_file, --require_client_cert).
void ApplySecurityFlags(v1::SecurityConfig* config);

// Reads the files; errors name the file (and, for tokens, the line).
absl::StatusOr<Security> LoadSecurity(const v1::SecurityConfig& config);

// A token file's lines: `ROLE TOKEN`, ROLE worker, reader or (a server's
// file, at most once) server; `#` comments. At least one worker or reader.
absl::StatusOr<std::vector<Token>> ParseTokens(const std::string& text, const std::string& file);

// What a server listens with: plaintext, TLS, or mutual TLS, with the token
// check installed when there are tokens. Tokens without TLS (a job on one
// host: segps-local makes a token per job) are taken from loopback peers
// only, which gRPC's local credentials check. Errors on settings that
// cannot work (require_client_cert without a certificate or a CA).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const Security& security);

// What a client connects with: plaintext, or TLS verifying the server
// against the CA (the system's roots without one), with its certificate
// for mutual TLS and its token as call credentials. A token without TLS
// goes to loopback servers only.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const Security& security);
// The same from the config: its files read (LoadSecurity), then made into
// credentials; errors name the file.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> LoadChannelCredentials(const v1::SecurityConfig& config);

// Whether `address` (host:port, [v6]:port) is reachable from this host
// only: localhost, 127.x, ::1.
bool IsLoopbackAddress(const std::string& address);

// Whether two secrets are equal, in time independent of where they differ
// (lengths are not secret).
bool ConstantTimeEqual(const std::string& a, const std::string& b);

// Who a server call comes from, decided for that call alone: the role of
// the bearer token the call itself carries (its `authorization` metadata),
// not a property of its connection, which other calls with other tokens may
// share; and the names its client certificate gives.
struct Caller {
  bool tokens_on = false;    // the server takes tokens
  std::optional<Role> role;  // the call's token's role; none without a token the server takes
  // Which token line and certificate, "token N cert NAME"; empty where
  // neither. A registration is bound to the identity that made it: no
  // other caller can act on it, even with its secret.
  std::string identity;
};
Caller CallerOf(const grpc::ServerContextBase& context, const std::vector<Token>& tokens);

// Whether the caller may make a call: OK where calls are not
// authenticated; UNAUTHENTICATED without a token the server takes;
// PERMISSION_DENIED for a reader token on a worker call.
absl::Status AuthorizeCall(const Caller& caller, bool worker_call, const char* method);

}  // namespace segps

#endif  // SEGPS_COMMON_SECURITY_H_
