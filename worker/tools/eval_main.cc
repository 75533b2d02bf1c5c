// segps-eval: pulls every segment from the servers, evaluates each segment
// and the ensemble on the config's test set, prints the report and writes it
// as JSON.
//
//   segps-eval --config job.pbtxt --servers HOST:PORT,... [--report out.json]
#include <algorithm>
#include <fstream>
#include <iostream>
#include <set>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/command_line.h"
#include "common/lock_checks.h"
#include "common/malloc_tuning.h"
#include "common/config.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "worker/model/backend.h"
#include "worker/data/dataset.h"
#include "worker/model/evaluator.h"
#include "worker/model/model_file.h"
#include "worker/train/run_history.h"
#include "worker/client/model_reader.h"
#include "worker/client/ps_client.h"

ABSL_FLAG(std::string, config, "", "Job config file (*.pbtxt). Required.");
ABSL_FLAG(std::string, servers, "", "Comma-separated host:port of every server. Default: cluster.server_addresses.");
ABSL_FLAG(std::string, report, "", "Write the report as JSON to this file.");
ABSL_FLAG(bool, wait_for_training, false,
          "First wait until training has finished: every segment updated and no live worker left.");
ABSL_FLAG(int32_t, wait_timeout_s, 7200, "Longest wait for training, in seconds.");
ABSL_FLAG(std::string, dump_params, "", "Write each segment's flat parameters to DIR/<segment>.npy.");
ABSL_FLAG(std::string, history_dir, "",
          "Put the workers' per-epoch histories found in DIR (segps-worker --history_dir) into the report, with "
          "the ensemble's test accuracy after each epoch where every segment saved its probabilities.");
ABSL_FLAG(std::string, probabilities_out, "",
          "Write the ensemble's class probabilities on the test set to this .npy file (float32 [samples, classes]).");

