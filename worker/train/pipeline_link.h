// The links between neighbouring stages of a pipeline (combine: CHAIN), as
// one gRPC stream each (proto/segps/v1/pipeline.proto): a stage's
// Downstream sends activations to the next stage and reads its gradients;
// the next stage's Upstream accepts that stream, reads the activations and
// answers with gradients. TLS and tokens as for the parameter servers
// (config.security): the receiving stage accepts worker tokens only.
//
// Every message is checked: the sender's model fingerprint, stage and
// replica, the clock and micro-batch it should be next, its rows and the
// size of its values. A link that breaks, or a neighbour that sends nothing
// within the link's patience, fails the stage's step with a message naming
// the neighbour; the stage then recovers (engine.h): it resets its end of
// the link from the previous stage and reopens its link to the next, and
// the chain replays from a clock every stage holds (docs/recovery.md). A
// new stream from the previous stage takes the link from the one before.
//
// Thread safety: each link is driven by its stage's training thread; the
// Upstream's gRPC handler only hands its stream over.
#ifndef SEGPS_WORKER_TRAIN_PIPELINE_LINK_H_
#define SEGPS_WORKER_TRAIN_PIPELINE_LINK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/pipeline.pb.h"
#include "worker/train/link_messages.h"

namespace segps {

// Stage k > 0's end of the link from stage k - 1, replica r.
class Upstream {
 public:
  // Listens on `listen` (host:port; port 0 picks one) for replica `replica`
  // of stage `stage` - 1.
  static absl::StatusOr<std::unique_ptr<Upstream>> Listen(const v1::JobConfig& config, int stage, uint32_t replica,
                                                          const std::string& listen);
  virtual ~Upstream() = default;
  // host:port it listens on.
  virtual const std::string& address() const = 0;
  // The next micro-batch (in clock and micro-batch order), waiting up to
  // `patience` for the previous stage to connect or send.
  virtual absl::StatusOr<MicroBatch> Receive(absl::Duration patience) = 0;
  // The gradient with respect to the inputs of the micro-batch received
  // as (clock, micro_batch): rows x input width values.
  virtual absl::Status SendGradient(uint64_t clock, uint32_t micro_batch, absl::Span<const float> values) = 0;
  // The stage recovers: the stream it took messages from since the last
  // reset is ended (the previous stage learns of it and recovers too) and
  // what it left unread dropped. A newer stream, the previous stage's after
  // its own recovery, stays: the next Receive reads it from its start.
  // Until the reset, a newer stream's messages are refused (UNAVAILABLE).
  virtual void Reset() = 0;
};

// Stage k < K - 1's end of the link to stage k + 1, replica r.
class Downstream {
 public:
  // Connects to the next stage at `address`.
  static absl::StatusOr<std::unique_ptr<Downstream>> Connect(const v1::JobConfig& config, int stage, uint32_t replica,
                                                             const std::string& address);
  virtual ~Downstream() = default;
  // Sends micro-batch `micro_batch` of `clock` (a mini-batch of
  // `batch_rows`): its activations (rows x output width, encoded straight
  // into the message) and its labels.
  virtual absl::Status Send(uint64_t clock, uint32_t epoch, uint32_t micro_batch, uint32_t batch_rows,
                            absl::Span<const float> values, absl::Span<const int32_t> labels) = 0;
  // The gradient for the oldest micro-batch sent and not yet answered,
  // rows x output width values, waiting up to `patience`.
  virtual absl::StatusOr<std::vector<float>> ReceiveGradient(absl::Duration patience) = 0;
  // Tells the next stage that training is over and closes the link.
  virtual absl::Status Finish() = 0;
  // The stage recovers: ends the stream (the next stage learns of it) and
  // opens a new one, waiting for the next stage up to
  // cluster.recovery_timeout_ms (it may be starting again).
  virtual absl::Status Reopen() = 0;
};

}  // namespace segps

#endif  // SEGPS_WORKER_TRAIN_PIPELINE_LINK_H_
