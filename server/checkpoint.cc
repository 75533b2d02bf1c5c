#include "server/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/proto_json.h"
#include "common/safetensors.h"
#include "server/checkpoint_tables.h"
#include "common/status_macros.h"
#include "server/optimizer.h"

namespace segps {
namespace {

namespace fs = std::filesystem;

constexpr char kFormat[] = "segps-checkpoint-1";

std::string ShapeText(const std::vector<uint64_t>& shape) { return absl::StrJoin(shape, "x"); }

// The checksum of a checkpoint's data: its tensors' bytes in name order.
template <typename Bytes>
uint64_t DataChecksum(const std::map<std::string, Bytes>& by_name) {
  uint64_t h = 0;
  for (const auto& [name, bytes] : by_name) h = Checksum64(bytes, h ^ Fnv1a64(name));
  return h;
}

absl::string_view AsBytes(absl::Span<const float> values) {
  return absl::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

std::string ServerFile(uint32_t index, uint32_t servers) {
  return absl::StrFormat("server-%u-of-%u", index, servers);
}

}  // namespace

std::vector<TensorPart> TensorParts(const v1::ModelConfig& model, const ShardMap& map, int segment, Range range) {
  std::vector<TensorPart> parts;
  for (const TensorLayout& t : map.tensors(segment)) {
    const uint64_t begin = std::max(t.offset, range.offset);
    const uint64_t end = std::min(t.offset + t.size(), range.end());
    if (begin >= end) continue;
    parts.push_back({TensorName(model, segment, t), TensorShape(t), begin - t.offset, begin - range.offset,
                     end - begin});
  }
  return parts;
}

CheckpointStore::CheckpointStore(const v1::JobConfig& config, uint32_t index, ShardMap map, std::string dir)
    : config_(config), index_(index), map_(std::move(map)), dir_(std::move(dir)),
      checkpoint_fingerprint_(CheckpointFingerprint(config)) {}

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(const v1::JobConfig& config, uint32_t index,
                                                                      const std::string& dir) {
  absl::StatusOr<ShardMap> map = ShardMap::Create(config.model(), config.cluster().num_servers());
  if (!map.ok()) return map.status();
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint dir ", dir, ": cannot be created: ", error.message()));
  }
  std::unique_ptr<CheckpointStore> store(new CheckpointStore(config, index, *std::move(map), dir));
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = CreateOptimizer(config.optimizer(), 0);
  if (!optimizer.ok()) return optimizer.status();
  store->slot_names_ = (*optimizer)->SlotNames();
  MutexLock lock(&store->mu_);
  store->clocks_.resize(store->map_.num_segments());
  const std::string mine = ServerFile(index, config.cluster().num_servers()) + ".safetensors";
  for (int k = 0; k < store->map_.num_segments(); ++k) {
    const fs::path segment_dir = fs::path(dir) / config.model().segments(k).name();
    if (!fs::is_directory(segment_dir, error)) continue;
    for (const fs::directory_entry& entry : fs::directory_iterator(segment_dir, error)) {
      const std::string name = entry.path().filename().string();
      uint64_t clock = 0;
      if (name.rfind("clock-", 0) != 0 || !absl::SimpleAtoi(name.substr(6), &clock)) continue;
      if (fs::exists(entry.path() / mine, error)) {
        store->clocks_[k].push_back(clock);
        continue;
      }
      // A checkpoint of this index for another server count?
      for (const fs::directory_entry& file : fs::directory_iterator(entry.path(), error)) {
        const std::string other = file.path().filename().string();
        if (other.rfind(absl::StrCat("server-", index, "-of-"), 0) == 0 && other.find(".tmp.") == std::string::npos) {
          store->foreign_[k] = file.path().string();
        }
      }
    }
    std::sort(store->clocks_[k].begin(), store->clocks_[k].end());
    if (!store->clocks_[k].empty()) store->foreign_.erase(k);
  }
  return store;
}

std::string CheckpointStore::Path(int segment, uint64_t clock) const {
  return absl::StrFormat("%s/%s/clock-%012u/%s.safetensors", dir_, config_.model().segments(segment).name(), clock,
                         ServerFile(index_, map_.num_servers()));
}

absl::Status CheckpointStore::Write(int segment, const ShardState& state) {
  const Range range = map_.range(segment, index_);
  if (state.values.size() != range.count || state.slots.size() != slot_names_.size()) {
    return absl::InternalError(absl::StrCat("checkpoint of segment ", segment, ": state has ", state.values.size(),
                                            " values and ", state.slots.size(), " optimizer slots"));
  }
  std::vector<TensorToWrite> tensors;
  std::map<std::string, absl::string_view> by_name;
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"segps.job", config_.name()},
      {"segps.checkpoint_fingerprint", checkpoint_fingerprint_},
      {"segps.config", FingerprintedConfig(config_)},
      {"segps.shard_fingerprint", map_.fingerprint()},
      {"segps.optimizer", v1::OptimizerKind_Name(config_.optimizer().kind())},
      {"segps.server", absl::StrCat(index_)},
      {"segps.num_servers", absl::StrCat(map_.num_servers())},
      {"segps.segment", config_.model().segments(segment).name()},
      {"segps.clock", absl::StrCat(state.clock)},
      {"segps.steps", absl::StrCat(state.steps)},
      {"segps.updates", absl::StrCat(state.updates)},
      {"segps.ranks", absl::StrJoin(state.ranks, ",")},
      {"segps.range", absl::StrCat(range.offset, " ", range.count)},
      {"segps.model", ToJson(config_.model())},
  };
  auto add = [&](const std::string& name, const TensorPart& part, const std::vector<float>& from) {
    const absl::Span<const float> values = absl::MakeConstSpan(from).subspan(part.range_offset, part.count);
    const bool whole = part.tensor_offset == 0 && part.count == [&] {
      uint64_t n = 1;
      for (uint64_t d : part.shape) n *= d;
      return n;
    }();
    tensors.push_back({name, whole ? part.shape : std::vector<uint64_t>{part.count}, values, {}});
    by_name[name] = AsBytes(values);
    metadata["segps.part." + name] = absl::StrCat(part.tensor_offset, " of ", ShapeText(part.shape));
  };
  for (const TensorPart& part : TensorParts(config_.model(), map_, segment, range)) {
    add(part.name, part, state.values);
    for (size_t s = 0; s < slot_names_.size(); ++s) add(part.name + "/" + slot_names_[s], part, state.slots[s]);
  }
  AddTableTensors(config_.model(), segment, state.tables, &tensors, &metadata, &by_name);
  metadata["segps.checksum"] = absl::StrFormat("%016x", DataChecksum(by_name));
  const std::string path = Path(segment, state.clock);
  std::error_code error;
  fs::create_directories(fs::path(path).parent_path(), error);
  if (error) return absl::UnavailableError(absl::StrCat(path, ": cannot create its directory: ", error.message()));
  absl::Status written = WriteSafetensors(path, tensors, metadata);
  if (!written.ok()) return written;

  std::vector<uint64_t> removed;
  {
    MutexLock lock(&mu_);
    std::vector<uint64_t>& clocks = clocks_[segment];
    if (std::find(clocks.begin(), clocks.end(), state.clock) == clocks.end()) {
      clocks.insert(std::upper_bound(clocks.begin(), clocks.end(), state.clock), state.clock);
    }
    // Newest first: the `keep` newest stay, and early stopping's newest
    // patience + 2 epoch ends (the best, the patience after it, and one
    // that a peer ahead within its staleness may have cut meanwhile).
    size_t kept = 0, epochs_kept = 0;
    const size_t epochs_to_keep = config_.training().early_stopping().patience() + 2;
    std::vector<uint64_t> stay;
    for (auto it = clocks.rbegin(); it != clocks.rend(); ++it) {
      const bool epoch_end = state.epoch_clocks > 0 && *it % state.epoch_clocks == 0 && epochs_kept < epochs_to_keep;
      if (kept < config_.checkpoint().keep() || epoch_end) {
        stay.insert(stay.begin(), *it);
      } else {
        removed.push_back(*it);
      }
      ++kept;
      epochs_kept += epoch_end;
    }
    clocks = std::move(stay);
  }
  Remove(segment, removed);
  return WriteManifest();
}

