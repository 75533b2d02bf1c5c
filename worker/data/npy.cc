#include "worker/data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace segps {
namespace {

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// The value after 'key': in the header's dict literal, up to the next
// top-level comma (a shape tuple keeps its commas).
std::optional<std::string> DictValue(absl::string_view dict, absl::string_view key) {
  for (const char quote : {'\'', '"'}) {
    const std::string needle = absl::StrCat(std::string(1, quote), key, std::string(1, quote));
    size_t at = dict.find(needle);
    if (at == absl::string_view::npos) continue;
    at = dict.find(':', at + needle.size());
    if (at == absl::string_view::npos) return std::nullopt;
    absl::string_view rest = dict.substr(at + 1);
    int depth = 0;
    size_t end = 0;
    for (; end < rest.size(); ++end) {
      const char c = rest[end];
      if (c == '(' || c == '[') ++depth;
      if (c == ')' || c == ']') --depth;
      if ((c == ',' && depth == 0) || depth < 0 || c == '}') break;
    }
    return std::string(absl::StripAsciiWhitespace(rest.substr(0, end)));
  }
  return std::nullopt;
}

// The header's dict literal, where the data starts and the file's size.
struct RawHeader {
  std::string dict;
  uint64_t data_offset = 0;
  uint64_t file_size = 0;
};

absl::StatusOr<RawHeader> ReadRawHeader(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st;
  const bool stat_ok = fstat(fileno(f.get()), &st) == 0;
  unsigned char prefix[12] = {0};
  const size_t got = std::fread(prefix, 1, sizeof(prefix), f.get());
  if (!stat_ok || st.st_size == 0 || got < 10) {
    return Bad(path, st.st_size == 0 ? "empty file" : "too short for a .npy file");
  }
  if (std::memcmp(prefix, "\x93NUMPY", 6) != 0) {
    return Bad(path, "not a .npy file (no \\x93NUMPY magic); save arrays with numpy.save");
  }
  const int major = prefix[6];
  uint64_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = prefix[8] | static_cast<uint64_t>(prefix[9]) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (got < 12) return Bad(path, "too short for a .npy file");
    header_len = prefix[8] | static_cast<uint64_t>(prefix[9]) << 8 | static_cast<uint64_t>(prefix[10]) << 16 |
                 static_cast<uint64_t>(prefix[11]) << 24;
    header_start = 12;
  } else {
    return Bad(path, absl::StrCat(".npy format version ", major, " is not supported (1 to 3 are)"));
  }
  RawHeader raw;
  raw.file_size = static_cast<uint64_t>(st.st_size);
  if (header_len > (1u << 20) || header_start + header_len > raw.file_size) return Bad(path, "truncated .npy header");
  raw.dict.assign(header_len, '\0');
  if (std::fseek(f.get(), static_cast<long>(header_start), SEEK_SET) != 0 ||
      std::fread(raw.dict.data(), 1, header_len, f.get()) != header_len) {
    return Bad(path, "cannot read the .npy header");
  }
  raw.data_offset = header_start + header_len;
  return raw;
}

// descr: a plain little-endian (or byte-order-free) numeric dtype.
absl::Status ParseDescr(const std::string& path, const std::string& descr, NpyHeader* h) {
  if (descr.size() < 2 || (descr[0] != '\'' && descr[0] != '"')) {
    return Bad(path, absl::StrCat("dtype ", descr, " is a structured dtype; segps reads plain numeric arrays"));
  }
  h->descr = descr.substr(1, descr.size() - 2);
  if (h->descr.size() < 3 || !absl::SimpleAtoi(h->descr.substr(2), &h->item_bytes)) {
    return Bad(path, absl::StrCat("dtype '", h->descr, "' is not a numeric dtype"));
  }
  const char order = h->descr[0];
  h->kind = h->descr[1];
  const int bytes = h->item_bytes;
  const bool numeric = (h->kind == 'f' && (bytes == 2 || bytes == 4 || bytes == 8)) ||
                       ((h->kind == 'i' || h->kind == 'u') && (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)) ||
                       (h->kind == 'b' && bytes == 1);
  if (!numeric) return Bad(path, absl::StrCat("dtype '", h->descr, "' is not a numeric dtype segps reads"));
  if (order == '>' && bytes > 1) {
    return Bad(path, absl::StrCat("dtype '", h->descr, "' is big-endian; save it little-endian (x.astype('<",
                                  h->descr.substr(1), "'))"));
  }
  if (order != '<' && order != '|' && order != '=' && order != '>') {
    return Bad(path, absl::StrCat("dtype '", h->descr, "' has an unknown byte order"));
  }
  return absl::OkStatus();
}

