#include "common/security.h"

#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

ABSL_FLAG(std::string, tls_ca, "", "PEM file of the CA (security.ca_cert).");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain this process presents (security.cert).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (security.key).");
ABSL_FLAG(std::string, token_file, "", "Bearer tokens, `ROLE TOKEN` a line (security.token_file).");
ABSL_FLAG(bool, require_client_cert, false, "Servers: mutual TLS (security.require_client_cert).");

namespace segps {
namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& path, const char* field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("security.", field, ": ", path, ": cannot be opened"));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) return absl::InvalidArgumentError(absl::StrCat("security.", field, ": ", path, ": empty"));
  return text.str();
}

// The line of `tokens` whose secret a call's `authorization` value
// ("Bearer SECRET") carries; every line compared, in constant time each.
std::optional<size_t> MatchToken(const std::string& value, const std::vector<Token>& tokens) {
  const std::string presented(absl::StripPrefix(value, "Bearer "));
  if (presented.size() == value.size()) return std::nullopt;
  std::optional<size_t> match;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (ConstantTimeEqual(presented, tokens[i].secret) && !match.has_value()) match = i;
  }
  return match;
}

// Refuses a call without a token the server takes before it reaches the
// service. The token stays in the call's metadata: the service reads the
// role from there, call by call (CallerOf).
class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}
  bool IsBlocking() const override { return false; }  // a few comparisons: inline

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "no bearer token: this server requires `authorization: Bearer TOKEN` (security.token_file)");
    }
    if (!MatchToken(std::string(it->second.data(), it->second.size()), tokens_).has_value()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not one this server accepts");
    }
    return grpc::Status::OK;
  }

 private:
  const std::vector<Token> tokens_;
};

// The bearer token as call metadata on a channel of any security level:
// AccessTokenCredentials asks for privacy and integrity, which a loopback
// connection without TLS does not claim.
class BearerToken final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerToken(std::string token) : header_("Bearer " + std::move(token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->emplace("authorization", header_);
    return grpc::Status::OK;
  }

 private:
  const std::string header_;
};

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1";
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void ApplySecurityFlags(v1::SecurityConfig* config) {
  if (!absl::GetFlag(FLAGS_tls_ca).empty()) config->set_ca_cert(absl::GetFlag(FLAGS_tls_ca));
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) config->set_cert(absl::GetFlag(FLAGS_tls_cert));
  if (!absl::GetFlag(FLAGS_tls_key).empty()) config->set_key(absl::GetFlag(FLAGS_tls_key));
  if (!absl::GetFlag(FLAGS_token_file).empty()) config->set_token_file(absl::GetFlag(FLAGS_token_file));
  if (absl::GetFlag(FLAGS_require_client_cert)) config->set_require_client_cert(true);
}

absl::StatusOr<std::vector<Token>> ParseTokens(const std::string& text, const std::string& file) {
  std::vector<Token> tokens;
  int number = 0, servers = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(file, " line ", number, ": ");
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(where, "expected `ROLE TOKEN` (two fields), got ", fields.size()));
    }
    Token token;
    if (fields[0] == "worker") {
      token.role = Role::kWorker;
    } else if (fields[0] == "reader") {
      token.role = Role::kReader;
    } else if (fields[0] == "server") {
      token.role = Role::kServer;
      if (servers++ > 0) return absl::InvalidArgumentError(absl::StrCat(where, "a second `server` line"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "role must be worker, reader or server, got '", fields[0], "'"));
    }
    if (fields[1].size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the token is ", fields[1].size(),
                                                     " characters; use at least 16 (e.g. openssl rand -hex 16)"));
    }
    token.secret = std::string(fields[1]);
    tokens.push_back(std::move(token));
  }
  if (tokens.size() == static_cast<size_t>(servers)) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": no `worker TOKEN` or `reader TOKEN` line"));
  }
  return tokens;
}

