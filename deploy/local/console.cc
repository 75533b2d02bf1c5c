#include "deploy/local/console.h"

#include <cctype>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace segps {
namespace {

// A log line's level ('I', 'W', 'E') and message (common/log.h writes
// "HH:MM:SS.mmm L message"); level ' ' for a line that is no log line.
std::pair<char, std::string> SplitLevel(const std::string& line) {
  const size_t space = line.find(' ');
  const bool stamped = space != std::string::npos && space >= 9 && line[2] == ':' && line[5] == ':' &&
                       line[8] == '.' && line.size() > space + 3 && line[space + 2] == ' ';
  if (!stamped) return {' ', line};
  return {line[space + 1], line.substr(space + 3)};
}

// Lines that are not log lines but only say a process started.
bool StartChatter(const std::string& message) {
  for (const char* prefix : {"segps-server: plaintext", "segps-server listening on", "segps-server metrics on",
                             "stage link listening on"}) {
    if (absl::StartsWith(message, prefix)) return true;
  }
  return false;
}

// Reads the decimal number at `*p` in `text`, moving past it.
std::optional<uint64_t> Number(const std::string& text, size_t* p) {
  const size_t start = *p;
  while (*p < text.size() && std::isdigit(static_cast<unsigned char>(text[*p]))) ++*p;
  uint64_t value = 0;
  if (*p == start || !absl::SimpleAtoi(text.substr(start, *p - start), &value)) return std::nullopt;
  return value;
}

std::string Left(absl::Duration left) {
  const int64_t s = absl::ToInt64Seconds(absl::Ceil(left, absl::Seconds(1)));
  if (s < 60) return absl::StrCat(s, "s left");
  if (s < 3600) return absl::StrFormat("%dm%02ds left", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm left", s / 3600, s / 60 % 60);
}

}  // namespace

Console::Console(std::ostream* out, bool verbose, bool live, int width)
    : out_(out), verbose_(verbose), live_(live), width_(static_cast<size_t>(width > 20 ? width : 20)) {}

std::optional<Console::Progress> Console::ParseProgress(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos) return std::nullopt;
  const size_t slash = message.find('/');
  if (slash == std::string::npos || slash > colon) return std::nullopt;  // a worker's tag: NAME/REPLICA
  Progress progress;
  progress.key = message.substr(0, slash);
  progress.text = message.substr(colon + 2);
  size_t p = 0;
  if (absl::StartsWith(progress.text, "epoch ")) {
    p = progress.text.find(' ', 6);
    if (p == std::string::npos) return std::nullopt;
    ++p;
  }
  if (progress.text.compare(p, 5, "step ") != 0) return std::nullopt;
  p += 5;
  std::optional<uint64_t> step = Number(progress.text, &p);
  if (!step.has_value()) return std::nullopt;
  progress.step = *step;
  if (p < progress.text.size() && progress.text[p] == '/') {
    ++p;
    progress.total = Number(progress.text, &p);
    if (!progress.total.has_value()) return std::nullopt;
  }
  if (p < progress.text.size() && progress.text[p] != ' ') return std::nullopt;
  return progress;
}

bool Console::Shown(const std::string& process, char level, const std::string& message) const {
  if (verbose_) return true;
  if (level == 'W' || level == 'E') return !absl::StrContains(message, "skipped: the disk is slower");
  if (level == ' ') {
    if (StartChatter(message)) return false;
    return process != "eval" || !absl::StartsWith(message, "traffic ");
  }
  // A server restored from its checkpoint is a recovery the user sees.
  if (absl::StartsWith(process, "server")) return absl::StrContains(message, ": restored ");
  if (process.find('/') != std::string::npos) {
    return absl::StrContains(message, ": done: ") || absl::StrContains(message, " test accuracy ") ||
           absl::StrContains(message, " validation loss ");
  }
  return true;
}

void Console::Line(const std::string& process, const std::string& line, absl::Time now) {
  const auto [level, message] = SplitLevel(line);
  if (level == 'I' && process.find('/') != std::string::npos) {  // a worker's progress
    if (std::optional<Progress> progress = ParseProgress(message)) {
      if (live_ && !ended_) {
        Update(*progress, now);
      } else {
        Scroll(absl::StrCat("[", process, "] ", line));
      }
      return;
    }
  }
  const bool worker = process.find('/') != std::string::npos;
  if (const size_t done = message.find(": done: "); worker && live_ && !ended_ && done != std::string::npos) {
    Bar& bar = BarOf(message.substr(0, done));  // the worker's tag is its segment's name here
    bar.text = "done";
    bar.left.clear();
  }
  if (Shown(process, level, message)) Scroll(absl::StrCat("[", process, "] ", line));
}

void Console::Say(const std::string& line) { Scroll(line); }

void Console::EndProgress() {
  ended_ = true;
  drawn_ = 0;  // the block stays where it is; what follows goes below it
}

Console::Bar& Console::BarOf(const std::string& key) {
  for (Bar& bar : bars_) {
    if (bar.key == key) return bar;
  }
  Bar bar;
  bar.key = key;
  bars_.push_back(std::move(bar));
  return bars_.back();
}

void Console::Update(const Progress& progress, absl::Time now) {
  Bar& bar = BarOf(progress.key);
  if (bar.first_at == absl::Time() || progress.step < bar.step) {  // a first line, or a rollback
    bar.first_at = now;
    bar.first_step = progress.step;
  }
  bar.text = progress.text;
  bar.step = progress.step;
  if (progress.total.has_value()) bar.total = progress.total;
  // A stage after the first does not know the total: the chain's first stage does.
  std::optional<uint64_t> total = bar.total;
  for (const Bar& other : bars_) {
    if (!total.has_value()) total = other.total;
  }
  bar.left.clear();
  if (total.has_value() && bar.step > bar.first_step && now > bar.first_at) {
    const double per_step = absl::ToDoubleSeconds(now - bar.first_at) / static_cast<double>(bar.step - bar.first_step);
    const uint64_t to_go = *total > bar.step ? *total - bar.step : 0;
    bar.left = Left(absl::Seconds(per_step * static_cast<double>(to_go)));
  }
  Draw();
}

void Console::Scroll(const std::string& text) {
  if (live_ && drawn_ > 0) *out_ << "\x1b[" << drawn_ << "A\r\x1b[J";  // up over the block, clear it
  *out_ << text << "\n";
  const int was = drawn_;
  drawn_ = 0;
  if (live_ && was > 0) Draw();
  out_->flush();
}

void Console::Draw() {
  if (drawn_ > 0) *out_ << "\x1b[" << drawn_ << "A\r";
  drawn_ = 0;
  for (const Bar& bar : bars_) {
    std::string text = absl::StrCat(bar.key, bar.left.empty() ? "" : absl::StrCat(" (", bar.left, ")"), ": ", bar.text);
    if (text.size() >= width_) text.resize(width_ - 1);
    *out_ << "\x1b[2K" << text << "\n";
    ++drawn_;
  }
  out_->flush();
}

}  // namespace segps
