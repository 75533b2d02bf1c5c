// How a worker (or the evaluator) talks to the parameter servers of a
// cluster: one call per server per step, all servers at once, each slice
// landing straight in the caller's buffer.
//
// Every call has a deadline (a push or pull, sent on a stream that stays
// open, a time within which its reply must come) and retries transient failures
// (UNAVAILABLE, DEADLINE_EXCEEDED) with exponential backoff within the
// config's budget; other errors come back at once, naming the server.
//
// Thread safety: the tensor calls and Heartbeat may be made from any
// thread; Register and Leave must not overlap other calls. A pull's or
// push's completion is set on whichever thread drives the client's queue
// (its own, or one waiting in a blocking call).
#ifndef SEGPS_WORKER_CLIENT_PS_CLIENT_H_
#define SEGPS_WORKER_CLIENT_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/shard_map.h"
#include "segps/v1/config.pb.h"
#include "segps/v1/parameter_server.pb.h"
#include "worker/client/completion.h"

namespace segps {

// A gradient encoded for the wire, split by server: the one copy a push
// makes, done on the caller's thread so that the caller's buffer is free
// again at once. Shared, read-only, by the calls that send it (a retry
// sends it again).
struct EncodedPush {
  int segment = 0;
  uint64_t clock = 0;
  v1::DType dtype = v1::FLOAT32;  // of the values
  // Per server: its range's values (sparse: its entries' values) as the
  // wire carries them, held by `storage`.
  std::vector<absl::string_view> values;
  std::shared_ptr<const char> storage;
  // Sparse only: the entries' positions in the segment, ascending, and the
  // first entry of each server's range (one more: the end).
  bool sparse = false;
  std::vector<uint64_t> indices;
  std::vector<size_t> server_entries;
  // Balanced training: the samples behind the gradient (the servers weight
  // it by them) and the worker's compute throughput (server 0 balances by it).
  std::optional<uint32_t> samples;
  float samples_per_second = 0;
  // Per server: the step's embedding row gradients it holds (EncodeRows),
  // sent with the step's first message to it: per table it holds rows of,
  // their ids in `rows` and their values (ids x dim floats) in the view of
  // `row_values` beside it, held by `row_storage`.
  std::vector<std::vector<v1::Rows>> rows;
  std::vector<std::vector<absl::string_view>> row_values;
  std::shared_ptr<const char> row_storage;
};

// Per server and table of segment `segment`: the positions in ids[t] of
// the rows that server holds (RowServer), ascending.
using RowSplit = std::vector<std::vector<std::vector<uint32_t>>>;
RowSplit SplitRows(int segment, uint32_t num_servers, const std::vector<std::vector<uint64_t>>& ids);
// Per server, the ids of `split` (one Rows a table it holds rows of, in
// table order): what a pull asks each server for.
std::vector<std::vector<v1::Rows>> RowsByServer(const RowSplit& split, const std::vector<std::vector<uint64_t>>& ids);
// Where a pull asked one table's rows to be written in the client's shared
// region (worker/client/region_rows.h): the place here, and its offset.
struct RowPlace {
  const char* data = nullptr;
  uint64_t offset = 0;
};
// Copies the rows of one server's reply into `values` (per table, ids x
// dim), row k of its table t to position positions[t][k] of ids[t]; the
// reply must hold exactly the rows asked (bytes from a server are checked),
// their values in the message, or, for a table with a place in `placed`
// (per table; empty: none), at that place, which the reply must name.
absl::Status LandRows(const v1::PullResponse& reply, const v1::SegmentConfig& config,
                      const std::vector<std::vector<uint64_t>>& ids, const std::vector<std::vector<uint32_t>>& positions,
                      absl::Span<const RowPlace> placed, std::vector<std::vector<float>>* values);

// The gradient `grad` of a segment (segment_size floats) encoded as `dtype`
// for the servers of `map`; and a sparse one: `values` at the ascending
// segment positions `indices`, zeros elsewhere.
// Where an encoded push's bytes go: a block of that many bytes, or null
// for the heap (worker/client/region_arena.h).
using PushStorage = std::function<std::shared_ptr<char>(size_t bytes)>;
std::unique_ptr<EncodedPush> EncodeDense(const ShardMap& map, v1::DType dtype, int segment, uint64_t clock,
                                         absl::Span<const float> grad, const PushStorage& allocate = nullptr);
std::unique_ptr<EncodedPush> EncodeSparse(const ShardMap& map, v1::DType dtype, int segment, uint64_t clock,
                                          absl::Span<const uint64_t> indices, absl::Span<const float> values,
                                          const PushStorage& allocate = nullptr);
// Attaches a step's embedding row gradients to `push`, split by server:
// per table of `config`, distinct `ids` and ids x dim floats of `grads`,
// copied once, into storage from `allocate`.
void EncodeRows(const v1::SegmentConfig& config, uint32_t num_servers, const std::vector<std::vector<uint64_t>>& ids,
                const std::vector<std::vector<float>>& grads, const PushStorage& allocate, EncodedPush* push);

struct Registration {
  uint64_t start_clock = 0;  // the clock of the worker's first push
  uint32_t rank = 0;
  // Some server knew the rank from before (RegisterResponse.rank_clock): a
  // process restarted, or a registration that lapsed.
  bool known = false;
  // A chain: the clocks at which every server holds a checkpoint of every
  // stage (RegisterResponse.chain_checkpoint_clocks), ascending.
  std::vector<uint64_t> chain_checkpoint_clocks;
  // A chain: the clock every stage of the rank's lane is at on every
  // server, none of it partly applied (RegisterResponse.lane_clocks); unset
  // where they differ.
  std::optional<uint64_t> lane_clock;
  // Each server's generation of the segment (RegisterResponse.generation):
  // a rollback moves it on.
  std::vector<uint64_t> generations;
};

// A pull's or a pull-carrying push's result: the clock the values reflect
// (the minimum over servers).
using PulledAt = absl::StatusOr<uint64_t>;

// A worker's steps first..last (inclusive) whose pushes it holds, computed
// and not acknowledged by every server (ParameterClient::HoldSteps).
struct HeldSteps {
  uint64_t first = 0;
  uint64_t last = 0;
};

class ParameterClient {
 public:
  virtual ~ParameterClient() = default;

