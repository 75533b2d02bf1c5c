// segps-data: writes the config's training and test sets to .npy files, so
// that a user can inspect exactly what the workers train on.
//
//   segps-data --config job.pbtxt --out DIR
#include <filesystem>
#include <iostream>
#include <system_error>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "common/config.h"
#include "worker/data/dataset.h"

ABSL_FLAG(std::string, config, "", "Job config file (*.pbtxt). Required.");
ABSL_FLAG(std::string, out, ".",
          "Directory for train_x.npy, train_y.npy, test_x.npy, test_y.npy (and train_ids.npy, test_ids.npy with ids).");

int main(int argc, char** argv) {
  segps::ParseCommandLine(
      argc, argv, "Exports a config's data as .npy.\n  segps-data --config FILE --out DIR");
  absl::StatusOr<segps::v1::JobConfig> config = segps::LoadConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) {
    std::cerr << "segps-data: " << config.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<segps::TrainTest> data = segps::LoadData(*config);
  if (!data.ok()) {
    std::cerr << "segps-data: " << data.status().message() << "\n";
    return 1;
  }
  std::error_code made;
  std::filesystem::create_directories(absl::GetFlag(FLAGS_out), made);
  if (made) {
    std::cerr << "segps-data: cannot create --out " << absl::GetFlag(FLAGS_out) << ": " << made.message() << "\n";
    return 1;
  }
  for (auto [set, name] : {std::pair{&data->train, "train"}, std::pair{&data->test, "test"}}) {
    absl::Status status = segps::ExportNpy(*set, absl::GetFlag(FLAGS_out), name);
    if (!status.ok()) {
      std::cerr << "segps-data: " << status.message() << "\n";
      return 1;
    }
    std::cout << name << ": " << set->size() << " samples x " << set->width << " features\n";
  }
  return 0;
}
