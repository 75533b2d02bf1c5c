// Where a job config's fields were written, for errors that name the file,
// line and field, and the checks of the config's parts that live outside
// common/config.cc (they take a Locator, and fill defaults).
#ifndef SEGPS_COMMON_CONFIG_LOCATOR_H_
#define SEGPS_COMMON_CONFIG_LOCATOR_H_

#include <algorithm>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "segps/v1/config.pb.h"

namespace segps {

// Finds where a field was written so that errors can point at the line.
// A path is a list of (field name, repeated index or -1) from the root.
class Locator {
 public:
  Locator(const google::protobuf::TextFormat::ParseInfoTree* tree, std::string source)
      : tree_(tree), source_(std::move(source)) {}

  struct Step {
    const char* field;
    int index;
  };

  // "FILE line N: a.b[2].c: message"; the line is the deepest located step.
  absl::Status Error(std::initializer_list<Step> path, const std::string& message) const {
    const google::protobuf::Descriptor* desc = v1::JobConfig::descriptor();
    const google::protobuf::TextFormat::ParseInfoTree* tree = tree_;
    int line = -1;
    std::string name;
    for (const Step& step : path) {
      const google::protobuf::FieldDescriptor* field = desc ? desc->FindFieldByName(step.field) : nullptr;
      if (!name.empty()) name += '.';
      name += step.field;
      if (step.index >= 0) absl::StrAppend(&name, "[", step.index, "]");
      if (field == nullptr) break;
      if (tree != nullptr) {
        auto loc = tree->GetLocation(field, field->is_repeated() ? std::max(step.index, 0) : -1);
        if (loc.line >= 0) line = loc.line;
        tree = field->message_type() != nullptr
                   ? tree->GetTreeForNested(field, field->is_repeated() ? std::max(step.index, 0) : -1)
                   : nullptr;
      }
      desc = field->message_type();
    }
    std::string where = line >= 0 ? absl::StrCat(source_, " line ", line + 1) : source_;
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", name, ": ", message));
  }

 private:
  const google::protobuf::TextFormat::ParseInfoTree* tree_;
  std::string source_;
};

// data: its source and the synthetic sets' fields (common/config_data.cc).
absl::Status ValidateDataSource(v1::JobConfig& c, const Locator& at);
// data: the fields of NPY and CSV files.
absl::Status ValidateDataFiles(v1::JobConfig& c, const Locator& at);

}  // namespace segps

#endif  // SEGPS_COMMON_CONFIG_LOCATOR_H_
