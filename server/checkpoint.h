// Checkpoints: one server's range of one segment at one segment clock, on
// disk, in a format other tools open (safetensors).
//
// Layout. DIR/<segment>/clock-<c, 12 digits>/server-<i>-of-<S>.safetensors,
// so that the S servers' files of one clock sit in one directory and form
// the whole segment; DIR/server-<i>-of-<S>.json is this server's manifest
// (job, fingerprints, optimizer, each segment's clocks on disk and its
// tensors). Tensors are named as users name them
// ("segment1/dense_0/kernel", shape [in, out]); a range that cuts a tensor
// stores its part flat, and the header's metadata gives the part's element
// offset within the tensor ("segps.part.<name>": "OFFSET of SHAPE").
// Optimizer slots follow their tensor: "segment1/dense_0/kernel/adam_m".
//
// Integrity. Files are written atomically (temporary file, fsync, rename,
// fsync of the directory), so a crash leaves the previous checkpoint
// whole; a checksum over the data is verified on every read, and a file of
// another model, optimizer or server count is refused naming both
// fingerprints.
//
// Thread safety: all methods may be called concurrently.
#ifndef SEGPS_SERVER_CHECKPOINT_H_
#define SEGPS_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/safetensors.h"
#include "common/shard_map.h"
#include "common/sync.h"
#include "segps/v1/config.pb.h"
#include "server/embedding_table.h"

namespace segps {

// A segment's state on one server at a cut: what a checkpoint holds.
struct ShardState {
  uint64_t clock = 0;    // holds exactly the updates of every clock below it
  uint64_t steps = 0;    // optimizer updates begun (Adam's t)
  uint64_t updates = 0;  // steps completed, all workers
  std::vector<uint32_t> ranks;  // the ranks live at the cut: each resumes at `clock`
  std::vector<float> values;    // the server's range of the segment
  std::vector<std::vector<float>> slots;  // optimizer state, in Optimizer::SlotNames order
  std::vector<TableState> tables;         // the segment's embedding tables' rows held here
  // Early stopping: the segment's clocks per epoch (RegisterRequest.epoch_clocks).
  // Writing this state keeps the newest patience + 2 epoch-end cuts besides
  // checkpoint.keep. 0: none kept beyond keep.
  uint64_t epoch_clocks = 0;
  // Read: settings the config changed from the checkpoint's that a resume
  // takes (CompareForResume): "optimizer.learning_rate: 0.01 here, 0.001 in the checkpoint".
  std::vector<std::string> changed;
};

class CheckpointStore {
 public:
  // The store of server `index` in `dir` (created if missing). Lists the
  // checkpoints there; reads none.
  static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(const v1::JobConfig& config, uint32_t index,
                                                              const std::string& dir);

  // Writes segment k's state atomically, then deletes this server's
  // checkpoints of k beyond the `keep` newest (and the epoch-end cuts
  // early stopping keeps) and rewrites the manifest.
  absl::Status Write(int segment, const ShardState& state);
  // Deletes segment k's checkpoints newer than `clock` (early stopping
  // ends the segment there).
  absl::Status DropAfter(int segment, uint64_t clock);

  // Reads and verifies segment k's checkpoint at `clock`.
  absl::StatusOr<ShardState> Read(int segment, uint64_t clock) const;

  // The newest checkpoint of segment k that verifies, dropping (and naming
  // in the log) each newer one that does not; nullopt when there is none.
  // FAILED_PRECONDITION for a checkpoint of another model, optimizer or
  // server count: restoring must not silently start over.
  absl::StatusOr<std::optional<ShardState>> Latest(int segment);

  // Clocks of segment k's checkpoints on disk, ascending (those found at
  // Open that Latest did not drop, and those written since).
  std::vector<uint64_t> Clocks(int segment) const;
  // Drops a checkpoint found bad from Clocks (its file stays for a look).
  void Forget(int segment, uint64_t clock);

  std::string Path(int segment, uint64_t clock) const;
  const std::string& dir() const { return dir_; }

 private:
  CheckpointStore(const v1::JobConfig& config, uint32_t index, ShardMap map, std::string dir);
  absl::Status WriteManifest() const;
  // Deletes segment k's files of `clocks`.
  void Remove(int segment, const std::vector<uint64_t>& clocks) const;

  const v1::JobConfig config_;
  const uint32_t index_;
  const ShardMap map_;
  const std::string dir_;
  const std::string checkpoint_fingerprint_;  // CheckpointFingerprint of the config
  std::vector<std::string> slot_names_;

  mutable Mutex manifest_mu_;  // one manifest write at a time (the writer's, an early stop's), in order
  mutable Mutex mu_;
  std::vector<std::vector<uint64_t>> clocks_ ABSL_GUARDED_BY(mu_);  // per segment, ascending
  // Per segment without checkpoints of its own: a file of this index for another server count.
  std::map<int, std::string> foreign_ ABSL_GUARDED_BY(mu_);
};

// One checkpoint file as any tool reads it: format and checksum verified,
// each stored part located (tensors and optimizer slots alike).
struct CheckpointFile {
  struct Part {
    std::vector<uint64_t> shape;  // of the whole tensor
    uint64_t tensor_offset = 0;   // of the part within it
    absl::Span<const float> values;
  };
  SafetensorsFile file;  // owns the bytes the parts view
  std::map<std::string, std::string> metadata;
  std::map<std::string, Part> parts;  // by tensor name, e.g. "s/dense_0/kernel/adam_m"
  std::string Field(const std::string& key) const;
};
absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path);

// segps-checkpoint merge: joins the S servers' files of one clock of every
// segment under `dir` (`clock`: the newest clock every server holds, per
// segment, when unset) into one whole-model safetensors file at `out`,
// tensors in their full shapes, optimizer slots with `slots`.
absl::Status MergeCheckpoints(const std::string& dir, std::optional<uint64_t> clock, bool slots,
                              const std::string& out);
// segps-checkpoint split: re-cuts a merged file (with its optimizer slots)
// into checkpoints of `config`'s servers in `dir`, to restore the job on
// another number of servers.
absl::Status SplitCheckpoint(const std::string& merged, const v1::JobConfig& config, const std::string& dir);

// Tensor parts as they are stored: for each tensor that segment k's range
// `range` overlaps, its name, the part's element offset within the tensor,
// the tensor's shape, and the part's place in the range.
struct TensorPart {
  std::string name;
  std::vector<uint64_t> shape;  // of the whole tensor
  uint64_t tensor_offset = 0;   // first element of the part within the tensor
  uint64_t range_offset = 0;    // first element of the part within the range
  uint64_t count = 0;
};
std::vector<TensorPart> TensorParts(const v1::ModelConfig& model, const ShardMap& map, int segment, Range range);

}  // namespace segps

#endif  // SEGPS_SERVER_CHECKPOINT_H_
