// One server's part of an embedding table (SegmentConfig.embeddings): the
// rows it holds (RowServer) that a gradient has touched, each with its
// optimizer state beside its values. A row never touched is not stored:
// it reads as its initial value (InitialRow), the same in every process.
//
// Updates are lazy: a push changes only the rows it carries, and only
// their optimizer state moves (momentum and Adam's moments of other rows
// stay as they were; Adam's bias correction uses the segment's update
// count, as for the dense range). AdaGrad is unaffected: a row that gets
// no gradient would add nothing to its accumulator anyway.
//
// A push's rows are computed first and stored only if every one stays
// finite and the server's row budget (shared by all tables) takes the new
// ones: otherwise nothing changes.
//
// Thread safety: none; the segment shard's lock guards it. The budget is
// shared between shards and atomic.
#ifndef SEGPS_SERVER_EMBEDDING_TABLE_H_
#define SEGPS_SERVER_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "segps/v1/config.pb.h"

namespace segps {

// Rows one server may store, over all its tables (0: no limit).
class RowBudget {
 public:
  explicit RowBudget(uint64_t limit) : limit_(limit) {}
  // Takes `rows` more; false (taking none) when that would pass the limit.
  bool Take(uint64_t rows);
  void Give(uint64_t rows) { used_.fetch_sub(rows); }
  void Force(uint64_t rows) { used_.fetch_add(rows); }
  uint64_t used() const { return used_.load(); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// A table's stored rows, for checkpoints: ids ascending, and per id its
// values then its optimizer slots (dim floats each), row after row.
struct TableState {
  std::vector<uint64_t> ids;
  std::vector<float> rows;
};

class EmbeddingTable {
 public:
  // Table `table` of segment `segment`; `optimizer` validated (defaults
  // filled); `budget` outlives the table.
  EmbeddingTable(const v1::EmbeddingConfig& config, const v1::OptimizerConfig& optimizer, uint64_t seed,
                 int segment, uint32_t table, RowBudget* budget);
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  uint32_t dim() const { return config_.dim(); }
  size_t stored() const { return index_.size(); }
  // Floats a stored row takes: its values and its optimizer slots.
  size_t stride() const { return stride_; }

  // The rows of `ids` (dim floats each) into `out`.
  void Read(absl::Span<const uint64_t> ids, absl::Span<float> out) const;

  // The rows of `ids` updated by `grads` (ids x dim) as update `step`,
  // with the learning rate times `scale`: computed into the table's
  // scratch, then Commit stores them. An error (a value would not be
  // finite, the budget is spent) changes nothing.
  absl::Status Update(uint64_t step, float scale, absl::Span<const uint64_t> ids, absl::Span<const float> grads);
  // New rows the last Update needs room for.
  size_t pending_new() const { return pending_new_; }
  void Commit();

  TableState Save() const;
  // Replaces every row with `state`'s (validated by the caller: stride and
  // id range). The budget counts them even beyond its limit: they were
  // held before, and only new rows are refused.
  void Load(const TableState& state);

 private:
  // A row's values and state as initialised.
  void Initial(uint64_t id, float* row) const;
  // Where each of `ids` is stored (kNew: nowhere yet). A table far larger
  // than the caches would cost a miss or two a row, one after the other;
  // these look up and fetch the rows kAhead places ahead meanwhile.
  void Slots(absl::Span<const uint64_t> ids, std::vector<uint32_t>* slots) const;
  // Starts fetching row `r` of `slots` into the cache, if it is stored.
  void PrefetchRow(absl::Span<const uint32_t> slots, size_t r) const;
  static constexpr size_t kAhead = 16, kCacheLine = 64;

  const v1::EmbeddingConfig config_;
  const v1::OptimizerConfig optimizer_;
  const uint64_t seed_;
  const int segment_;
  const uint32_t table_;
  const size_t slots_, stride_;
  RowBudget* const budget_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;  // id -> its row in rows_
  std::vector<float> rows_;
  // The last Update's rows: ids, where each is stored (kNew: not yet), values.
  static constexpr uint32_t kNew = ~0u;
  std::vector<uint64_t> pending_ids_;
  std::vector<uint32_t> pending_slots_;
  std::vector<float> pending_;
  size_t pending_new_ = 0;
};

}  // namespace segps

#endif  // SEGPS_SERVER_EMBEDDING_TABLE_H_