absl::Status CheckpointStore::DropAfter(int segment, uint64_t clock) {
  std::vector<uint64_t> removed;
  {
    MutexLock lock(&mu_);
    std::vector<uint64_t>& clocks = clocks_[segment];
    const auto newer = std::upper_bound(clocks.begin(), clocks.end(), clock);
    removed.assign(newer, clocks.end());
    clocks.erase(newer, clocks.end());
  }
  Remove(segment, removed);
  return WriteManifest();
}

void CheckpointStore::Remove(int segment, const std::vector<uint64_t>& clocks) const {
  std::error_code error;
  for (uint64_t clock : clocks) {
    const fs::path old = Path(segment, clock);
    fs::remove(old, error);
    fs::remove(old.parent_path(), error);  // only once every server's file of that clock is gone
  }
}

absl::Status CheckpointStore::WriteManifest() const {
  MutexLock written(&manifest_mu_);
  std::vector<std::string> segments;
  {
    MutexLock lock(&mu_);
    for (int k = 0; k < map_.num_segments(); ++k) {
      std::vector<std::string> tensors;
      for (const TensorPart& part : TensorParts(config_.model(), map_, k, map_.range(k, index_))) {
        tensors.push_back(absl::StrFormat("{\"name\":%s,\"shape\":[%s],\"offset\":%u,\"count\":%u}",
                                          JsonQuote(part.name), absl::StrJoin(part.shape, ","), part.tensor_offset,
                                          part.count));
      }
      const std::vector<uint64_t>& clocks = clocks_[k];
      segments.push_back(absl::StrFormat(
          "{\"name\":%s,\"clock\":%u,\"clocks\":[%s],\"files\":%s,\"optimizer_slots\":[%s],\"tensors\":[%s]}",
          JsonQuote(config_.model().segments(k).name()), clocks.empty() ? 0 : clocks.back(),
          absl::StrJoin(clocks, ","), JsonQuote(clocks.empty() ? "" : Path(k, clocks.back())),
          absl::StrJoin(slot_names_, ",", [](std::string* out, const std::string& s) { out->append(JsonQuote(s)); }),
          absl::StrJoin(tensors, ",")));
    }
  }
  const std::string json = absl::StrFormat(
      "{\"format\":\"%s\",\"job\":%s,\"checkpoint_fingerprint\":\"%s\",\"shard_fingerprint\":\"%s\",\"server\":%u,"
      "\"num_servers\":%u,\"optimizer\":\"%s\",\"segments\":[%s]}\n",
      kFormat, JsonQuote(config_.name()), checkpoint_fingerprint_, map_.fingerprint(), index_, map_.num_servers(),
      v1::OptimizerKind_Name(config_.optimizer().kind()), absl::StrJoin(segments, ","));
  return WriteFileAtomically(absl::StrCat(dir_, "/", ServerFile(index_, map_.num_servers()), ".json"), json);
}

