// segps-bench-step: time of one worker step (forward + backward of an MLP
// segment) on a backend, with and without the transfers a parameter-server
// step needs (parameters in, gradient out, the batch in).
//
//   segps-bench-step --device cuda:0 [--models 50-64-10@128,...] [--steps 20]
//
// Prints one row per model: median ms per step without and with transfers,
// achieved TFLOP/s of the compute, and the share of the step in transfers.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/command_line.h"
#include "worker/model/backend.h"
#include "worker/model/segment_model.h"

ABSL_FLAG(std::string, device, "cpu", "cpu, cuda:N or auto");
ABSL_FLAG(bool, tf32, false, "Allow TF32 tensor cores on a GPU");
ABSL_FLAG(int32_t, cpu_threads, 1, "Threads of the CPU backend");
ABSL_FLAG(std::string, models, "50-64-10@128,784-256-128-10@128,1024-1024-1024-10@4096,4096-4096-4096-10@4096,8192-8192-8192-10@4096",
          "Comma-separated MLPs as WIDTHS@BATCH: input-hidden...-classes, ReLU hidden layers");
ABSL_FLAG(int32_t, steps, 20, "Timed steps per model (after 3 warm-up steps)");

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run() {
  absl::StatusOr<std::unique_ptr<segps::Backend>> backend =
      segps::CreateBackend(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_tf32), absl::GetFlag(FLAGS_cpu_threads));
  if (!backend.ok()) {
    std::cerr << backend.status().message() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("%-28s %6s %12s %12s %10s %10s\n", "model", "batch", "compute_ms", "step_ms",
                               "TFLOP/s", "transfer%");
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(spec, '@');
    int batch = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &batch)) {
      std::cerr << "bad model spec " << spec << "\n";
      return 2;
    }
    std::vector<int> widths;
    for (absl::string_view w : absl::StrSplit(parts[0], '-')) {
      int v = 0;
      if (!absl::SimpleAtoi(w, &v)) return 2;
      widths.push_back(v);
    }
    segps::v1::ModelConfig config;
    config.set_input_width(widths.front());
    config.set_num_classes(widths.back());
    auto* seg = config.add_segments();
    seg->set_name("bench");
    double flops = 0;
    for (size_t l = 1; l < widths.size(); ++l) {
      auto* layer = seg->add_layers();
      layer->set_units(widths[l]);
      layer->set_activation(l + 1 == widths.size() ? segps::v1::SOFTMAX : segps::v1::RELU);
      const double mac = static_cast<double>(batch) * widths[l - 1] * widths[l];
      flops += 2 * mac /*forward*/ + 2 * mac /*dW*/ + (l > 1 ? 2 * mac : 0) /*dX*/;
    }
    segps::Backend* b = backend->get();
    absl::StatusOr<segps::SegmentModel> model = segps::SegmentModel::Create(b, config, 0, batch);
    if (!model.ok()) {
      std::cerr << model.status().message() << "\n";
      return 1;
    }
    const size_t n = model->num_params();
    segps::Buffer params = *b->AllocateHost(n * 4), grad = *b->AllocateHost(n * 4);
    segps::Buffer x = *b->AllocateHost(static_cast<size_t>(batch) * widths[0] * 4), y = *b->AllocateHost(batch * 4);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.05f, 0.05f);
    for (size_t i = 0; i < n; ++i) params.data()[i] = u(rng);
    for (size_t i = 0; i < static_cast<size_t>(batch) * widths[0]; ++i) x.data()[i] = u(rng) * 20;
    for (int i = 0; i < batch; ++i) y.data<int32_t>()[i] = i % widths.back();
    auto step = [&](bool transfers) {
      const auto t0 = std::chrono::steady_clock::now();
      if (transfers) {
        (void)b->Upload(params.data(), model->params(), n * 4);
        (void)b->Upload(x.data(), model->input(), static_cast<size_t>(batch) * widths[0] * 4);
        (void)b->Upload(y.data(), model->labels(), batch * 4);
      }
      absl::Status s = model->TrainStep(batch);
      if (transfers) (void)b->Download(model->grad(), grad.data(), n * 4);
      absl::Status synced = b->Synchronize();
      if (!s.ok() || !synced.ok()) std::cerr << "step failed: " << s << " " << synced << "\n";
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    step(true);  // stage everything once
    for (int i = 0; i < 3; ++i) step(false);
    std::vector<double> compute, full;
    for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) compute.push_back(step(false));
    for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) full.push_back(step(true));
    const double c = Median(compute), f = Median(full);
    std::cout << absl::StrFormat("%-28s %6d %12.3f %12.3f %10.2f %9.1f%%\n", parts[0], batch, c * 1e3, f * 1e3,
                                 flops / c / 1e12, 100.0 * std::max(0.0, f - c) / f);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  segps::ParseCommandLine(argc, argv, "The time of one worker step.");
  return Run();
}
