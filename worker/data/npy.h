// NumPy .npy files: reading and checking a header, memory-mapping part of a
// file, and writing arrays. Every byte of a file is untrusted: a header that
// does not parse, a dtype segps cannot read or a size that does not match the
// file is refused naming the file and the problem.
#ifndef SEGPS_WORKER_DATA_NPY_H_
#define SEGPS_WORKER_DATA_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace segps {

// A .npy array's layout: a little-endian (or one-byte) numeric dtype in C
// order, its data at `data_offset` filling the rest of the file exactly.
struct NpyHeader {
  std::string descr;  // as written, e.g. "<f4", "|u1"
  char kind = 0;      // 'f' float, 'i' signed, 'u' unsigned integer, 'b' bool
  int item_bytes = 0;
  std::vector<uint64_t> shape;
  uint64_t data_offset = 0;
  uint64_t elements() const;
};

// Reads and checks the header of `path` (format versions 1 to 3).
absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path);

// A read-only memory map of bytes [offset, offset + size) of a file (offset
// need not be page-aligned); unmapped when destroyed. Move-only.
class MappedRegion {
 public:
  MappedRegion() = default;
  static absl::StatusOr<MappedRegion> Map(const std::string& path, uint64_t offset, uint64_t size);
  MappedRegion(MappedRegion&& other) noexcept { *this = std::move(other); }
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion() { Reset(); }

  const char* data() const { return data_; }
  uint64_t size() const { return size_; }
  void Reset();

 private:
  void* base_ = nullptr;  // page-aligned start of the mapping
  size_t mapped_ = 0;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
};

// Writes `bytes` of `data` as an array of dtype `descr` and `shape`.
absl::Status WriteNpy(const std::string& path, const char* descr, const void* data, size_t bytes,
                      const std::vector<uint64_t>& shape);

}  // namespace segps

#endif  // SEGPS_WORKER_DATA_NPY_H_
