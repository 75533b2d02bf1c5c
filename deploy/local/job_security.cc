#include "deploy/local/job_security.h"

#include <stdlib.h>
#include <sys/random.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace segps {
namespace {

// 32 hex digits from the system's CSPRNG.
absl::StatusOr<std::string> RandomToken() {
  std::string bytes(16, '\0');
  if (getrandom(bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
    return absl::UnavailableError("the system's random source failed");
  }
  return absl::BytesToHexString(bytes);
}

// Writes `text` to a new file `path`, made readable and writable by its
// owner only (never readable by others, not even for a moment).
absl::Status WritePrivate(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, S_IRUSR | S_IWUSR);
  const bool written = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int error = errno;
  if (fd >= 0) close(fd);
  if (!written) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(error)));
  return absl::OkStatus();
}

absl::StatusOr<std::string> MakeDir(const char* prefix) {
  std::string name = absl::StrCat("/tmp/", prefix, ".XXXXXX");  // mkdtemp makes it 0700
  if (mkdtemp(name.data()) == nullptr) return absl::UnavailableError(absl::StrCat("cannot make ", name));
  return name;
}

absl::StatusOr<JobSecurity> JobToken() {
  JobSecurity s;
  absl::StatusOr<std::string> dir = MakeDir("segps-token");
  if (!dir.ok()) return dir.status();
  s.dir = *dir;
  absl::StatusOr<std::string> worker = RandomToken(), reader = RandomToken(), server = RandomToken();
  if (!worker.ok()) return worker.status();
  if (!reader.ok()) return reader.status();
  if (!server.ok()) return server.status();
  const std::string tokens = absl::StrCat("worker ", *worker, "\nreader ", *reader, "\nserver ", *server, "\n");
  for (const auto& [file, text] : {std::pair{std::string("tokens"), tokens},
                                   std::pair{std::string("worker.token"), absl::StrCat("worker ", *worker, "\n")},
                                   std::pair{std::string("reader.token"), absl::StrCat("reader ", *reader, "\n")}}) {
    if (absl::Status written = WritePrivate(s.dir + "/" + file, text); !written.ok()) return written;
  }
  s.server = {"--token_file", s.dir + "/tokens"};
  s.worker = {"--token_file", s.dir + "/worker.token"};
  s.reader = {"--token_file", s.dir + "/reader.token"};
  s.banner = absl::StrCat("segps-local: on loopback with a token for this job (", s.dir,
                          ", readable by you only; --tls runs it over mutual TLS too)");
  return s;
}

absl::StatusOr<JobSecurity> MutualTls(const std::string& deploy_dir) {
  JobSecurity s;
  absl::StatusOr<std::string> dir = MakeDir("segps-certs");
  if (!dir.ok()) return dir.status();
  const std::string certs = s.dir = *dir;
  const std::string make =
      absl::StrCat("bash '", deploy_dir, "/make-certs.sh' '", certs, "' > '", certs, "/make-certs.log' 2>&1");
  if (std::system(make.c_str()) != 0) {
    std::ifstream log(certs + "/make-certs.log");
    std::stringstream text;
    text << log.rdbuf();
    return absl::UnavailableError(absl::StrCat("--tls: ", deploy_dir, "/make-certs.sh failed (is openssl installed?): ",
                                               text.str()));
  }
  s.server = {"--tls_ca", certs + "/ca.pem", "--tls_cert", certs + "/server.pem", "--tls_key",
              certs + "/server.key", "--token_file", certs + "/tokens", "--require_client_cert"};
  const std::vector<std::string> client = {"--tls_ca", certs + "/ca.pem", "--tls_cert", certs + "/client.pem",
                                           "--tls_key", certs + "/client.key", "--token_file"};
  s.worker = client;
  s.worker.push_back(certs + "/worker.token");
  s.reader = client;
  s.reader.push_back(certs + "/reader.token");
  // A chain's stage link listens as a server on loopback: the server certificate names it.
  s.stage_link = {"--stage_tls_cert", certs + "/server.pem", "--stage_tls_key", certs + "/server.key"};
  s.banner = absl::StrCat("segps-local: mutual TLS with bearer tokens; certificates and tokens made in ", certs);
  return s;
}

}  // namespace

absl::StatusOr<JobSecurity> SecureJob(const v1::SecurityConfig& config, bool tls, const std::string& deploy_dir) {
  if (tls) return MutualTls(deploy_dir);
  if (!config.cert().empty() || !config.token_file().empty()) {
    JobSecurity s;
    s.banner = "segps-local: the config's security block";
    return s;
  }
  return JobToken();
}

}  // namespace segps