absl::StatusOr<ShardState> CheckpointStore::Read(int segment, uint64_t clock) const {
  const std::string path = Path(segment, clock);
  absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(path);
  if (!file.ok()) return file.status();
  auto corrupt = [&](const std::string& what) { return absl::DataLossError(absl::StrCat(path, ": ", what)); };
  ShardState state;
  ResumeDifferences differ = CompareForResume(config_, file->Field("segps.config"), "the checkpoint");
  state.changed = std::move(differ.allowed);
  if (file->Field("segps.checkpoint_fingerprint") != checkpoint_fingerprint_) {
    if (!differ.refused.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": a checkpoint of another model or optimizer: ", absl::StrJoin(differ.refused, "; "),
          ". Resume with the checkpoint's settings, or start over (segps-local --fresh), or move the directory "
          "away or use another --checkpoint_dir"));
    }
  }
  if (file->Field("segps.checkpoint_fingerprint") != checkpoint_fingerprint_ ||
      file->Field("segps.shard_fingerprint") != map_.fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": a checkpoint of another job: checkpoint fingerprint ", file->Field("segps.checkpoint_fingerprint"),
        " and shard fingerprint ", file->Field("segps.shard_fingerprint"), " (", file->Field("segps.num_servers"),
        " servers, optimizer ", file->Field("segps.optimizer"), "), but this server's are ", checkpoint_fingerprint_,
        " and ", map_.fingerprint(), " (", map_.num_servers(), " servers, optimizer ",
        v1::OptimizerKind_Name(config_.optimizer().kind()),
        "); move the directory away or use another --checkpoint_dir"));
  }
  uint64_t file_clock = 0;
  if (!absl::SimpleAtoi(file->Field("segps.clock"), &file_clock) || file_clock != clock ||
      !absl::SimpleAtoi(file->Field("segps.steps"), &state.steps) ||
      !absl::SimpleAtoi(file->Field("segps.updates"), &state.updates)) {
    return corrupt("metadata segps.clock, segps.steps or segps.updates is missing or wrong");
  }
  state.clock = clock;
  for (absl::string_view rank : absl::StrSplit(file->Field("segps.ranks"), ',', absl::SkipEmpty())) {
    uint32_t r = 0;
    if (!absl::SimpleAtoi(rank, &r)) return corrupt(absl::StrCat("metadata segps.ranks has \"", rank, "\""));
    state.ranks.push_back(r);
  }
  const Range range = map_.range(segment, index_);
  state.values.resize(range.count);
  state.slots.assign(slot_names_.size(), std::vector<float>(range.count));
  auto take = [&](const std::string& name, const TensorPart& part, std::vector<float>* into) -> absl::Status {
    auto it = file->parts.find(name);
    if (it == file->parts.end() || it->second.values.size() != part.count ||
        it->second.tensor_offset != part.tensor_offset) {
      return corrupt(absl::StrCat("tensor ", name, " is missing or not the ", part.count,
                                  " values from element ", part.tensor_offset, " this server holds"));
    }
    std::copy(it->second.values.begin(), it->second.values.end(), into->begin() + part.range_offset);
    return absl::OkStatus();
  };
  for (const TensorPart& part : TensorParts(config_.model(), map_, segment, range)) {
    absl::Status status = take(part.name, part, &state.values);
    for (size_t s = 0; s < slot_names_.size() && status.ok(); ++s) {
      status = take(part.name + "/" + slot_names_[s], part, &state.slots[s]);
    }
    if (!status.ok()) return status;
  }
  SEGPS_RETURN_IF_ERROR(ReadTables(file->file, file->metadata, config_, segment, index_, map_.num_servers(), &state.tables));
  return state;
}