namespace {
int Fail(const std::string& message) {
  std::cerr << "segps-eval: " << message << "\n";
  return 1;
}

// Each segment's tensor bytes a step, as the servers counted them (a step
// is one update on every server); those out of reach, read from a stand-in,
// counted nothing.
void PrintTraffic(const std::vector<segps::v1::StatsResponse>& servers, const std::set<uint32_t>& out_of_reach) {
  const std::string uncounted =
      out_of_reach.empty() ? "" : absl::StrCat("; not counted: server ", absl::StrJoin(out_of_reach, ", server "),
                                               ", out of reach");
  for (int k = 0; k < servers[0].segments_size(); ++k) {
    uint64_t steps = 0, push = 0, pull = 0, rows = 0;
    std::vector<std::string> held;
    for (const auto& server : servers) {
      const segps::v1::SegmentStats& seg = server.segments(k);
      steps = std::max(steps, seg.updates());
      push += seg.push_bytes();
      pull += seg.pull_bytes();
      rows += seg.embedding_rows();
      held.push_back(absl::StrCat(seg.embedding_rows()));
    }
    std::cout << absl::StrFormat("traffic %s: %d steps, push bytes/step %.0f, pull bytes/step %.0f (server counters%s)%s\n",
                                 servers[0].segments(k).name(), steps,
                                 static_cast<double>(push) / std::max<uint64_t>(steps, 1),
                                 static_cast<double>(pull) / std::max<uint64_t>(steps, 1), uncounted,
                                 rows == 0 ? "" : absl::StrCat("; embedding rows held ", rows, " (by server: ",
                                                              absl::StrJoin(held, ", "), ")"));
  }
}

// Where the servers' states of a segment do not form one model: a server
// behind the others (a recovery under way, or training still moving), or
// one that was restarted or rolled back since `before` was taken. Empty
// when they agree: every server reports the same clock and update count,
// and the same incarnation and generation as in `before` (if given).
std::string Disagreement(const std::vector<segps::v1::StatsResponse>& servers,
                         const std::vector<segps::v1::StatsResponse>* before = nullptr) {
  for (int k = 0; k < servers[0].segments_size(); ++k) {
    for (size_t i = 0; i < servers.size(); ++i) {
      const segps::v1::SegmentStats& a = servers[0].segments(k);
      const segps::v1::SegmentStats& b = servers[i].segments(k);
      if (a.clock() != b.clock() || a.updates() != b.updates()) {
        const bool behind = b.updates() < a.updates();
        return absl::StrFormat(
            "segment %s: server %d is at clock %d (%d updates), server %d at clock %d (%d updates); server %d is "
            "behind, a recovery or training is under way",
            a.name(), i, b.clock(), b.updates(), 0, a.clock(), a.updates(), behind ? i : 0);
      }
      if (before != nullptr && ((*before)[i].incarnation() != servers[i].incarnation() ||
                                (*before)[i].segments(k).generation() != b.generation())) {
        return absl::StrFormat("segment %s: server %d restarted or rolled back while it was read", a.name(), i);
      }
    }
  }
  return "";
}

// Training is over when every server has applied updates to every segment,
// holds no live worker (nor a rank it waits for after a restore) and the
// servers agree. Polled: the evaluator is a tool, not a peer.
absl::Status WaitForTraining(segps::ModelReader& reader, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<segps::v1::StatsResponse>> stats = reader.Stats();
    bool done = stats.ok();
    int live = 0;
    if (stats.ok()) {
      for (const auto& server : *stats) {
        for (const auto& seg : server.segments()) done = done && seg.updates() > 0;
        for (const auto& w : server.workers()) live += w.live();
      }
      done = done && live == 0;
    }
    const std::string disagreement = stats.ok() ? Disagreement(*stats) : "";
    if (done && disagreement.empty()) return absl::OkStatus();
    const std::string now =
        !stats.ok() ? std::string(stats.status().message())
        : live > 0  ? absl::StrFormat("waiting for training: %d live worker registrations", live)
        : disagreement.empty() ? std::string("waiting for training: a segment has no update yet")
                    : absl::StrCat("waiting for the servers to agree: ", disagreement);
    if (now != last) std::cout << now << std::endl;
    last = now;
    absl::SleepFor(absl::Seconds(1));
  }
  return absl::DeadlineExceededError("training did not finish within --wait_timeout_s");
}
// The segments' parameters, never a mixture: the servers must agree before
// and after the read. A disagreement that lasts (a recovery) is waited out
// for a while, then refused.
absl::StatusOr<std::vector<std::vector<float>>> PullAgreed(segps::ModelReader& reader) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  for (bool first = true;; first = false) {
    absl::StatusOr<std::vector<segps::v1::StatsResponse>> before = reader.Stats();
    if (!before.ok()) return before.status();
    std::string disagreement = Disagreement(*before);
    if (disagreement.empty()) {
      if (first) PrintTraffic(*before, reader.out_of_reach());  // counted before this evaluation's own reads
      absl::StatusOr<std::vector<std::vector<float>>> params = reader.Pull();
      if (!params.ok()) return params.status();
      absl::StatusOr<std::vector<segps::v1::StatsResponse>> after = reader.Stats();
      if (!after.ok()) return after.status();
      disagreement = Disagreement(*after, &*before);
      if (disagreement.empty()) return params;
    }
    if (absl::Now() > give_up) {
      return absl::FailedPreconditionError(
          absl::StrCat("refusing to score a mixture of the servers' states: ", disagreement));
    }
    if (first) std::cout << "waiting for the servers to agree: " << disagreement << std::endl;
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// A regression's scores (model.loss MSE): RMSE and MAE, beside the RMSE of
// predicting the test targets' mean.
void PrintRegression(const segps::v1::JobConfig& config, const segps::EvalReport& report) {
  for (const segps::Score& s : report.segments) {
    std::cout << absl::StrFormat("segment %-12s rmse %.4f  mae %.4f\n", s.name, s.rmse.value_or(0), s.mae.value_or(0));
  }
  std::cout << absl::StrFormat("ENSEMBLE (%s) rmse %.4f  mae %.4f\n",
                               config.model().combine() == segps::v1::CHAIN ? "one network: a chain"
                                                                            : "average of the predictions",
                               report.ensemble.rmse.value_or(0), report.ensemble.mae.value_or(0));
  std::cout << absl::StrFormat("baseline (predicting the test targets' mean) rmse %.4f\n", report.chance);
}

void PrintReport(const segps::v1::JobConfig& config, const segps::EvalReport& report) {
  std::cout << absl::StrFormat("== segps evaluation: %s, %d test samples ==\n", config.name(), report.samples);
  if (config.model().loss() == segps::v1::MSE) return PrintRegression(config, report);
  for (const segps::Score& s : report.segments) {
    std::cout << absl::StrFormat("segment %-12s accuracy %6.2f%%  loss %.4f%s\n", s.name, 100 * s.accuracy, s.loss,
                                 s.auc.has_value() ? absl::StrFormat("  auc %.4f", *s.auc) : "");
  }
  std::cout << absl::StrFormat(
      "ENSEMBLE (%s) accuracy %6.2f%%  loss %.4f%s\n",
      config.model().combine() == segps::v1::CHAIN
          ? absl::StrCat("one network: a chain of ", config.model().segments_size(), " stages")
          : std::string("average of softmax outputs"),
      100 * report.ensemble.accuracy, report.ensemble.loss,
      report.ensemble.auc.has_value() ? absl::StrFormat("  auc %.4f", *report.ensemble.auc) : "");
  std::cout << absl::StrFormat("chance level (most frequent label) %.2f%%\n", 100 * report.chance);
  if (config.data().source() == segps::v1::SYNTHETIC_SEED) {
    std::cout << "note: SYNTHETIC_SEED labels are drawn at random, independently of the inputs, so no model can\n"
                 "      beat chance on held-out data: an accuracy near chance is the correct result here.\n";
  }
}

// Writes what the flags ask for: parameters (--dump_params), probabilities
// (--probabilities_out) and the JSON report (--report).
absl::Status WriteOutputs(const segps::v1::JobConfig& config, const std::vector<std::vector<float>>& params,
                          const segps::EvalReport& report) {
  for (size_t k = 0; k < params.size() && !absl::GetFlag(FLAGS_dump_params).empty(); ++k) {
    const std::string path = absl::GetFlag(FLAGS_dump_params) + "/" + config.model().segments(k).name() + ".npy";
    SEGPS_RETURN_IF_ERROR(segps::WriteNpyFloat32(path, params[k].data(), {params[k].size()}));
  }
  if (!absl::GetFlag(FLAGS_probabilities_out).empty()) {
    SEGPS_RETURN_IF_ERROR(segps::WriteNpyFloat32(absl::GetFlag(FLAGS_probabilities_out), report.probabilities.data(),
                                                 {report.samples, config.model().num_classes()}));
  }
  if (!absl::GetFlag(FLAGS_report).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_report));
    out << segps::ToJson(config, report);
    if (!out) return absl::UnavailableError("cannot write " + absl::GetFlag(FLAGS_report));
  }
  return absl::OkStatus();
}

