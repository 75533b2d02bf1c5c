// How segps-local secures a job's processes: the flags each kind of
// process gets, and the directory of the job's secrets.
//
// By default a token per job: `tokens` (a worker and a reader line, the
// servers' file, with the `server` line only servers read) and
// `worker.token`, `reader.token`, made from the
// system's CSPRNG in a directory only the job's user may read. The job
// runs on loopback without TLS, and a server or stage link takes the
// tokens from loopback peers only (common/security.h), so a stranger on
// the host who cannot read the files is refused every call. With --tls,
// mutual TLS with tokens from deploy/make-certs.sh; with the config's own
// security block, nothing is added.
#ifndef SEGPS_DEPLOY_LOCAL_JOB_SECURITY_H_
#define SEGPS_DEPLOY_LOCAL_JOB_SECURITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "segps/v1/config.pb.h"

namespace segps {

struct JobSecurity {
  std::vector<std::string> server, worker, reader;  // flags of servers, workers, the evaluation and export
  std::vector<std::string> stage_link;              // a chain's stages after the first (their link's certificate)
  std::string dir;                                  // made for the job (to remove at its end); empty if none
  std::string banner;                               // what segps-local says of it
};

// `deploy_dir` holds make-certs.sh.
absl::StatusOr<JobSecurity> SecureJob(const v1::SecurityConfig& config, bool tls, const std::string& deploy_dir);

}  // namespace segps

#endif  // SEGPS_DEPLOY_LOCAL_JOB_SECURITY_H_