std::string CheckpointFile::Field(const std::string& key) const {
  auto it = metadata.find(key);
  return it == metadata.end() ? "" : it->second;
}

absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path) {
  absl::StatusOr<SafetensorsFile> safetensors = SafetensorsFile::Read(path);
  if (!safetensors.ok()) return absl::DataLossError(safetensors.status().message());
  CheckpointFile file{*std::move(safetensors), {}, {}};
  file.metadata = file.file.metadata();
  auto corrupt = [&](const std::string& what) { return absl::DataLossError(absl::StrCat(path, ": ", what)); };
  if (file.Field("format") != kFormat) {
    return corrupt(absl::StrCat("metadata format is \"", file.Field("format"), "\", not ", kFormat));
  }
  std::map<std::string, absl::string_view> by_name;
  for (const auto& [name, tensor] : file.file.tensors()) by_name[name] = tensor.bytes;
  const std::string checksum = absl::StrFormat("%016x", DataChecksum(by_name));
  if (file.Field("segps.checksum") != checksum) {
    return corrupt(absl::StrCat("checksum ", file.Field("segps.checksum"), " does not match the data (", checksum,
                                "): the file is damaged"));
  }
  for (const auto& [name, tensor] : file.file.tensors()) {
    if (IsTableTensor(name)) continue;  // read by ReadTables
    // "OFFSET of AxB": where the stored part starts within the whole tensor.
    const std::vector<std::string> words = absl::StrSplit(file.Field("segps.part." + name), ' ');
    CheckpointFile::Part part;
    uint64_t elements = 1;
    bool ok = words.size() == 3 && words[1] == "of" && absl::SimpleAtoi(words[0], &part.tensor_offset);
    for (absl::string_view d : absl::StrSplit(ok ? words[2] : "", 'x')) {
      uint64_t n = 0;
      ok = ok && absl::SimpleAtoi(d, &n) && n > 0;
      part.shape.push_back(n);
      elements *= n;
    }
    const uint64_t count = tensor.bytes.size() / sizeof(float);
    const bool aligned = reinterpret_cast<uintptr_t>(tensor.bytes.data()) % alignof(float) == 0;
    if (!ok || !aligned || tensor.dtype != "F32" || part.tensor_offset > elements ||
        count > elements - part.tensor_offset) {
      return corrupt(absl::StrCat("tensor ", name, ": metadata segps.part.", name, " is \"",
                                  file.Field("segps.part." + name), "\", not the part of a tensor it holds"));
    }
    part.values = absl::MakeConstSpan(reinterpret_cast<const float*>(tensor.bytes.data()), count);
    file.parts[name] = part;
  }
  return file;
}

