// segps-checkpoint: the servers' checkpoint files as one model, and back.
//   segps-checkpoint merge --dir DIR --out model.safetensors [--clock C] [--optimizer_slots]
//   segps-checkpoint split --in model.safetensors --config FILE [--num_servers N] --dir OUT
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "common/config.h"
#include "server/checkpoint.h"

ABSL_FLAG(std::string, dir, "", "merge: the checkpoint directory (every server's files); split: where to write.");
ABSL_FLAG(std::string, out, "", "merge: the whole-model safetensors file to write.");
ABSL_FLAG(int64_t, clock, -1, "merge: the clock to merge. Default: per segment, the newest every server holds.");
ABSL_FLAG(bool, optimizer_slots, false, "merge: include the optimizer's state (needed to split and resume).");
ABSL_FLAG(std::string, in, "", "split: a merged file (with optimizer slots).");
ABSL_FLAG(std::string, config, "", "split: the job config.");
ABSL_FLAG(int32_t, num_servers, 0, "split: the server count to cut for. Default: the config's.");

int main(int argc, char** argv) {
  std::vector<char*> positional = segps::ParseCommandLine(
      argc, argv,
      "segps checkpoint tool.\n"
      "  segps-checkpoint merge --dir DIR --out model.safetensors [--clock C] [--optimizer_slots]\n"
      "  segps-checkpoint split --in model.safetensors --config FILE [--num_servers N] --dir OUT");
  const std::string command = positional.size() == 2 ? positional[1] : "";
  absl::Status status;
  if (command == "merge") {
    if (absl::GetFlag(FLAGS_dir).empty() || absl::GetFlag(FLAGS_out).empty()) {
      std::cerr << "segps-checkpoint merge: --dir and --out are required\n";
      return 2;
    }
    std::optional<uint64_t> clock;
    if (absl::GetFlag(FLAGS_clock) >= 0) clock = static_cast<uint64_t>(absl::GetFlag(FLAGS_clock));
    status = segps::MergeCheckpoints(absl::GetFlag(FLAGS_dir), clock, absl::GetFlag(FLAGS_optimizer_slots),
                                     absl::GetFlag(FLAGS_out));
    if (status.ok()) std::cout << "wrote " << absl::GetFlag(FLAGS_out) << "\n";
  } else if (command == "split") {
    if (absl::GetFlag(FLAGS_in).empty() || absl::GetFlag(FLAGS_config).empty() || absl::GetFlag(FLAGS_dir).empty()) {
      std::cerr << "segps-checkpoint split: --in, --config and --dir are required\n";
      return 2;
    }
    absl::StatusOr<segps::v1::JobConfig> config = segps::LoadConfig(absl::GetFlag(FLAGS_config));
    if (!config.ok()) {
      std::cerr << "segps-checkpoint: " << config.status().message() << "\n";
      return 2;
    }
    if (absl::GetFlag(FLAGS_num_servers) > 0) {
      config->mutable_cluster()->set_num_servers(absl::GetFlag(FLAGS_num_servers));
      config->mutable_cluster()->clear_server_addresses();
    }
    status = segps::SplitCheckpoint(absl::GetFlag(FLAGS_in), *config, absl::GetFlag(FLAGS_dir));
    if (status.ok()) {
      std::cout << "wrote checkpoints for " << config->cluster().num_servers() << " servers in "
                << absl::GetFlag(FLAGS_dir) << "\n";
    }
  } else {
    std::cerr << "segps-checkpoint: give a command, merge or split (see --help)\n";
    return 2;
  }
  if (!status.ok()) {
    std::cerr << "segps-checkpoint: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
