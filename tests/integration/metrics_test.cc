// Scrapes the Prometheus endpoints of a running server and worker (separate
// processes) and checks every line against the text exposition format:
// with promtool (Debian's prometheus package) when installed, and always
// with the rules below.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/support/subprocess.h"

namespace segps {
namespace {

// GET http://host:port/metrics over a plain socket; the body.
std::string Scrape(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The text format's rules: HELP/TYPE comments, sample lines of
// name{label="value",...} value, histogram buckets cumulative with an
// le="+Inf" bucket equal to _count. Returns the sample names seen.
std::set<std::string> CheckExposition(const std::string& text) {
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*,?)?\})? (\S+)( -?[0-9]+)?$)");
  const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  std::set<std::string> names;
  std::map<std::string, std::string> types;
  std::map<std::string, double> last_bucket;  // series without le -> last cumulative count
  for (absl::string_view piece : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string line(piece);
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE", 0) == 0) {
      EXPECT_TRUE(std::regex_match(line, m, type_line)) << "bad TYPE line: " << line;
      if (!m.empty()) types[m[1]] = m[2];
      continue;
    }
    EXPECT_NE(line[0], '#') << "unknown comment: " << line;
    if (!std::regex_match(line, m, sample)) {
      ADD_FAILURE() << "bad sample line: " << line;
      continue;
    }
    names.insert(m[1]);
    const std::string value = m[7];
    double v = 0;
    EXPECT_TRUE(value == "+Inf" || value == "-Inf" || value == "NaN" || absl::SimpleAtod(value, &v))
        << "bad value in " << line;
    std::string name = m[1];
    const std::string labels = m[3].matched ? std::string(m[3]) : "";
    if (name.size() > 7 && name.compare(name.size() - 7, 7, "_bucket") == 0) {
      const std::string base = name.substr(0, name.size() - 7);
      EXPECT_EQ(types[base], "histogram") << line;
      const std::string series = base + std::regex_replace(labels, std::regex(R"(,?le="[^"]*")"), "");
      EXPECT_GE(v, last_bucket[series]) << "buckets not cumulative: " << line;
      last_bucket[series] = v;
    }
  }
  return names;
}

void Promtool(const std::string& text, const std::string& dir) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) return;
  WriteFile(dir + "/scrape.txt", text);
  std::unique_ptr<Subprocess> p =
      Subprocess::Start({"/bin/sh", "-c", "promtool check metrics < " + dir + "/scrape.txt"});
  std::optional<int> status = p->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  // promtool exits 3 for lint warnings (naming advice) and 1 for format errors.
  EXPECT_NE(WEXITSTATUS(*status), 1) << p->output();
  EXPECT_EQ(p->output().find("error"), std::string::npos) << p->output();
}

TEST(Metrics, ServerAndWorkerEndpointsFollowTheExpositionFormat) {
  const std::string dir = MakeTempDir();
  const std::string config = WriteEndlessJob(dir, 1, 1);
  std::unique_ptr<Subprocess> server = Subprocess::Start({BinaryPath("segps-server"), "--config", config, "--index", "0",
                                                          "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0"});
  std::optional<std::string> metrics_line = server->WaitForLine("metrics on http://", absl::Seconds(30));
  ASSERT_TRUE(metrics_line.has_value()) << server->output();
  std::optional<std::string> listen_line = server->WaitForLine("listening on", absl::Seconds(30));
  ASSERT_TRUE(listen_line.has_value()) << server->output();
  auto address_of = [](const std::string& line, const std::string& after) {
    std::string rest = line.substr(line.find(after) + after.size());
    return rest.substr(0, rest.find('/'));
  };
  const std::string server_metrics = address_of(*metrics_line, "http://");
  std::unique_ptr<Subprocess> worker = Subprocess::Start(
      {BinaryPath("segps-worker"), "--config", config, "--segment", "0", "--servers",
       listen_line->substr(listen_line->rfind(' ') + 1), "--metrics_listen", "0"});
  std::optional<std::string> worker_line = worker->WaitForLine("metrics on http://", absl::Seconds(30));
  ASSERT_TRUE(worker_line.has_value()) << worker->output();
  // A port alone is loopback: exposing metrics to other hosts is asked for by address.
  EXPECT_NE(worker_line->find("http://127.0.0.1:"), std::string::npos) << *worker_line;
  ASSERT_TRUE(worker->WaitForLine("loss", absl::Seconds(60)).has_value()) << worker->output();

  const std::string worker_text = Scrape(address_of(*worker_line, "http://"));
  const std::string server_text = Scrape(server_metrics);
  std::set<std::string> worker_names = CheckExposition(worker_text);
  std::set<std::string> server_names = CheckExposition(server_text);
  for (const char* name : {"segps_worker_training_loss", "segps_worker_training_accuracy", "segps_worker_samples_per_second",
                           "segps_worker_clock", "segps_worker_blocked_seconds_total", "segps_worker_pull_seconds_bucket",
                           "segps_worker_push_seconds_count", "segps_worker_observed_staleness_clocks_bucket",
                           "segps_worker_push_bytes_total"}) {
    EXPECT_TRUE(worker_names.count(name)) << name << " missing from\n" << worker_text;
  }
  for (const char* name : {"segps_server_pulls_total", "segps_server_push_bytes_total", "segps_server_pull_seconds_bucket",
                           "segps_server_optimizer_apply_seconds_sum", "segps_server_observed_staleness_clocks_count",
                           "segps_server_staleness_blocked_seconds_total", "segps_server_worker_clock"}) {
    EXPECT_TRUE(server_names.count(name)) << name << " missing from\n" << server_text;
  }
  EXPECT_NE(server_text.find("segps_server_worker_clock{rank=\"0\",segment=\"s\",server=\"0\"}"), std::string::npos)
      << server_text;
  Promtool(worker_text, dir);
  Promtool(server_text, dir);
}

}  // namespace
}  // namespace segps
