#include "common/command_line.h"

#include <array>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace segps {
namespace {

// The source folders that define flags, as they appear in __FILE__.
constexpr std::array<absl::string_view, 5> kFolders = {"/server/", "/worker/", "/common/", "/deploy/", "/tests/"};

// Whether segps's sources define flags of `file` (raw or already normalized).
bool Ours(absl::string_view file) {
  const std::string path = SourcePath(file);
  for (absl::string_view folder : kFolders) {
    if (absl::StartsWith(path, folder.substr(1))) return true;
  }
  return false;
}

}  // namespace

std::string SourcePath(absl::string_view file) {
  size_t best = absl::string_view::npos;
  for (absl::string_view folder : kFolders) {
    const size_t at = file.rfind(folder);
    if (at != absl::string_view::npos && (best == absl::string_view::npos || at > best)) best = at;
  }
  if (best == absl::string_view::npos) return std::string(file);
  return std::string(file.substr(best + 1));
}

std::vector<char*> ParseCommandLine(int argc, char** argv, absl::string_view usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = Ours;
  config.contains_helpshort_flags = Ours;
  config.normalize_filename = SourcePath;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace segps