  // Registers as worker `rank` of `segment` with every server (waiting for
  // servers that are still starting); without a rank, server 0 assigns the
  // lowest free one.
  virtual absl::StatusOr<Registration> Register(int segment, std::optional<uint32_t> rank) = 0;
  // Early stopping: the epoch length the registrations from now on give
  // (RegisterRequest.epoch_clocks; 0: none).
  virtual void SetEpochClocks(uint64_t epoch_clocks) = 0;
  // The registrations from now on come from a worker that holds the pushes
  // of its steps `held`, computed and not acknowledged by every server
  // (nullopt: none): servers whose rank clocks all lie in [first, last + 1]
  // disagree only on which of those pushes reached them, so the worker
  // continues at the lowest of their clocks and sends its pushes from there
  // again, with no rollback (client/membership.h).
  virtual void HoldSteps(std::optional<HeldSteps> held) = 0;
  // A chain (model.combine: CHAIN): rolls every stage's segment back to its
  // checkpoint at `clock` on every server (RollbackRequest.chain), through
  // this client's registration of `segment`, which it drops: register
  // again. A registration another stage's rollback dropped already is fine.
  virtual absl::Status RollBackChain(int segment, uint64_t clock) = 0;

  // The tensor traffic, started without waiting. Pulls run one at a time in
  // the order started, as do pushes; a pull may pass a push.
  //
  // Pulls the segment's parameters into `dest` (segment_size floats, left
  // alone by the caller until done) once the staleness bound allows
  // computing `clock`. Without a registration it reads as an observer and
  // never waits.
  virtual Completion<PulledAt> StartPull(int segment, uint64_t clock, absl::Span<float> dest) = 0;
  // Sends a push to every server; done when all acknowledged it. Safe to
  // retry: a server applies each (worker, clock) once.
  virtual Completion<absl::Status> StartSend(std::shared_ptr<const EncodedPush> push) = 0;
  // StartSend, then the pull for the push's clock + 1 into `dest`, in the
  // same messages (one per server, or per chunk): a synchronous step's round.
  virtual Completion<PulledAt> StartSendAndPull(std::shared_ptr<const EncodedPush> push,
                                                  absl::Span<float> dest) = 0;

  // The same, waiting for the result (a client may drive its calls on the
  // waiting thread meanwhile).
  virtual PulledAt Pull(int segment, uint64_t clock, absl::Span<float> dest) {
    return StartPull(segment, clock, dest).Wait();
  }
  virtual absl::Status Send(std::shared_ptr<const EncodedPush> push) { return StartSend(std::move(push)).Wait(); }
  virtual PulledAt SendAndPull(std::shared_ptr<const EncodedPush> push, absl::Span<float> dest) {
    return StartSendAndPull(std::move(push), dest).Wait();
  }