absl::StatusOr<Security> LoadSecurity(const v1::SecurityConfig& config) {
  Security security;
  security.require_client_cert = config.require_client_cert();
  const std::pair<const std::string*, std::string*> files[] = {
      {&config.ca_cert(), &security.ca_cert}, {&config.cert(), &security.cert}, {&config.key(), &security.key}};
  const char* names[] = {"ca_cert", "cert", "key"};
  for (int i = 0; i < 3; ++i) {
    if (files[i].first->empty()) continue;
    absl::StatusOr<std::string> text = ReadWhole(*files[i].first, names[i]);
    if (!text.ok()) return text.status();
    *files[i].second = *std::move(text);
  }
  if (security.cert.empty() != security.key.empty()) {
    return absl::InvalidArgumentError("security: cert and key go together (--tls_cert, --tls_key)");
  }
  if (!config.token_file().empty()) {
    absl::StatusOr<std::string> text = ReadWhole(config.token_file(), "token_file");
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<Token>> tokens = ParseTokens(*text, config.token_file());
    if (!tokens.ok()) return tokens.status();
    for (Token& token : *tokens) {
      if (token.role == Role::kServer) {
        security.state_key = std::move(token.secret);
      } else {
        security.tokens.push_back(std::move(token));
      }
    }
  }
  return security;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const Security& security) {
  if (security.cert.empty()) {
    if (security.require_client_cert) {
      return absl::InvalidArgumentError(
          "security: client certificates need TLS: give the server a certificate and key (--tls_cert, "
          "--tls_key; deploy/make-certs.sh makes them)");
    }
    if (security.tokens.empty()) return grpc::InsecureServerCredentials();
    // Tokens without TLS: loopback connections only (a token would cross
    // no network), which gRPC's local credentials check peer by peer.
    std::shared_ptr<grpc::ServerCredentials> local = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
    local->SetAuthMetadataProcessor(std::make_shared<TokenProcessor>(security.tokens));
    return local;
  }
  if (security.require_client_cert && security.ca_cert.empty()) {
    return absl::InvalidArgumentError("security.require_client_cert needs ca_cert (--tls_ca) to verify clients against");
  }
  grpc::SslServerCredentialsOptions options(security.require_client_cert
                                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = security.ca_cert;
  options.pem_key_cert_pairs.push_back({security.key, security.cert});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  if (!security.tokens.empty()) {
    credentials->SetAuthMetadataProcessor(std::make_shared<TokenProcessor>(security.tokens));
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> LoadChannelCredentials(const v1::SecurityConfig& config) {
  absl::StatusOr<Security> security = LoadSecurity(config);
  if (!security.ok()) return security.status();
  return ChannelCredentials(*security);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const Security& security) {
  if (!security.tls()) {
    if (security.tokens.empty()) return grpc::InsecureChannelCredentials();
    // Without TLS a token goes to loopback servers only (the local
    // credentials refuse any other peer).
    return grpc::CompositeChannelCredentials(
        grpc::experimental::LocalCredentials(LOCAL_TCP),
        grpc::experimental::MetadataCredentialsFromPlugin(std::make_unique<BearerToken>(security.tokens[0].secret),
                                            GRPC_SECURITY_NONE));
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = security.ca_cert;
  options.pem_private_key = security.key;
  options.pem_cert_chain = security.cert;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  if (security.tokens.empty()) return credentials;
  return grpc::CompositeChannelCredentials(credentials, grpc::AccessTokenCredentials(security.tokens[0].secret));
}

Caller CallerOf(const grpc::ServerContextBase& context, const std::vector<Token>& tokens) {
  Caller caller;
  caller.tokens_on = !tokens.empty();
  if (caller.tokens_on) {
    // The call's own header (one per call: a second would be a client's
    // doing, and only the first is read, as the token check reads it).
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    const std::optional<size_t> line =
        it == metadata.end() ? std::nullopt : MatchToken(std::string(it->second.data(), it->second.size()), tokens);
    if (line.has_value()) {
      caller.role = tokens[*line].role;
      caller.identity = absl::StrCat("token ", *line);
    }
  }
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
      caller.identity.append(" cert ").append(name.data(), name.size());
    }
  }
  return caller;
}

absl::Status AuthorizeCall(const Caller& caller, bool worker_call, const char* method) {
  if (!caller.tokens_on) return absl::OkStatus();
  if (!caller.role.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat(method, ": the bearer token is not one this server accepts"));
  }
  if (*caller.role == Role::kWorker || !worker_call) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(method, ": a reader token may only read (Stats, reader pulls, health); this call needs a worker token"));
}

}  // namespace segps