// shape: a tuple of dimensions whose bytes are exactly the file's data.
absl::Status ParseShape(const std::string& path, const std::string& shape, const RawHeader& raw, NpyHeader* h) {
  absl::string_view dims = shape;
  if (!absl::ConsumePrefix(&dims, "(") || !absl::ConsumeSuffix(&dims, ")")) {
    return Bad(path, absl::StrCat("shape ", shape, " does not parse"));
  }
  for (absl::string_view d : absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v) || v > (1ull << 48)) {
      return Bad(path, absl::StrCat("shape ", shape, " does not parse"));
    }
    h->shape.push_back(v);
  }
  uint64_t bytes = static_cast<uint64_t>(h->item_bytes);
  for (uint64_t d : h->shape) {
    if (d != 0 && bytes > (1ull << 62) / d) return Bad(path, absl::StrCat("shape ", shape, " is too large"));
    bytes *= d;
  }
  if (raw.file_size - h->data_offset != bytes) {
    return Bad(path, absl::StrCat("holds ", raw.file_size - h->data_offset, " data bytes, but shape ", shape, " of '",
                                  h->descr, "' needs ", bytes, " (truncated or not a .npy file)"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t NpyHeader::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path) {
  absl::StatusOr<RawHeader> raw = ReadRawHeader(path);
  if (!raw.ok()) return raw.status();
  NpyHeader h;
  h.data_offset = raw->data_offset;
  std::optional<std::string> descr = DictValue(raw->dict, "descr");
  std::optional<std::string> fortran = DictValue(raw->dict, "fortran_order");
  std::optional<std::string> shape = DictValue(raw->dict, "shape");
  if (!descr || !fortran || !shape) return Bad(path, "the .npy header lacks descr, fortran_order or shape");
  SEGPS_RETURN_IF_ERROR(ParseDescr(path, *descr, &h));
  if (*fortran != "False") {
    return Bad(path, "is in Fortran order; save a C-ordered array (numpy.ascontiguousarray)");
  }
  SEGPS_RETURN_IF_ERROR(ParseShape(path, *shape, *raw, &h));
  return h;
}

absl::StatusOr<MappedRegion> MappedRegion::Map(const std::string& path, uint64_t offset, uint64_t size) {
  MappedRegion region;
  if (size == 0) return region;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  region.mapped_ = static_cast<size_t>(offset - start + size);
  void* base = mmap(nullptr, region.mapped_, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    region.mapped_ = 0;
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": cannot map ", size, " bytes at ", offset, ": ", std::strerror(err)));
  }
  region.base_ = base;
  region.data_ = static_cast<const char*>(base) + (offset - start);
  region.size_ = size;
  return region;
}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    std::swap(base_, other.base_);
    std::swap(mapped_, other.mapped_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }
  return *this;
}

void MappedRegion::Reset() {
  if (base_ != nullptr) munmap(base_, mapped_);
  base_ = nullptr;
  mapped_ = 0;
  data_ = nullptr;
  size_ = 0;
}

absl::Status WriteNpy(const std::string& path, const char* descr, const void* data, size_t bytes,
                      const std::vector<uint64_t>& shape) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header = absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6) + version (2) + header length (2) + header, padded to 64 bytes with a newline.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    const int error = errno;
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write: ", std::strerror(error)));
  }
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t len = static_cast<uint16_t>(header.size());
  const unsigned char len_le[2] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>(len >> 8)};
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(len_le, 1, 2, f) == 2 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace segps
