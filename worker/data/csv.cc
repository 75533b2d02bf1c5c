#include "worker/data/csv.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config_hints.h"
#include "common/embedding.h"
#include "common/hash.h"
#include "common/status_macros.h"

namespace segps {
namespace {

// A line's fields, trimmed, quotes around a field removed.
std::vector<absl::string_view> Fields(const std::string& line, char delimiter) {
  std::vector<absl::string_view> fields = absl::StrSplit(line, delimiter);
  for (absl::string_view& f : fields) {
    f = absl::StripAsciiWhitespace(f);
    if (f.size() >= 2 && f.front() == '"' && f.back() == '"') f = f.substr(1, f.size() - 2);
  }
  return fields;
}

class CsvReader {
 public:
  CsvReader(const std::string& path, const v1::JobConfig& config)
      : path_(path),
        data_(config.data()),
        width_(static_cast<int>(config.model().input_width())),
        classes_(static_cast<int>(config.model().num_classes())),
        regression_(config.model().loss() == v1::MSE),
        row_(width_) {
    out_.width = width_;
    out_.classes = classes_;
    out_.fields = static_cast<int>(config.model().categorical_fields());
    for (int f = 0; f < out_.fields; ++f) vocab_.push_back(FieldVocab(config.model(), static_cast<uint32_t>(f)));
    ids_.resize(vocab_.size());
  }

  absl::StatusOr<Dataset> Read() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(path_, ": cannot open"));
    const char delimiter = data_.delimiter()[0];
    std::string line;
    while (std::getline(in, line)) {
      ++line_;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      std::vector<absl::string_view> fields = Fields(line, delimiter);
      if (columns_ == 0) {  // the first line fixes the columns and the label
        SEGPS_RETURN_IF_ERROR(FirstLine(fields));
        if (data_.header()) continue;
      }
      SEGPS_RETURN_IF_ERROR(Row(fields));
    }
    if (in.bad()) return absl::DataLossError(absl::StrCat(path_, ": read failed"));
    if (line_ == 0) return Bad("empty file");
    if (out_.size() == 0) return Bad("holds no data rows");
    return std::move(out_);
  }

 private:
  absl::Status Bad(const std::string& what) const { return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what)); }

  std::string ColumnName(size_t c) const {
    return names_.empty() ? absl::StrCat("column ", c + 1) : absl::StrCat("column ", c + 1, " (\"", names_[c], "\")");
  }

  absl::Status FirstLine(const std::vector<absl::string_view>& fields) {
    columns_ = fields.size();
    if (data_.header()) {
      for (absl::string_view f : fields) names_.emplace_back(f);
    }
    const std::string& wanted = data_.label_column();
    if (wanted.empty()) {
      label_ = static_cast<int>(columns_) - 1;
    } else {
      for (size_t c = 0; c < names_.size(); ++c) {
        if (names_[c] == wanted) label_ = static_cast<int>(c);
      }
      int index = -1;
      if (label_ < 0 && absl::SimpleAtoi(wanted, &index) && index >= 0 && static_cast<size_t>(index) < columns_) {
        label_ = index;
      }
      if (label_ < 0) {
        return Bad(absl::StrCat("line ", line_, ": data.label_column \"", wanted, "\" is ",
                                data_.header() ? "neither a column name of the header nor" : "not",
                                " a column index in [0, ", columns_, ")",
                                data_.header() ? absl::StrCat(".", Suggest(wanted, names_)) : std::string()));
      }
    }
    SEGPS_RETURN_IF_ERROR(FindCategorical());
    const size_t features = columns_ - 1 - categorical_.size();
    if (features != static_cast<size_t>(width_)) {
      return Bad(absl::StrCat("line ", line_, ": ", features, " feature columns (", columns_, " columns, one the label",
                              categorical_.empty() ? "" : absl::StrCat(", ", categorical_.size(), " categorical"),
                              "), but model.input_width is ", width_));
    }
    for (size_t c = 0; c < names_.size(); ++c) {
      if (static_cast<int>(c) != label_ && !field_of_.contains(c)) out_.columns.push_back(names_[c]);
    }
    return absl::OkStatus();
  }

  // data.categorical_columns, found by name in the header.
  absl::Status FindCategorical() {
    for (const std::string& wanted : data_.categorical_columns()) {
      const auto it = std::find(names_.begin(), names_.end(), wanted);
      if (it == names_.end()) {
        return Bad(absl::StrCat("line ", line_, ": data.categorical_columns \"", wanted,
                                "\" is not a column name of the header.", Suggest(wanted, names_)));
      }
      const size_t c = static_cast<size_t>(it - names_.begin());
      if (static_cast<int>(c) == label_ || !field_of_.emplace(c, categorical_.size()).second) {
        return Bad(absl::StrCat("line ", line_, ": data.categorical_columns \"", wanted,
                                "\" is the label column or named twice"));
      }
      categorical_.push_back(c);
    }
    return absl::OkStatus();
  }

  absl::Status Row(const std::vector<absl::string_view>& fields) {
    if (fields.size() != columns_) {
      return Bad(absl::StrCat("line ", line_, ": ", fields.size(), " fields, but the ",
                              data_.header() ? "header has " : "first line has ", columns_));
    }
    int j = 0;
    int32_t y = 0;
    for (size_t c = 0; c < columns_; ++c) {
      if (const auto field = field_of_.find(c); field != field_of_.end()) {
        const uint64_t hash = Fnv1a64(fields[c]), vocab = vocab_[field->second];
        ids_[field->second] = vocab == 0 ? hash : hash % vocab;
        continue;
      }
      double v = 0;
      if (!absl::SimpleAtod(fields[c], &v)) {
        return Bad(absl::StrCat("line ", line_, " ", ColumnName(c), ": '", fields[c], "' is not a number"));
      }
      // Features train as float32: a value beyond its range is refused, not trained as infinity.
      if (!std::isfinite(v) || (static_cast<int>(c) != label_ && !std::isfinite(static_cast<float>(v)))) {
        return Bad(absl::StrCat("line ", line_, " ", ColumnName(c), ": '", fields[c], "' is not finite",
                                std::isfinite(v) ? " as a float32" : ""));
      }
      if (static_cast<int>(c) != label_) {
        row_[j++] = static_cast<float>(v);
      } else if (regression_) {
        if (!std::isfinite(static_cast<float>(v))) {
          return Bad(absl::StrCat("line ", line_, " ", ColumnName(c), ": target '", fields[c],
                                  "' is not finite as a float32"));
        }
        y = TargetBits(static_cast<float>(v));
      } else if (v != std::floor(v) || v < 0 || v >= classes_) {
        return Bad(absl::StrCat("line ", line_, " ", ColumnName(c), ": label '", fields[c], "' is not a class in [0, ",
                                classes_, ")"));
      } else {
        y = static_cast<int32_t>(v);
      }
    }
    out_.y.push_back(y);
    out_.x.insert(out_.x.end(), row_.begin(), row_.end());
    out_.ids.insert(out_.ids.end(), ids_.begin(), ids_.end());
    return absl::OkStatus();
  }

  const std::string& path_;
  const v1::DataConfig& data_;
  const int width_, classes_;
  const bool regression_;
  uint64_t line_ = 0;
  size_t columns_ = 0;
  int label_ = -1;
  std::vector<std::string> names_;
  std::vector<float> row_;
  // Categorical columns: their positions in field order, each column's
  // field, each field's vocab, and the row's ids.
  std::vector<size_t> categorical_;
  absl::flat_hash_map<size_t, size_t> field_of_;
  std::vector<uint64_t> vocab_;
  std::vector<uint64_t> ids_;
  Dataset out_;
};

}  // namespace