absl::StatusOr<std::optional<ShardState>> CheckpointStore::Latest(int segment) {
  while (true) {
    uint64_t clock = 0;
    {
      MutexLock lock(&mu_);
      if (clocks_[segment].empty()) {
        auto foreign = foreign_.find(segment);
        if (foreign == foreign_.end()) return std::optional<ShardState>();
        return absl::FailedPreconditionError(absl::StrCat(
            foreign->second, ": a checkpoint for another server count; this cluster has ", map_.num_servers(),
            " servers. Re-cut it with segps-checkpoint split, or use another --checkpoint_dir"));
      }
      clock = clocks_[segment].back();
    }
    absl::StatusOr<ShardState> state = Read(segment, clock);
    if (state.ok()) return std::optional<ShardState>(*std::move(state));
    if (absl::IsFailedPrecondition(state.status())) return state.status();
    SEGPS_LOG_WARNING << "checkpoint refused, trying the next older one: " << state.status().message();
    MutexLock lock(&mu_);
    clocks_[segment].pop_back();
  }
}

void CheckpointStore::Forget(int segment, uint64_t clock) {
  MutexLock lock(&mu_);
  std::vector<uint64_t>& clocks = clocks_[segment];
  clocks.erase(std::remove(clocks.begin(), clocks.end(), clock), clocks.end());
}

std::vector<uint64_t> CheckpointStore::Clocks(int segment) const {
  MutexLock lock(&mu_);
  return clocks_[segment];
}

namespace {

// Whether `name` is an optimizer slot ("s/dense_0/kernel/adam_m"), not a tensor.
bool IsSlot(const std::string& name) {
  const size_t last = name.rfind('/');
  const std::string leaf = name.substr(last + 1);
  return leaf != "kernel" && leaf != "bias";
}

// One whole tensor being assembled from parts.
struct Whole {
  std::vector<uint64_t> shape;
  std::vector<float> values;
  uint64_t covered = 0;
};

// The clocks of a segment's directory, newest first, with the server files found for each.
std::map<uint64_t, std::vector<fs::path>, std::greater<>> ClocksOf(const fs::path& segment_dir) {
  std::error_code error;
  std::map<uint64_t, std::vector<fs::path>, std::greater<>> clocks;
  for (const fs::directory_entry& entry : fs::directory_iterator(segment_dir, error)) {
    uint64_t c = 0;
    const std::string name = entry.path().filename().string();
    if (name.rfind("clock-", 0) != 0 || !absl::SimpleAtoi(name.substr(6), &c)) continue;
    for (const fs::directory_entry& file : fs::directory_iterator(entry.path(), error)) {
      const std::string f = file.path().filename().string();
      if (f.rfind("server-", 0) == 0 && absl::EndsWith(f, ".safetensors")) clocks[c].push_back(file.path());
    }
  }
  return clocks;
}

// Every segment's newest complete clock (or the one asked for), assembled into whole tensors.
class Merger {
 public:
  Merger(std::optional<uint64_t> clock, bool slots) : clock_(clock), slots_(slots) {}

  // Merges a segment's directory; fails when it has no clock every server wrote.
  absl::Status AddSegment(const fs::path& segment_dir) {
    const auto clocks = ClocksOf(segment_dir);
    if (clocks.empty()) return absl::OkStatus();
    std::vector<std::string> skipped;
    for (const auto& [c, files] : clocks) {
      if (clock_.has_value() && c != *clock_) continue;
      absl::StatusOr<bool> merged = AddClock(c, files, &skipped);
      if (!merged.ok()) return merged.status();
      if (*merged) return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat(
        "merge: ", segment_dir.string(), ": no clock", clock_.has_value() ? absl::StrCat(" ", *clock_) : "",
        " with every server's file", skipped.empty() ? "" : absl::StrCat(" (", absl::StrJoin(skipped, ", "), ")")));
  }

