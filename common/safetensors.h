// safetensors files (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON naming each tensor's dtype,
// shape and byte range, then the raw little-endian data. The format of
// segps's model exports, readable by the safetensors library, PyTorch and
// NumPy alike.
//
// A file read is untrusted: Read checks the header's JSON, every dtype,
// shape and byte range against the file, and names the file and the tensor
// of the first problem.
#ifndef SEGPS_COMMON_SAFETENSORS_H_
#define SEGPS_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace segps {

// A float32 tensor to write; `values` holds product(shape) elements.
struct TensorToWrite {
  std::string name;
  std::vector<uint64_t> shape;
  absl::Span<const float> values;  // F32
  absl::Span<const uint64_t> ids;  // U64, when values is empty and this is not
};

// Writes `tensors` (data in that order) and string `metadata` (the header's
// "__metadata__") to `path`, atomically (see WriteFileAtomically).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata);

class SafetensorsFile {
 public:
  struct Tensor {
    std::string dtype;  // "F32", "F16", "I64", ...
    std::vector<uint64_t> shape;
    absl::string_view bytes;  // within the file's contents, valid while any copy of the SafetensorsFile lives
  };

  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }
  // The float32 values of tensor `name` of shape `shape`; an error naming
  // the file and the tensor if it is missing or has another dtype or shape.
  absl::StatusOr<std::vector<float>> Float32(const std::string& name, const std::vector<uint64_t>& shape) const;

 private:
  std::string path_;
  std::shared_ptr<const std::string> contents_;  // shared by copies, so that `bytes` stay valid
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Tensor> tensors_;
};

// Writes `bytes` to `path` so that a crash leaves either the old file or
// the new one whole: a temporary file beside it, fsync, rename, fsync the
// directory.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(absl::string_view s);

}  // namespace segps

#endif  // SEGPS_COMMON_SAFETENSORS_H_
