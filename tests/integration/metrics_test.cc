// Scrapes the Prometheus endpoints of a running server and worker, and of
// the two stages of a pipeline (separate processes), and checks every line
// against the text exposition format: with promtool (Debian's prometheus
// package) when installed, and always with the rules below; and what a
// stage reports against what it did.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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
  // The server's per-worker series come from its stats, refreshed as it
  // ticks: scraped until the worker's row is there (a slow build may see the
  // worker's first loss before the server's next refresh).
  std::string server_text = Scrape(server_metrics);
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       server_text.find("segps_server_worker_clock{") == std::string::npos && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(50));
    server_text = Scrape(server_metrics);
  }
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


// The value of one series (name{labels} exactly as exposed) in a scrape; -1 if absent.
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  double v = -1;
  const size_t begin = at + series.size() + 2;
  if (!absl::SimpleAtod(text.substr(begin, text.find('\n', begin) - begin), &v)) return -1;
  return v;
}

// Two stages (50 -> 32 relu | -> 10 softmax), one replica, 2 micro-batches
// of 16 rows a clock (512 samples: no short mini-batch), every pass padded
// (--pass_ms 1: forwards 1 ms, backwards 2 ms), training until stopped.
TEST(Metrics, APipelineStageReportsItsBusyAndWaitingTimeAndTheBytesOnItsLinks) {
  const std::string dir = MakeTempDir();
  ChainJob job(2, 2);
  job.epochs = 100000;
  job.train_samples = 512;
  job.training = "log_interval_s: 100";
  const std::string config = WriteChainJob(dir, "chain", job);
  ServerProcesses servers = StartServers(config, 2);
  ASSERT_TRUE(servers.ok()) << servers.Output();
  auto start_stage = [&](int stage, const std::vector<std::string>& more) {
    std::vector<std::string> argv = {BinaryPath("segps-worker"), "--config", config, "--segment", std::to_string(stage),
                                     "--rank", "0", "--servers", servers.Joined(), "--metrics_listen", "0",
                                     "--pass_ms", "1"};
    argv.insert(argv.end(), more.begin(), more.end());
    return Subprocess::Start(argv);
  };
  auto metrics_address = [](Subprocess& p) -> std::string {
    std::optional<std::string> line = p.WaitForLine("metrics on http://", absl::Seconds(30));
    if (!line.has_value()) return "";
    const std::string rest = line->substr(line->find("http://") + 7);
    return rest.substr(0, rest.find('/'));
  };
  std::unique_ptr<Subprocess> last = start_stage(1, {"--stage_listen", "127.0.0.1:0"});
  const std::string last_metrics = metrics_address(*last);
  ASSERT_FALSE(last_metrics.empty()) << last->output();
  std::optional<std::string> link = last->WaitForLine("stage link listening on ", absl::Seconds(30));
  ASSERT_TRUE(link.has_value()) << last->output();
  std::unique_ptr<Subprocess> first = start_stage(0, {"--next_stage", link->substr(link->rfind(' ') + 1)});
  const std::string first_metrics = metrics_address(*first);
  ASSERT_FALSE(first_metrics.empty()) << first->output();

  // Until the last stage has trained 20 clocks (about 6 ms each).
  const std::string last_steps = R"(segps_worker_steps_total{segment="last"})";
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Sample(Scrape(last_metrics), last_steps) < 20 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  const std::string first_text = Scrape(first_metrics), last_text = Scrape(last_metrics);
  ASSERT_GE(Sample(last_text, last_steps), 20) << last_text << last->output() << first->output();
  CheckExposition(first_text);
  CheckExposition(last_text);

  // Stage 0: no loss of its own; it waits only for the next stage's gradients.
  const std::string s0 = R"({segment="first",stage="0"})";
  auto first_series = [&](const std::string& name, const std::string& label = "") {
    return Sample(first_text, name + (label.empty() ? s0 : absl::StrCat(R"({)", label, R"(,segment="first",stage="0"})")));
  };
  EXPECT_EQ(first_text.find("segps_worker_training_loss"), std::string::npos) << first_text;
  const double steps = Sample(first_text, R"(segps_worker_steps_total{segment="first"})");
  ASSERT_GE(steps, 1) << first_text;
  // Each clock: 2 forwards of at least 1 ms, 2 backwards of at least 2 ms
  // (the clock counted last may have run after the busy time was read).
  EXPECT_GE(first_series("segps_worker_stage_busy_seconds_total"), (steps - 1) * 0.006) << first_text;
  EXPECT_EQ(first_series("segps_worker_stage_waiting_seconds_total", R"(neighbour="previous")"), 0) << first_text;
  EXPECT_GT(first_series("segps_worker_stage_waiting_seconds_total", R"(neighbour="next")"), 0) << first_text;
  // Activations: 16 rows x 32 floats a micro-batch, 2 a clock.
  const double sent = first_series("segps_worker_stage_activation_bytes_total", R"(direction="sent")");
  EXPECT_GE(sent, steps * 2 * 16 * 32 * 4) << first_text;
  EXPECT_EQ(std::fmod(sent, 16 * 32 * 4), 0) << first_text;
  const double gradients = first_series("segps_worker_stage_gradient_bytes_total", R"(direction="received")");
  EXPECT_GE(gradients, steps * 2 * 16 * 32 * 4) << first_text;
  EXPECT_LE(gradients, sent) << first_text;
  EXPECT_EQ(first_series("segps_worker_stage_activation_bytes_total", R"(direction="received")"), 0) << first_text;
  const double idle = first_series("segps_worker_stage_idle_share");
  EXPECT_GT(idle, 0) << first_text;
  EXPECT_LT(idle, 1) << first_text;

  // The last stage: its loss, and waits only for the previous stage's activations.
  const std::string s1 = R"(,segment="last",stage="1"})";
  EXPECT_GE(Sample(last_text, R"(segps_worker_training_loss{segment="last"})"), 0) << last_text;
  EXPECT_GT(Sample(last_text, R"(segps_worker_stage_waiting_seconds_total{neighbour="previous")" + s1), 0) << last_text;
  EXPECT_EQ(Sample(last_text, R"(segps_worker_stage_waiting_seconds_total{neighbour="next")" + s1), 0) << last_text;
  EXPECT_GT(Sample(last_text, R"(segps_worker_stage_activation_bytes_total{direction="received")" + s1), 0) << last_text;
  EXPECT_GT(Sample(last_text, R"(segps_worker_stage_gradient_bytes_total{direction="sent")" + s1), 0) << last_text;
  Promtool(first_text, dir);
  Promtool(last_text, dir);
}

}  // namespace
}  // namespace segps