  absl::Status Write(const std::string& dir, const std::string& out) {
    if (segments_ == 0) return absl::NotFoundError(absl::StrCat("merge: no checkpoints under ", dir));
    std::vector<TensorToWrite> out_tensors;
    SEGPS_RETURN_IF_ERROR(AddMergedTables(&tables_, &out_tensors, &metadata_));
    for (const auto& [name, whole] : tensors_) {
      if (whole.covered != whole.values.size()) {
        return absl::DataLossError(absl::StrCat("merge: tensor ", name, ": the servers' parts cover ", whole.covered,
                                                " of its ", whole.values.size(), " elements"));
      }
      out_tensors.push_back({name, whole.shape, whole.values, {}});
    }
    return WriteSafetensors(out, out_tensors, metadata_);
  }

 private:
  // Merges clock `c` of a segment if every server's file is there: whether it was.
  absl::StatusOr<bool> AddClock(uint64_t c, const std::vector<fs::path>& files, std::vector<std::string>* skipped) {
    std::vector<CheckpointFile> read;
    for (const fs::path& f : files) {
      absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(f.string());
      if (!file.ok()) return file.status();
      read.push_back(*std::move(file));
    }
    uint32_t servers = 0;
    if (!absl::SimpleAtoi(read[0].Field("segps.num_servers"), &servers) || servers == 0) {
      skipped->push_back(absl::StrCat("clock ", c, " (", files[0].string(), ": segps.num_servers '",
                                      read[0].Field("segps.num_servers"), "' is not a server count)"));
      return false;
    }
    std::set<std::string> indices;
    for (const CheckpointFile& f : read) {
      if (f.Field("segps.num_servers") == read[0].Field("segps.num_servers") &&
          f.Field("segps.checkpoint_fingerprint") == read[0].Field("segps.checkpoint_fingerprint")) {
        indices.insert(f.Field("segps.server"));
      }
    }
    if (indices.size() != servers || read.size() != servers) {
      skipped->push_back(absl::StrCat("clock ", c, " (", read.size(), " files for ", servers, " servers)"));
      return false;
    }
    const std::string name = read[0].Field("segps.segment");
    v1::OptimizerKind kind = v1::OPTIMIZER_UNSPECIFIED;
    v1::OptimizerKind_Parse(read[0].Field("segps.optimizer"), &kind);
    for (const CheckpointFile& f : read) {
      SEGPS_RETURN_IF_ERROR(AddTableRows(f.file, f.metadata, name, kind, slots_, &tables_));
    }
    for (const char* key :
         {"segps.job", "segps.checkpoint_fingerprint", "segps.config", "segps.optimizer", "segps.model"}) {
      if (!metadata_.count(key)) metadata_[key] = read[0].Field(key);
      if (metadata_[key] != read[0].Field(key)) {
        return absl::FailedPreconditionError(absl::StrCat("merge: ", files[0].string(), " has ", key, " ",
                                                          read[0].Field(key), ", other segments ", metadata_[key]));
      }
    }
    for (const char* key : {"segps.clock", "segps.steps", "segps.updates", "segps.ranks"}) {
      metadata_[absl::StrCat(key, ".", name)] = read[0].Field(key);
    }
    for (const CheckpointFile& f : read) SEGPS_RETURN_IF_ERROR(AddParts(f));
    std::cout << "segment " << name << ": clock " << c << " from " << servers << " servers"
              << (skipped->empty() ? "" : absl::StrCat(" (incomplete: ", absl::StrJoin(*skipped, ", "), ")")) << "\n";
    ++segments_;
    return true;
  }

  absl::Status AddParts(const CheckpointFile& f) {
    for (const auto& [tensor, part] : f.parts) {
      if (IsSlot(tensor) && !slots_) continue;
      Whole& whole = tensors_[tensor];
      if (whole.shape.empty()) {
        whole.shape = part.shape;
        uint64_t n = 1;
        for (uint64_t d : part.shape) n *= d;
        whole.values.assign(n, 0.0f);
      }
      if (whole.shape != part.shape) {
        return absl::DataLossError(absl::StrCat("merge: tensor ", tensor, " has two shapes"));
      }
      std::copy(part.values.begin(), part.values.end(), whole.values.begin() + part.tensor_offset);
      whole.covered += part.values.size();
    }
    return absl::OkStatus();
  }

  const std::optional<uint64_t> clock_;
  const bool slots_;
  std::map<std::string, Whole> tensors_;
  std::map<std::string, MergedTable> tables_;  // embedding tables, by tensor base name
  std::map<std::string, std::string> metadata_ = {{"format", "segps-checkpoint-merged-1"}};
  int segments_ = 0;
};

}  // namespace

