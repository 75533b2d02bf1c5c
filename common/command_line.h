// Command lines of segps's binaries: one place that sets how --help reads.
// `--help` lists the binary's own flags (those segps's sources define,
// grouped by the file that defines them, with their defaults), not
// Abseil's; `--helpfull` adds those.
#ifndef SEGPS_COMMON_COMMAND_LINE_H_
#define SEGPS_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace segps {

// Sets `usage` (what the binary does, then its synopsis) and parses argv as
// absl::ParseCommandLine does: exits on a bad flag or a help flag, and
// returns the positional arguments (argv[0] first).
std::vector<char*> ParseCommandLine(int argc, char** argv, absl::string_view usage);

// A flag's defining file as --help names it: the path within the source
// tree ("server/main.cc"), wherever the tree was built; others unchanged.
std::string SourcePath(absl::string_view file);

}  // namespace segps

#endif  // SEGPS_COMMON_COMMAND_LINE_H_