  // The gradient of step `clock` encoded for these servers (segment_size
  // floats), dense or sparse (EncodeDense, EncodeSparse).
  virtual std::unique_ptr<EncodedPush> Encode(int segment, uint64_t clock, absl::Span<const float> grad) = 0;
  virtual std::unique_ptr<EncodedPush> EncodeSparse(int segment, uint64_t clock, absl::Span<const uint64_t> indices,
                                                    absl::Span<const float> values) = 0;
  // Attaches the step's embedding row gradients to its push (EncodeRows):
  // per table, the distinct ids pulled and ids x dim floats.
  virtual void EncodeRows(EncodedPush* push, const std::vector<std::vector<uint64_t>>& ids,
                          const std::vector<std::vector<float>>& grads) = 0;

  // Reads rows of the segment's embedding tables once the staleness bound
  // allows computing `clock` (as StartPull; an observer without a
  // registration): per table, the distinct `ids`, into `values` (per
  // table, ids x dim floats in the same order).
  virtual absl::Status PullRows(int segment, uint64_t clock, const std::vector<std::vector<uint64_t>>& ids,
                                std::vector<std::vector<float>>* values) {
    (void)segment, (void)clock, (void)ids, (void)values;
    return absl::UnimplementedError("PullRows: this client has no embedding rows");
  }
  // PullRows, started without waiting: `ids` and `values` are the call's
  // until it is done (a prefetch of the next batch's rows).
  virtual Completion<absl::Status> StartPullRows(int segment, uint64_t clock,
                                                 const std::vector<std::vector<uint64_t>>& ids,
                                                 std::vector<std::vector<float>>* values) {
    return Completion<absl::Status>::Done(PullRows(segment, clock, ids, values));
  }

  // Renews the lease on every server; FAILED_PRECONDITION if one dropped us.
  virtual absl::Status Heartbeat() = 0;
  // Fails the pulls and pushes in flight with `cause`, as if their servers
  // had answered it: how a heartbeat that finds this worker's registration
  // dropped on one server wakes calls parked on the others (which may wait
  // for peers that wait for this worker). Any thread.
  virtual void Interrupt(const absl::Status& cause) = 0;
  // Leaves every server, so that peers no longer wait for this worker; the
  // steps of its rank each server applied, in index order. With
  // `end_at_clock` (early stopping, rank 0): every server ends the segment
  // at its checkpoint of that clock (LeaveRequest.end_at_clock).
  virtual absl::StatusOr<std::vector<uint64_t>> Leave(std::optional<uint64_t> end_at_clock) = 0;

  // Every server's counters and clocks, in index order.
  virtual absl::StatusOr<std::vector<v1::StatsResponse>> Stats() = 0;

  // A balanced segment (training.balance): the samples per clock of each
  // rank at `clock`, as server 0's replies so far decided them; nullopt
  // while they may still change (or server 0 sent none).
  virtual std::optional<std::vector<uint32_t>> Shares(int segment, uint64_t clock) = 0;
};

// The servers a tool talks to: the comma-separated host:port list of a
// --servers flag, or (flag empty) the config's cluster.server_addresses.
std::vector<std::string> ServerAddresses(const std::string& flag, const v1::JobConfig& config);

// Every segment's parameters, read from the servers as an observer (no
// registration, no wait).
absl::StatusOr<std::vector<std::vector<float>>> PullParameters(ParameterClient& client,
                                                               const v1::ModelConfig& model, uint32_t num_servers);

// Every embedding table of every segment, dense: [segment][table], vocab x
// dim floats, every row as the servers serve it (a row never pushed is its
// deterministic initial value), read as an observer `page_rows` ids a call.
// A table over `max_bytes` is refused, naming it, before anything is read.
absl::StatusOr<std::vector<std::vector<std::vector<float>>>> PullTables(ParameterClient& client,
                                                                        const v1::ModelConfig& model,
                                                                        uint64_t max_bytes,
                                                                        uint64_t page_rows = 65536);

// The config's shard map, where `addresses` (one per server, in index order)
// are as many as its servers; INVALID_ARGUMENT naming both counts if not.
absl::StatusOr<ShardMap> MapOfServers(const v1::JobConfig& config, const std::vector<std::string>& addresses);

// A client over gRPC to `addresses` (one per server, in index order).
absl::StatusOr<std::unique_ptr<ParameterClient>> ConnectGrpc(const v1::JobConfig& config,
                                                             const std::vector<std::string>& addresses);

}  // namespace segps

#endif  // SEGPS_WORKER_CLIENT_PS_CLIENT_H_