absl::Status MergeCheckpoints(const std::string& dir, std::optional<uint64_t> clock, bool slots,
                              const std::string& out) {
  std::error_code error;
  std::vector<fs::path> segment_dirs;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (entry.is_directory()) segment_dirs.push_back(entry.path());
  }
  if (error) return absl::NotFoundError(absl::StrCat("merge: ", dir, ": ", error.message()));
  std::sort(segment_dirs.begin(), segment_dirs.end());
  Merger merger(clock, slots);
  for (const fs::path& segment_dir : segment_dirs) SEGPS_RETURN_IF_ERROR(merger.AddSegment(segment_dir));
  return merger.Write(dir, out);
}

absl::Status SplitCheckpoint(const std::string& merged, const v1::JobConfig& config, const std::string& dir) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(merged);
  if (!file.ok()) return file.status();
  auto field = [&](const std::string& key) -> std::string {
    auto it = file->metadata().find(key);
    return it == file->metadata().end() ? "" : it->second;
  };
  if (field("format") != "segps-checkpoint-merged-1") {
    return absl::InvalidArgumentError(absl::StrCat(merged, ": not a merged checkpoint (segps-checkpoint merge)"));
  }
  if (field("segps.checkpoint_fingerprint") != CheckpointFingerprint(config)) {
    const std::vector<std::string> differ =
        CompareForResume(config, field("segps.config"), "the checkpoint").refused;
    return absl::FailedPreconditionError(absl::StrCat(
        merged, ": a checkpoint of another model or optimizer",
        differ.empty() ? absl::StrCat(" (checkpoint fingerprint ", field("segps.checkpoint_fingerprint"),
                                      ", the config's ", CheckpointFingerprint(config), ")")
                       : absl::StrCat(": ", absl::StrJoin(differ, "; "))));
  }
  absl::StatusOr<ShardMap> map = ShardMap::Create(config.model(), config.cluster().num_servers());
  if (!map.ok()) return map.status();
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = CreateOptimizer(config.optimizer(), 0);
  if (!optimizer.ok()) return optimizer.status();
  const std::vector<std::string> slot_names = (*optimizer)->SlotNames();
  for (uint32_t i = 0; i < map->num_servers(); ++i) {
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store = CheckpointStore::Open(config, i, dir);
    if (!store.ok()) return store.status();
    for (int k = 0; k < map->num_segments(); ++k) {
      const std::string name = config.model().segments(k).name();
      ShardState state;
      std::vector<uint32_t> ranks;
      if (!absl::SimpleAtoi(field("segps.clock." + name), &state.clock) ||
          !absl::SimpleAtoi(field("segps.steps." + name), &state.steps) ||
          !absl::SimpleAtoi(field("segps.updates." + name), &state.updates)) {
        return absl::InvalidArgumentError(absl::StrCat(merged, ": no clock of segment ", name));
      }
      for (absl::string_view r : absl::StrSplit(field("segps.ranks." + name), ',', absl::SkipEmpty())) {
        uint32_t rank = 0;
        if (absl::SimpleAtoi(r, &rank)) state.ranks.push_back(rank);
      }
      const Range range = map->range(k, i);
      state.values.resize(range.count);
      state.slots.assign(slot_names.size(), std::vector<float>(range.count));
      for (const TensorPart& part : TensorParts(config.model(), *map, k, range)) {
        for (size_t s = 0; s <= slot_names.size(); ++s) {
          const std::string tensor = s == 0 ? part.name : part.name + "/" + slot_names[s - 1];
          absl::StatusOr<std::vector<float>> whole = file->Float32(tensor, part.shape);
          if (!whole.ok()) {
            return s == 0 ? whole.status()
                          : absl::NotFoundError(absl::StrCat(merged, ": no optimizer slot ", tensor,
                                                             "; merge with --optimizer_slots"));
          }
          std::vector<float>& into = s == 0 ? state.values : state.slots[s - 1];
          std::copy(whole->begin() + part.tensor_offset, whole->begin() + part.tensor_offset + part.count,
                    into.begin() + part.range_offset);
        }
      }
      SEGPS_RETURN_IF_ERROR(SplitTables(*file, config, k, i, map->num_servers(), &state.tables));
      absl::Status written = (*store)->Write(k, state);
      if (!written.ok()) return written;
    }
  }
  return absl::OkStatus();
}

}  // namespace segps
