// The calls a segment shard holds (server/segment_shard.h): their results,
// and the parked ones, until the staleness bound, the worker's previous step
// or a checkpoint lets them go: pulls by the segment clock they need,
// pushes in arrival order, and how many each worker has parked, at most
// max_per_worker, so that one worker cannot fill the server.
//
// Thread safety: none; the shard's lock guards it.
#ifndef SEGPS_SERVER_PARKED_CALLS_H_
#define SEGPS_SERVER_PARKED_CALLS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/tensor_wire.h"
#include "common/uninit_vector.h"
#include "segps/v1/parameter_server.pb.h"
#include "server/embedding_table.h"

namespace segps {

struct PullResult {
  uint64_t clock = 0;  // the values pulled reflect every step below it
  uint64_t updates = 0;
  absl::Duration blocked;  // time waiting on the staleness bound
  // The deciding server of a balanced segment, a worker's pull: the shares
  // from the pull's clock on.
  std::optional<v1::SharePlan> plan;
};

// What a push says beside its gradient.
struct PushInfo {
  std::optional<uint32_t> samples;  // behind the gradient; unset: batch_size
  double samples_per_second = 0;    // the worker's throughput; 0: unknown
  float max_abs_gradient = 0;       // the gradient's largest magnitude (finite)
};

struct PushResult {
  bool applied = false;
  uint64_t next_clock = 0;
  uint32_t rank = 0;
  absl::Duration apply;  // time in the optimizer
  // With embedding rows: those updated, and what the segment's tables hold after.
  uint64_t rows_pushed = 0, rows_held = 0, rows_bytes = 0;
  std::optional<PullResult> pulled;  // a push with a pull: the pull's result
  // cluster.replicas: the push is acknowledged once the range's backups
  // hold every record through this one (ReplicaLog::WhenHeld).
  uint64_t replica_seq = 0;
};

// Hands a pull's values to the caller, under the shard's lock (to copy or
// encode them).
using ReadRange = absl::AnyInvocable<void(absl::Span<const float>)>;
using PullDone = absl::AnyInvocable<void(absl::StatusOr<PullResult>) &&>;
using PushDone = absl::AnyInvocable<void(absl::StatusOr<PushResult>) &&>;

// A segment's embedding tables on this server, in the config's order.
using EmbeddingTables = std::vector<std::unique_ptr<EmbeddingTable>>;
// A push's summed gradients of one table's rows (checked: distinct ids in
// range, held here, finite values).
struct RowGradients {
  uint32_t table = 0;
  UninitVector<uint64_t> ids;
  UninitVector<float> values;  // ids x dim
  // A pull's rows asked into the caller's shared region: the place there
  // (ids x dim floats) and its byte offset.
  float* region_values = nullptr;
  uint64_t region_offset = 0;
};
// Reads a pull's rows from the tables, under the shard's lock.
using ReadRows = absl::AnyInvocable<void(const EmbeddingTables&)>;

// A parked call: a pull behind the bound, a push (grad set) waiting for
// its predecessor, or a push with a pull whose push is applied (pushed set).
struct Waiter {
  Waiter(uint64_t id, uint64_t clock, uint64_t first, uint64_t count, absl::Time deadline, ReadRange read)
      : id(id), clock(clock), first(first), count(count), deadline(deadline), read(std::move(read)) {}
  uint64_t id = 0, clock = 0, first = 0, count = 0;
  absl::Time deadline, since;
  ReadRange read;           // the pull's (or a push's follow-up pull's)
  const DenseView* grad = nullptr;  // a push not yet applied
  const std::vector<RowGradients>* rows = nullptr;  // a push's rows (its first message)
  ReadRows read_rows;                               // a pull's rows
  PushInfo info;                     // a push's
  PullDone pull_done;        // a pull
  PushDone push_done;        // a push, with or without a pull
  std::optional<PushResult> pushed;  // a push applied, its pull waiting
};

class ParkedCalls {
 public:
  ParkedCalls(int segment, uint32_t max_per_worker) : segment_(segment), max_per_worker_(max_per_worker) {}

  // Parks a pull that needs the segment at clock `needed`, or a push;
  // RESOURCE_EXHAUSTED, naming `call`, with `waiter` left to the caller
  // when its worker has max_per_worker calls parked already.
  absl::Status ParkPull(uint64_t needed, std::unique_ptr<Waiter>& waiter, const char* call);
  absl::Status ParkPush(std::unique_ptr<Waiter>& waiter, const char* call);

  // The pushes, in arrival order, still counted as parked: each is given
  // back with Repark or let go with Unpark.
  std::vector<std::unique_ptr<Waiter>> TakePushes();
  void Repark(std::unique_ptr<Waiter> push) { pushes_.push_back(std::move(push)); }
  void Unpark(uint64_t id);
  // The pulls needing at most clock `reachable` for which `ready` holds, in
  // order of the clock they need, unparked.
  std::vector<std::unique_ptr<Waiter>> ReleasePulls(uint64_t reachable, absl::FunctionRef<bool(const Waiter&)> ready);
  // Calls let go, the parked pulls' apart (a push with a pull waits as a
  // pull once its push is applied).
  struct Released {
    std::vector<std::unique_ptr<Waiter>> pulls, pushes;
  };
  // The calls past their deadline at `now`, unparked.
  Released ReleaseExpired(absl::Time now);
  // Worker `id`'s calls, unparked.
  Released ReleaseOf(uint64_t id);
  // Every call, unparked.
  std::vector<std::unique_ptr<Waiter>> ReleaseAll();

  // The workers with a call parked, once per call.
  std::vector<uint64_t> Waiting() const;
  size_t size() const { return pulls_.size() + pushes_.size(); }

 private:
  absl::Status Count(const Waiter& waiter, const char* call);
  Released ReleaseIf(absl::FunctionRef<bool(const Waiter&)> release);

  const int segment_;
  const uint32_t max_per_worker_;
  std::multimap<uint64_t, std::unique_ptr<Waiter>> pulls_;  // by the segment clock they need
  std::vector<std::unique_ptr<Waiter>> pushes_;
  std::map<uint64_t, uint32_t> per_worker_;  // parked calls per worker
};

}  // namespace segps

#endif  // SEGPS_SERVER_PARKED_CALLS_H_
