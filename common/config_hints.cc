#include "common/config_hints.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace segps {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

// Edit distance counting a swap of neighbours as one edit (optimal string
// alignment), ASCII case ignored.
size_t Distance(absl::string_view a, absl::string_view b) {
  const auto same = [&](size_t i, size_t j) { return absl::ascii_tolower(a[i]) == absl::ascii_tolower(b[j]); };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (same(i - 1, j - 1) ? 0 : 1)});
      if (i > 1 && j > 1 && same(i - 1, j - 2) && same(i - 2, j - 1)) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The enum types of every field named `name` in `message` and the
// messages under it.
void EnumsNamed(const Descriptor& message, absl::string_view name, std::set<const Descriptor*>* seen,
                std::set<const EnumDescriptor*>* out) {
  if (!seen->insert(&message).second) return;
  for (int i = 0; i < message.field_count(); ++i) {
    const FieldDescriptor& field = *message.field(i);
    if (field.name() == name && field.enum_type() != nullptr) out->insert(field.enum_type());
    if (field.message_type() != nullptr) EnumsNamed(*field.message_type(), name, seen, out);
  }
}

std::string EnumHint(const Descriptor& root, const std::string& value, const std::string& field) {
  std::set<const Descriptor*> seen;
  std::set<const EnumDescriptor*> enums;
  EnumsNamed(root, field, &seen, &enums);
  std::vector<std::string> allowed;
  for (const EnumDescriptor* e : enums) {
    for (int i = 0; i < e->value_count(); ++i) {
      // The zero value means "not set", not a choice.
      if (!absl::EndsWith(e->value(i)->name(), "_UNSPECIFIED")) allowed.push_back(e->value(i)->name());
    }
  }
  if (allowed.empty()) return "";
  const std::string near = Nearest(value, allowed);
  return absl::StrCat(near.empty() ? "" : absl::StrCat(" Did you mean ", near, "?"), " Allowed: ",
                      absl::StrJoin(allowed, ", "), ".");
}

std::string FieldHint(const std::string& type, const std::string& field) {
  const Descriptor* message = google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(type);
  if (message == nullptr) return "";
  std::vector<std::string> names;
  for (int i = 0; i < message->field_count(); ++i) names.push_back(message->field(i)->name());
  const std::string near = Nearest(field, names);
  if (near.empty()) return absl::StrCat(" Its fields: ", absl::StrJoin(names, ", "), ".");
  return absl::StrCat(" Did you mean \"", near, "\"?");
}

}  // namespace

std::string Nearest(absl::string_view typo, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = 0;
  for (const std::string& name : names) {
    const size_t d = Distance(typo, name);
    if (best.empty() || d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  // A typo is a slip or two, not another word.
  const size_t near_enough = std::max<size_t>(1, std::min<size_t>(3, typo.size() / 3));
  return !best.empty() && best_distance <= near_enough ? best : "";
}

std::string Suggest(absl::string_view typo, const std::vector<std::string>& names) {
  const std::string near = Nearest(typo, names);
  return absl::StrCat(near.empty() ? "" : absl::StrCat(" Did you mean \"", near, "\"?"), " The names: ",
                      absl::StrJoin(names, ", "), ".");
}

std::string ParseErrorHint(const Descriptor& root, absl::string_view message) {
  // protobuf's wording: Unknown enumeration value of "TANHH" for field "activation".
  //                     Message type "segps.v1.OptimizerConfig" has no field named "learing_rate".
  constexpr absl::string_view kEnum = "Unknown enumeration value of ", kField = "Message type ";
  const size_t enum_at = message.find(kEnum), field_at = message.find(kField);
  const bool is_enum = enum_at != absl::string_view::npos;
  if (!is_enum && (field_at == absl::string_view::npos || !absl::StrContains(message, "has no field named"))) {
    return "";
  }
  // The first two quoted names after the wording.
  absl::string_view rest = message.substr(is_enum ? enum_at : field_at);
  std::vector<std::string> quoted;
  while (quoted.size() < 2) {
    const size_t open = rest.find('"');
    const size_t close = open == absl::string_view::npos ? open : rest.find('"', open + 1);
    if (close == absl::string_view::npos) return "";
    quoted.emplace_back(rest.substr(open + 1, close - open - 1));
    rest.remove_prefix(close + 1);
  }
  return is_enum ? EnumHint(root, quoted[0], quoted[1]) : FieldHint(quoted[0], quoted[1]);
}

}  // namespace segps
