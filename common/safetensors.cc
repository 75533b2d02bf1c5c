#include "common/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace segps {
namespace {

int DTypeBytes(const std::string& dtype) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// A JSON value of a safetensors header. The header is untrusted: the reader
// below takes strict JSON only, nested at most kMaxDepth deep.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = kNull;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;  // in file order
};

class JsonReader {
 public:
  explicit JsonReader(absl::string_view text) : text_(text) {}

  // The whole text as one value (trailing whitespace allowed).
  bool ReadDocument(Json* out) {
    if (!Value(out, 0)) return false;
    SkipSpace();
    return at_ == text_.size();
  }

 private:
  static constexpr int kMaxDepth = 16;

  void SkipSpace() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r')) {
      ++at_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  bool Literal(absl::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  bool Value(Json* out, int depth) {
    if (depth > kMaxDepth) return false;
    SkipSpace();
    if (at_ >= text_.size()) return false;
    const char c = text_[at_];
    if (c == '{') {
      ++at_;
      out->kind = Json::kObject;
      if (Consume('}')) return true;
      do {
        std::string key;
        SkipSpace();
        if (!String(&key) || !Consume(':')) return false;
        out->object.emplace_back(std::move(key), Json());
        if (!Value(&out->object.back().second, depth + 1)) return false;
      } while (Consume(','));
      return Consume('}');
    }
    if (c == '[') {
      ++at_;
      out->kind = Json::kArray;
      if (Consume(']')) return true;
      do {
        out->array.emplace_back();
        if (!Value(&out->array.back(), depth + 1)) return false;
      } while (Consume(','));
      return Consume(']');
    }
    if (c == '"') {
      out->kind = Json::kString;
      return String(&out->string);
    }
    if (Literal("true") || Literal("false")) {
      out->kind = Json::kBool;
      return true;
    }
    if (Literal("null")) return true;
    return Number(out);
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool Number(Json* out) {
    const size_t start = at_;
    auto digits = [&] {
      const size_t from = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      return at_ > from;
    };
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    if (!digits()) return false;
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      if (!digits()) return false;
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      if (!digits()) return false;
    }
    out->kind = Json::kNumber;
    return absl::SimpleAtod(text_.substr(start, at_ - start), &out->number);
  }

  static void AppendUtf8(uint32_t code, std::string* out) {
    if (code < 0x80) {
      *out += static_cast<char>(code);
    } else if (code < 0x800) {
      *out += static_cast<char>(0xc0 | (code >> 6));
      *out += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      *out += static_cast<char>(0xe0 | (code >> 12));
      *out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      *out += static_cast<char>(0xf0 | (code >> 18));
      *out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      *out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  bool Hex4(uint32_t* code) {
    if (at_ + 4 > text_.size()) return false;
    *code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[at_++];
      const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (v < 0) return false;
      *code = *code << 4 | static_cast<uint32_t>(v);
    }
    return true;
  }

  bool String(std::string* out) {
    if (at_ >= text_.size() || text_[at_] != '"') return false;
    ++at_;
    while (at_ < text_.size()) {
      const char c = text_[at_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (at_ >= text_.size()) return false;
      const char e = text_[at_++];
      switch (e) {
        case '"': case '\\': case '/': *out += e; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          uint32_t code = 0;
          if (!Hex4(&code)) return false;
          if (code >= 0xd800 && code < 0xdc00) {  // a surrogate pair
            uint32_t low = 0;
            if (!Literal("\\u") || !Hex4(&low) || low < 0xdc00 || low >= 0xe000) return false;
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          } else if (code >= 0xdc00 && code < 0xe000) {
            return false;
          }
          AppendUtf8(code, out);
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }

  absl::string_view text_;
  size_t at_ = 0;
};

// A JSON number that must be a whole, non-negative integer below 2^53.
bool WholeNumber(const Json& v, uint64_t* out) {
  if (v.kind != Json::kNumber) return false;
  const double d = v.number;
  if (!(d >= 0 && d < 9007199254740992.0) || d != std::floor(d)) return false;
  *out = static_cast<uint64_t>(d);
  return true;
}

const Json* Field(const Json& object, absl::string_view name) {
  for (const auto& [key, value] : object.object) {
    if (key == name) return &value;
  }
  return nullptr;
}

}  // namespace

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> entries;
  if (!metadata.empty()) {
    std::vector<std::string> pairs;
    for (const auto& [key, value] : metadata) pairs.push_back(absl::StrCat(JsonQuote(key), ":", JsonQuote(value)));
    entries.push_back(absl::StrCat("\"__metadata__\":{", absl::StrJoin(pairs, ","), "}"));
  }
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    const bool u64 = t.values.empty() && !t.ids.empty();
    const size_t have = u64 ? t.ids.size() : t.values.size();
    if (n != have) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor ", t.name, " has ", have,
                                                     " values for shape [", absl::StrJoin(t.shape, ", "), "]"));
    }
    const size_t item = u64 ? sizeof(uint64_t) : sizeof(float);
    entries.push_back(absl::StrCat(JsonQuote(t.name), ":{\"dtype\":\"", u64 ? "U64" : "F32", "\",\"shape\":[",
                                   absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset, ",", offset + n * item,
                                   "]}"));
    offset += n * item;
  }
  std::string header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  header.append((8 - header.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  bytes += header;
  bytes.reserve(bytes.size() + offset);
  for (const TensorToWrite& t : tensors) {
    bytes.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
    if (t.values.empty()) bytes.append(reinterpret_cast<const char*>(t.ids.data()), t.ids.size() * sizeof(uint64_t));
  }
  return WriteFileAtomically(path, bytes);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  file.contents_ = std::make_shared<const std::string>(text.str());
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid safetensors file: ", what));
  };
  const std::string& c = *file.contents_;
  if (c.size() < 8) return bad("shorter than its 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(static_cast<uint8_t>(c[i])) << (8 * i);
  if (header_len > c.size() - 8 || header_len > (100u << 20)) {
    return bad(absl::StrCat("header length ", header_len, " exceeds the file (", c.size(), " bytes)"));
  }
  Json header;
  if (!JsonReader(absl::string_view(c).substr(8, header_len)).ReadDocument(&header) || header.kind != Json::kObject) {
    return bad("the header is not a JSON object");
  }
  const absl::string_view data = absl::string_view(c).substr(8 + header_len);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, value] : header.object) {
    if (file.tensors_.count(name) || (name == "__metadata__" && !file.metadata_.empty())) {
      return bad(absl::StrCat("\"", name, "\" appears twice"));
    }
    if (name == "__metadata__") {
      if (value.kind != Json::kObject) return bad("__metadata__ is not an object");
      for (const auto& [key, v] : value.object) {
        if (v.kind != Json::kString) return bad(absl::StrCat("__metadata__ value ", key, " is not a string"));
        file.metadata_[key] = v.string;
      }
      continue;
    }
    const std::string& tensor = name;  // a structured binding cannot be captured before C++20
    auto tensor_bad = [&](const std::string& what) { return bad(absl::StrCat("tensor ", tensor, ": ", what)); };
    if (value.kind != Json::kObject) return tensor_bad("is not an object");
    const Json* dtype = Field(value, "dtype");
    const Json* shape = Field(value, "shape");
    const Json* offsets = Field(value, "data_offsets");
    if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
      return tensor_bad("needs dtype, shape and data_offsets");
    }
    Tensor t;
    t.dtype = dtype->string;
    const int item = DTypeBytes(t.dtype);
    if (dtype->kind != Json::kString || item == 0) return tensor_bad(absl::StrCat("unknown dtype \"", t.dtype, "\""));
    if (shape->kind != Json::kArray) return tensor_bad("shape is not a list");
    uint64_t bytes = static_cast<uint64_t>(item);
    for (const Json& d : shape->array) {
      uint64_t dim = 0;
      if (!WholeNumber(d, &dim)) return tensor_bad("shape holds something other than a whole number");
      if (dim != 0 && bytes > (1ull << 62) / dim) return tensor_bad("shape is too large");
      bytes *= dim;
      t.shape.push_back(dim);
    }
    uint64_t begin = 0, end = 0;
    if (offsets->kind != Json::kArray || offsets->array.size() != 2 || !WholeNumber(offsets->array[0], &begin) ||
        !WholeNumber(offsets->array[1], &end) || begin > end) {
      return tensor_bad("data_offsets is not [begin, end]");
    }
    if (end > data.size()) return tensor_bad(absl::StrCat("data ends at ", end, ", past the file's ", data.size()));
    if (end - begin != bytes) {
      return tensor_bad(absl::StrCat("holds ", end - begin, " bytes, but its dtype and shape need ", bytes));
    }
    t.bytes = data.substr(begin, end - begin);
    ranges.emplace_back(begin, end);
    file.tensors_[name] = std::move(t);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return bad("two tensors' data overlap");
  }
  return file;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::Float32(const std::string& name,
                                                            const std::vector<uint64_t>& shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor ", name));
  if (it->second.dtype != "F32" || it->second.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor ", name, " is ", it->second.dtype, " [",
                                                   absl::StrJoin(it->second.shape, ", "), "]; expected F32 [",
                                                   absl::StrJoin(shape, ", "), "]"));
  }
  std::vector<float> values(it->second.bytes.size() / sizeof(float));
  std::memcpy(values.data(), it->second.bytes.data(), it->second.bytes.size());
  return values;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  // Unique per call: two threads writing one path never share a temporary file.
  static std::atomic<uint64_t> writes{0};
  const std::string temp = absl::StrCat(path, ".tmp.", getpid(), ".", writes.fetch_add(1));
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const int err = errno;
  const bool ok = done == bytes.size() && fsync(fd) == 0;
  close(fd);
  if (!ok || rename(temp.c_str(), path.c_str()) != 0) {
    unlink(temp.c_str());
    return absl::DataLossError(absl::StrCat(path, ": write failed: ", std::strerror(ok ? errno : err)));
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace segps
