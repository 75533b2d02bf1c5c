// What a config error needs to say so that a user can fix it: the values
// an enum field allows, the field name nearest a misspelled one, the name
// nearest a misspelled segment or column.
#ifndef SEGPS_COMMON_CONFIG_HINTS_H_
#define SEGPS_COMMON_CONFIG_HINTS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace segps {

// For protobuf's text-format error `message` in a config of type `root`:
// " Did you mean TANH? Allowed: IDENTITY, RELU, ..." after an unknown enum
// value; " Did you mean \"learning_rate\"?" (or the message's fields) after
// an unknown field; else "".
std::string ParseErrorHint(const google::protobuf::Descriptor& root, absl::string_view message);

// The name in `names` nearest to `typo` (case-insensitive edit distance),
// if near enough to be the one meant; "" otherwise.
std::string Nearest(absl::string_view typo, const std::vector<std::string>& names);

// What to append to an error about `typo`, one of `names` misspelled:
// " Did you mean \"relu64\"? The names: relu64, tanh128." (the question
// only where one is near).
std::string Suggest(absl::string_view typo, const std::vector<std::string>& names);

}  // namespace segps

#endif  // SEGPS_COMMON_CONFIG_HINTS_H_
