#include "worker/data/csv.h"

#include <cmath>
#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config_hints.h"
#include "common/status_macros.h"

namespace segps {
namespace {

class CsvReader {
 public:
  CsvReader(const std::string& path, const v1::JobConfig& config)
      : path_(path),
        data_(config.data()),
        width_(static_cast<int>(config.model().input_width())),
        classes_(static_cast<int>(config.model().num_classes())),
        row_(width_) {
    out_.width = width_;
    out_.classes = classes_;
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
      std::vector<absl::string_view> fields = absl::StrSplit(line, delimiter);
      for (absl::string_view& f : fields) {
        f = absl::StripAsciiWhitespace(f);
        if (f.size() >= 2 && f.front() == '"' && f.back() == '"') f = f.substr(1, f.size() - 2);
      }
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
    if (columns_ - 1 != static_cast<size_t>(width_)) {
      return Bad(absl::StrCat("line ", line_, ": ", columns_ - 1, " feature columns (", columns_,
                              " columns, one the label), but model.input_width is ", width_));
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
      } else if (v != std::floor(v) || v < 0 || v >= classes_) {
        return Bad(absl::StrCat("line ", line_, " ", ColumnName(c), ": label '", fields[c], "' is not a class in [0, ",
                                classes_, ")"));
      } else {
        y = static_cast<int32_t>(v);
      }
    }
    out_.y.push_back(y);
    out_.x.insert(out_.x.end(), row_.begin(), row_.end());
    return absl::OkStatus();
  }

  const std::string& path_;
  const v1::DataConfig& data_;
  const int width_, classes_;
  uint64_t line_ = 0;
  size_t columns_ = 0;
  int label_ = -1;
  std::vector<std::string> names_;
  std::vector<float> row_;
  Dataset out_;
};

}  // namespace

absl::StatusOr<Dataset> ReadCsv(const std::string& path, const v1::JobConfig& config) {
  return CsvReader(path, config).Read();
}

}  // namespace segps
