// The server's end of the same-host transport (cluster.shared_memory,
// common/shared_region.h): an abstract Unix socket on which workers of
// this host hand over their regions, one connection each, served in turn
// by a thread of its own.
//
// A connection is refused (told why, then closed) when its peer is another
// user, sends no RegionOffer within a second, offers a registration whose
// secret does not match, or a descriptor that is not a sealed memfd within
// the model's region size. A refusal changes nothing; the worker's tensors
// go over TCP.
#ifndef SEGPS_SERVER_REGION_LISTENER_H_
#define SEGPS_SERVER_REGION_LISTENER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shared_region.h"
#include "segps/v1/parameter_server.pb.h"

namespace segps {

class RegionListener {
 public:
  // Gives a mapped region to the registration the offer names.
  using Attach = std::function<absl::Status(const v1::RegionOffer& offer, std::shared_ptr<SharedRegion> region)>;
  // Listens on a fresh random name; regions larger than `max_bytes` are refused.
  static absl::StatusOr<std::unique_ptr<RegionListener>> Start(Attach attach, size_t max_bytes);
  ~RegionListener();  // stops serving and waits for the thread
  RegionListener(const RegionListener&) = delete;
  RegionListener& operator=(const RegionListener&) = delete;

  // The socket's abstract name (RegisterResponse.region_socket).
  const std::string& name() const { return name_; }

 private:
  RegionListener(Attach attach, size_t max_bytes, std::string name, int listener, int stop_read, int stop_write);
  void Run();
  // One connection: its offer, answered.
  void Serve(int connection);
  absl::Status Take(int connection);

  const Attach attach_;
  const size_t max_bytes_;
  const std::string name_;
  const int listener_, stop_read_, stop_write_;
  // Refusals not yet logged, and when the last line was (the thread's own).
  uint64_t refused_ = 0;
  absl::Time last_said_ = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace segps

#endif  // SEGPS_SERVER_REGION_LISTENER_H_