// Pulls, scores and reports the trained model.
absl::Status Run(const segps::v1::JobConfig& config, segps::ModelReader& reader, segps::ParameterClient& client) {
  SEGPS_RETURN_IF_ERROR(segps::ComputedHere(config.model()));
  if (absl::GetFlag(FLAGS_wait_for_training)) {
    SEGPS_RETURN_IF_ERROR(WaitForTraining(reader, absl::Seconds(absl::GetFlag(FLAGS_wait_timeout_s))));
  }
  absl::StatusOr<std::vector<std::vector<float>>> params = PullAgreed(reader);
  if (!params.ok()) return params.status();
  absl::StatusOr<segps::TrainTest> data = segps::LoadData(config);
  if (!data.ok()) return data.status();
  std::unique_ptr<segps::Backend> backend = segps::CreateCpuBackend(1);
  // Embedding rows are read as an observer, as the parameters were.
  const segps::RowSource rows = [&client](int segment, const std::vector<std::vector<uint64_t>>& ids,
                                          std::vector<std::vector<float>>* values) {
    return client.PullRows(segment, 0, ids, values);
  };
  absl::StatusOr<segps::EvalReport> report = segps::Evaluate(config, data->test, *params, backend.get(), rows);
  if (!report.ok()) return report.status();
  if (!absl::GetFlag(FLAGS_history_dir).empty()) {
    absl::StatusOr<segps::v1::RunHistory> history =
        segps::ReadHistory(absl::GetFlag(FLAGS_history_dir), config, data->test);
    if (!history.ok()) return history.status();
    report->history = *std::move(history);
  }
  PrintReport(config, *report);
  return WriteOutputs(config, *params, *report);
}

}  // namespace

int main(int argc, char** argv) {
  segps::TuneMallocForLargeBuffers();
  segps::SkipMutexDeadlockDetection();
  std::vector<char*> positional = segps::ParseCommandLine(
      argc, argv, "segps evaluator.\n  segps-eval --config FILE --servers HOST:PORT,... [--report FILE]");
  if (positional.size() > 1) return Fail(std::string("unexpected argument '") + positional[1] + "'");
  if (absl::GetFlag(FLAGS_config).empty()) return Fail("--config is required (see --help)");
  absl::StatusOr<segps::v1::JobConfig> config = segps::LoadConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) return Fail(std::string(config.status().message()));
  segps::ApplySecurityFlags(config->mutable_security());
  const std::vector<std::string> addresses = segps::ServerAddresses(absl::GetFlag(FLAGS_servers), *config);
  absl::StatusOr<std::unique_ptr<segps::ModelReader>> reader = segps::ModelReader::Connect(*config, addresses);
  if (!reader.ok()) return Fail(std::string(reader.status().message()));
  // Embedding rows (tables are never replicated) through the workers' client.
  absl::StatusOr<std::unique_ptr<segps::ParameterClient>> client = segps::ConnectGrpc(*config, addresses);
  if (!client.ok()) return Fail(std::string(client.status().message()));
  absl::Status done = Run(*config, **reader, **client);
  if (!done.ok()) return Fail(std::string(done.message()));
  return 0;
}