absl::StatusOr<Dataset> ReadCsv(const std::string& path, const v1::JobConfig& config) {
  return CsvReader(path, config).Read();
}

namespace {

// Where each of a model's `width` features is in a table whose first line
// is `first`: by name in a header (`names`, the training's feature
// columns; other columns, the label among them, are skipped), or, for a
// model trained without names, the table's columns in order. Whether the
// first line is a header goes to `header`.
absl::StatusOr<std::vector<size_t>> FeatureColumns(const std::string& path, const std::vector<absl::string_view>& first,
                                                  const std::vector<std::string>& names, int width, bool* header) {
  double number = 0;
  *header = !names.empty() || !absl::SimpleAtod(first[0], &number);
  std::vector<size_t> at;
  if (names.empty()) {
    if (first.size() != static_cast<size_t>(width)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": line 1: ", first.size(), " columns, but the model takes ", width,
          " features and was trained without column names: give exactly its features, in order"));
    }
    for (size_t c = 0; c < first.size(); ++c) at.push_back(c);
    return at;
  }
  std::vector<std::string> given(first.begin(), first.end());
  for (const std::string& name : names) {
    auto it = std::find(given.begin(), given.end(), name);
    if (it == given.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": line 1: no column \"", name,
                                                     "\", a feature the model was trained on.", Suggest(name, given)));
    }
    at.push_back(static_cast<size_t>(it - given.begin()));
  }
  return at;
}

}  // namespace

absl::StatusOr<Dataset> ReadCsvFeatures(const std::string& path, char delimiter,
                                        const std::vector<std::string>& names, int width, float scale) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  Dataset out;
  out.width = width;
  out.columns = names;
  std::vector<size_t> at;
  size_t columns = 0;
  uint64_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::vector<absl::string_view> fields = Fields(line, delimiter);
    if (columns == 0) {
      bool header = false;
      absl::StatusOr<std::vector<size_t>> found = FeatureColumns(path, fields, names, width, &header);
      if (!found.ok()) return found.status();
      at = *std::move(found);
      columns = fields.size();
      if (header) continue;
    }
    if (fields.size() != columns) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": line ", number, ": ", fields.size(), " fields, but the first line has ", columns));
    }
    for (size_t c : at) {
      double v = 0;
      if (!absl::SimpleAtod(fields[c], &v) || !std::isfinite(static_cast<float>(v))) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": line ", number, " column ", c + 1, ": '", fields[c],
                                                       "' is not a finite number"));
      }
      out.x.push_back(static_cast<float>(v) * scale);
    }
    out.y.push_back(0);
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  if (out.y.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": holds no data rows"));
  return out;
}

}  // namespace segps
