// segps-k8s: a job config in, a kustomize overlay out. The overlay sits on
// deploy/k8s/base (the servers, their Service and the NetworkPolicies) and
// adds what the config decides: the servers' count, one Indexed Job per
// segment or stage with its workers, the stage links of a chain, the
// evaluation and export Job, the data and model volumes, and the config
// itself (its data paths moved under the data volume's mount).
//
//   segps-k8s --config job.pbtxt --out DIR [--image IMG] [--gpu-segments 0,2]
//             [--data-pvc NAME | --data-host-path PATH] [--model-pvc NAME]
#include <google/protobuf/text_format.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/command_line.h"
#include "common/config.h"

ABSL_FLAG(std::string, config, "", "The job config (*.pbtxt). Required.");
ABSL_FLAG(std::string, out, "", "The overlay's folder (made if missing; its generated files are replaced). Required.");
ABSL_FLAG(std::string, base, SEGPS_DEPLOY_DIR "/k8s/base", "The base the overlay builds on.");
ABSL_FLAG(std::string, image, "segps:latest", "The image of every segps process (deploy/Dockerfile).");
ABSL_FLAG(std::string, gpu_image, "segps-cuda:latest", "The image of GPU workers (deploy/Dockerfile.cuda).");
ABSL_FLAG(std::string, gpu_segments, "",
          "Comma-separated segments (indices or names) whose workers run on a GPU each (nvidia.com/gpu: 1).");
ABSL_FLAG(std::string, data_pvc, "",
          "A PersistentVolumeClaim holding the job's data files, mounted read-only at /data in workers and the "
          "evaluation; the config's relative data paths are read there.");
ABSL_FLAG(std::string, data_host_path, "", "A node's folder holding the data files (single-node clusters), as --data_pvc.");
ABSL_FLAG(std::string, model_pvc, "",
          "A PersistentVolumeClaim the evaluation writes report.json, model.safetensors and model.onnx to. Default: "
          "the overlay makes one, segps-model.");

namespace segps {
namespace {

constexpr int kServerPort = 7000, kMetricsPort = 9100, kStagePort = 7100;
constexpr const char* kDataMount = "/data";
constexpr const char* kFileMode = "288  # 0440: the pod's group (fsGroup, the image's user) reads";

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// args: ["a", "b", ...] wrapped at about 110 columns, continued under the first.
std::string ArgsLine(const std::string& indent, const std::vector<std::string>& args) {
  std::string out = indent + "args: [", line;
  const std::string more = indent + "       ";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string item = Quote(args[i]) + (i + 1 < args.size() ? ", " : "]");
    if (!line.empty() && (indent.size() + 7 + line.size() + item.size()) > 110) {
      absl::StrAppend(&out, line.substr(0, line.size() - 1), "\n", more);
      line.clear();
    }
    line += item;
  }
  return out + line + "\n";
}

struct Job {
  v1::JobConfig config;  // loaded: defaults filled in
  std::string config_name;
  std::string image, gpu_image;
  std::set<int> gpu_segments;
  std::string data_pvc, data_host_path, model_pvc;
  bool chain = false;
  bool data() const { return !data_pvc.empty() || !data_host_path.empty(); }
  std::string Servers() const {
    std::vector<std::string> names;
    for (uint32_t i = 0; i < config.cluster().num_servers(); ++i) {
      names.push_back(absl::StrCat("segps-server-", i, ".segps-server:", kServerPort));
    }
    return absl::StrJoin(names, ",");
  }
};

// The volumes a worker or evaluation container mounts: the config, the
// certificates, the data volume where it reads data, the model volume.
std::string Mounts(const std::string& indent, bool data, bool model) {
  std::string out = indent + "volumeMounts:\n";
  absl::StrAppend(&out, indent, "  - {name: config, mountPath: /config, readOnly: true}\n");
  absl::StrAppend(&out, indent, "  - {name: certs, mountPath: /certs, readOnly: true}\n");
  if (data) absl::StrAppend(&out, indent, "  - {name: data, mountPath: ", kDataMount, ", readOnly: true}\n");
  if (model) absl::StrAppend(&out, indent, "  - {name: model, mountPath: /model}\n");
  return out;
}

std::string Volumes(const Job& job, const std::string& secret, bool model) {
  std::string out = absl::StrCat("      volumes:\n        - name: config\n          configMap: {name: segps-job}\n",
                                 "        - name: certs\n          secret:\n            secretName: ", secret,
                                 "\n            defaultMode: ", kFileMode, "\n");
  if (!job.data_pvc.empty()) {
    absl::StrAppend(&out, "        - name: data\n          persistentVolumeClaim: {claimName: ", Quote(job.data_pvc),
                    ", readOnly: true}\n");
  } else if (!job.data_host_path.empty()) {
    absl::StrAppend(&out, "        - name: data\n          hostPath: {path: ", Quote(job.data_host_path),
                    ", type: Directory}\n");
  }
  if (model) {
    absl::StrAppend(&out, "        - name: model\n          persistentVolumeClaim: {claimName: ", Quote(job.model_pvc),
                    "}\n");
  }
  return out;
}

const char* kServersEnv =
    "env:\n"
    "  - name: SEGPS_SERVERS\n"
    "    valueFrom: {configMapKeyRef: {name: segps-job, key: servers}}\n";

std::string Indented(const std::string& indent, const std::string& text) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) absl::StrAppend(&out, indent, line, "\n");
  return out;
}

std::vector<std::string> ClientTls(const char* token) {
  return {"--tls_ca", "/certs/ca.pem", "--tls_cert", "/certs/client.pem", "--tls_key", "/certs/client.key",
          "--token_file", absl::StrCat("/certs/", token)};
}

std::vector<std::string> WorkerArgs(const Job& job, int k) {
  std::vector<std::string> args = {"--config", "/config/job.pbtxt", "--segment", std::to_string(k), "--rank",
                                   "$(JOB_COMPLETION_INDEX)", "--servers", "$(SEGPS_SERVERS)", "--metrics_listen",
                                   absl::StrCat("0.0.0.0:", kMetricsPort), "--insecure"};
  for (const std::string& a : ClientTls("worker.token")) args.push_back(a);
  const int stages = job.config.model().segments_size();
  if (job.chain && k > 0) {
    // A stage's link listens with the servers' certificate, which names the stages' pods too.
    args.insert(args.end(), {"--stage_listen", absl::StrCat("0.0.0.0:", kStagePort), "--stage_tls_cert",
                             "/certs/server.pem", "--stage_tls_key", "/certs/server.key"});
  }
  if (job.chain && k + 1 < stages) {
    args.push_back("--next_stage");
    args.push_back(absl::StrCat("segps-worker-seg", k + 1, "-$(JOB_COMPLETION_INDEX).segps-stages:", kStagePort));
  }
  if (job.gpu_segments.count(k)) {
    args.push_back("--device");
    args.push_back("cuda:0");
  }
  return args;
}

std::string WorkerJob(const Job& job, int k) {
  const auto& segment = job.config.model().segments(k);
  const uint32_t workers = WorkersOf(job.config, k);
  const bool gpu = job.gpu_segments.count(k) > 0;
  std::ostringstream o;
  o << "---\n# " << (job.chain ? "Stage " : "Segment ") << k << " (" << segment.name() << "): " << workers
    << " worker(s), rank = completion index"
    << (job.chain ? "; a stage that fails is restarted in its pod, and its neighbours reopen their links to it" : "")
    << ".\n"
    << "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: segps-worker-seg" << k << "\nspec:\n"
    << "  completionMode: Indexed\n  completions: " << workers << "\n  parallelism: " << workers << "\n"
    << "  backoffLimitPerIndex: 6\n  maxFailedIndexes: 0\n  template:\n"
    << "    metadata:\n      labels:\n        app.kubernetes.io/name: segps-worker\n        segps/segment: \"" << k
    << "\"\n    spec:\n      restartPolicy: OnFailure\n"
    << (job.chain ? "      subdomain: segps-stages\n" : "") << "      securityContext: {fsGroup: 10001}\n"
    << "      containers:\n        - name: worker\n          image: " << (gpu ? "segps-cuda:latest" : "segps:latest")
    << "\n"
    << "          imagePullPolicy: IfNotPresent\n          command: [\"segps-worker\"]\n"
    << ArgsLine("          ", WorkerArgs(job, k)) << Indented("          ", kServersEnv)
    << "          ports:\n            - {name: metrics, containerPort: " << kMetricsPort << "}\n"
    << (job.chain && k > 0 ? absl::StrCat("            - {name: stage-link, containerPort: ", kStagePort, "}\n") : "")
    << "          resources:\n            requests: {cpu: \"1\", memory: 512Mi}\n"
    << "            limits: {memory: 4Gi" << (gpu ? ", nvidia.com/gpu: 1" : "") << "}\n"
    << Mounts("          ", job.data(), false) << Volumes(job, "segps-worker-tls", false);
  return o.str();
}

// The stages' subdomain: pod k-r is segps-worker-seg<k>-<r>.segps-stages.
std::string StagesService() {
  return absl::StrCat(
      "---\n# The stages' subdomain: each stage pod has the DNS name <pod hostname>.segps-stages, published\n"
      "# before it is ready, so a stage connects to the next one as it starts.\n"
      "apiVersion: v1\nkind: Service\nmetadata:\n  name: segps-stages\nspec:\n  clusterIP: None\n"
      "  publishNotReadyAddresses: true\n  selector:\n    app.kubernetes.io/name: segps-worker\n  ports:\n"
      "    - {name: stage-link, port: ",
      kStagePort, ", targetPort: ", kStagePort, "}\n");
}

std::string EvalJob(const Job& job) {
  std::vector<std::string> eval = {"--config", "/config/job.pbtxt", "--servers", "$(SEGPS_SERVERS)",
                                    "--wait_for_training", "--report", "/model/report.json"};
  std::vector<std::string> exporter = {"--config", "/config/job.pbtxt", "--servers", "$(SEGPS_SERVERS)",
                                       "--out", "/model/model.safetensors", "--onnx", "/model/model.onnx"};
  for (const std::string& a : ClientTls("reader.token")) eval.push_back(a), exporter.push_back(a);
  auto container = [&](const char* name, const char* binary, const std::vector<std::string>& args, bool data) {
    return absl::StrCat("        - name: ", name, "\n          image: segps:latest",
                        "\n          imagePullPolicy: IfNotPresent\n          command: [\"", binary, "\"]\n",
                        ArgsLine("          ", args), Indented("          ", kServersEnv),
                        "          resources:\n            requests: {cpu: 500m, memory: 256Mi}\n",
                        Mounts("          ", data && job.data(), true));
  };
  return absl::StrCat(
      "# Waits until every segment is trained and no worker is left, scores each segment and the\n"
      "# ensemble into report.json, then exports the model (safetensors, ONNX) beside it, on the model\n"
      "# volume.\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: segps-eval\nspec:\n  backoffLimit: 6\n"
      "  template:\n    metadata:\n      labels:\n        app.kubernetes.io/name: segps-eval\n    spec:\n"
      "      restartPolicy: OnFailure\n      securityContext: {fsGroup: 10001}\n      initContainers:\n",
      container("eval", "segps-eval", eval, true), "      containers:\n",
      container("export", "segps-export", exporter, false), Volumes(job, "segps-reader-tls", true));
}

std::string ModelVolume(const Job& job) {
  return absl::StrCat("# Where the evaluation leaves report.json, model.safetensors and model.onnx.\n",
                      "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: ", job.model_pvc,
                      "\nspec:\n  accessModes: [\"ReadWriteOnce\"]\n  resources:\n    requests: {storage: 1Gi}\n");
}

// The names the servers' certificate must carry: every server's, and with a
// chain every stage pod's that listens for a link.
std::vector<std::string> CertificateNames(const Job& job) {
  std::vector<std::string> names;
  for (uint32_t i = 0; i < job.config.cluster().num_servers(); ++i) {
    names.push_back(absl::StrCat("segps-server-", i, ".segps-server"));
  }
  for (int k = 1; job.chain && k < job.config.model().segments_size(); ++k) {
    for (uint32_t r = 0; r < WorkersOf(job.config, k); ++r) {
      names.push_back(absl::StrCat("segps-worker-seg", k, "-", r, ".segps-stages"));
    }
  }
  return names;
}

// kustomize's image override for the placeholder `name` (segps,
// segps-cuda) when `image` ("[REGISTRY/]NAME[:TAG|@DIGEST]") is another.
std::string ImageOverride(const std::string& name, const std::string& image) {
  if (image == name + ":latest") return "";
  std::string out = absl::StrCat("  - name: ", name, "\n");
  const size_t at = image.find('@'), slash = image.rfind('/');
  const size_t colon = image.rfind(':');
  if (at != std::string::npos) {
    absl::StrAppend(&out, "    newName: ", Quote(image.substr(0, at)), "\n    digest: ", Quote(image.substr(at + 1)), "\n");
  } else if (colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
    absl::StrAppend(&out, "    newName: ", Quote(image.substr(0, colon)), "\n    newTag: ", Quote(image.substr(colon + 1)),
                    "\n");
  } else {
    absl::StrAppend(&out, "    newName: ", Quote(image), "\n");
  }
  return out;
}

std::string Kustomization(const Job& job, const std::string& base, bool own_model_volume) {
  const auto& model = job.config.model();
  std::ostringstream o;
  o << "# Made by segps-k8s from " << job.config_name << " (" << job.config.name() << "): "
    << job.config.cluster().num_servers() << " server(s), " << model.segments_size()
    << (job.chain ? " stages of one network" : " segments") << ". Regenerate rather than edit.\n"
    << "# Once per namespace, the certificates and tokens as Secrets:\n"
    << "#   bash deploy/make-certs.sh --k8s certs " << absl::StrJoin(CertificateNames(job), " ") << "\n"
    << "#   kubectl apply -f certs/secrets.yaml\n"
    << "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " << base
    << "\n  - workers.yaml\n  - eval.yaml\n"
    << (own_model_volume ? "  - model-volume.yaml\n" : "") << "configMapGenerator:\n  - name: segps-job\n"
    << "    files: [job.pbtxt]\n    literals: [" << Quote("servers=" + job.Servers()) << "]\n"
    << "replicas:\n  - name: segps-server\n    count: " << job.config.cluster().num_servers() << "\n";
  // Every manifest names the images segps:latest and segps-cuda:latest; --image and --gpu_image replace them.
  const std::string images = ImageOverride("segps", job.image) + ImageOverride("segps-cuda", job.gpu_image);
  if (!images.empty()) o << "images:\n" << images;
  return o.str();
}

// The config as the pods read it: relative data paths (which name files
// beside the config) moved under the data volume's mount.
absl::StatusOr<std::string> PodConfig(const Job& job, const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  v1::JobConfig raw;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &raw)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": segps-k8s reads text configs (*.pbtxt)"));
  }
  v1::DataConfig* data = raw.mutable_data();
  const std::pair<const char*, std::string*> fields[] = {
      {"path", data->mutable_path()},           {"train_x", data->mutable_train_x()},
      {"train_y", data->mutable_train_y()},     {"test_x", data->mutable_test_x()},
      {"test_y", data->mutable_test_y()},       {"train_csv", data->mutable_train_csv()},
      {"test_csv", data->mutable_test_csv()}};
  for (const auto& [name, value] : fields) {
    if (value->empty() || value->front() == '/') continue;
    if (!job.data()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": data.", name, " is \"", *value, "\", a file beside the config; in the cluster the data comes from a "
          "volume: give --data_pvc NAME or --data_host_path PATH holding it (mounted at ", kDataMount, ")"));
    }
    *value = absl::StrCat(kDataMount, "/", *value);
  }
  std::string printed;
  google::protobuf::TextFormat::PrintToString(raw, &printed);
  return absl::StrCat("# ", job.config_name, " as the pods read it (made by segps-k8s; data paths under ",
                      kDataMount, ")\n", printed);
}

absl::StatusOr<std::set<int>> GpuSegments(const v1::JobConfig& config, const std::string& list) {
  std::set<int> segments;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    const int k = SegmentIndex(config.model(), std::string(item));
    if (k < 0) return absl::InvalidArgumentError(absl::StrCat("--gpu_segments: no segment ", item));
    segments.insert(k);
  }
  return segments;
}

// A claim's name as Kubernetes takes it (a DNS subdomain: lowercase
// letters, digits, '-' and '.', at most 253, alphanumeric at both ends).
absl::Status CheckNames(const Job& job) {
  for (const auto& [flag, name] : {std::pair{"--data_pvc", job.data_pvc}, std::pair{"--model_pvc", job.model_pvc}}) {
    bool ok = !name.empty() && name.size() <= 253 && std::isalnum(static_cast<unsigned char>(name.front())) &&
              std::isalnum(static_cast<unsigned char>(name.back()));
    for (char c : name) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.');
    if (!name.empty() && !ok) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", name, "' is no claim name Kubernetes takes: lowercase "
                                                     "letters, digits, '-' and '.', starting and ending alphanumeric"));
    }
  }
  if (!job.data_host_path.empty() && job.data_host_path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("--data_host_path '", job.data_host_path, "' must be absolute"));
  }
  return absl::OkStatus();
}

absl::Status Write(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", file.string()));
  return absl::OkStatus();
}

absl::Status Generate() {
  const std::string config_path = absl::GetFlag(FLAGS_config), out = absl::GetFlag(FLAGS_out);
  if (config_path.empty() || out.empty()) return absl::InvalidArgumentError("--config and --out are required");
  if (!absl::GetFlag(FLAGS_data_pvc).empty() && !absl::GetFlag(FLAGS_data_host_path).empty()) {
    return absl::InvalidArgumentError("give --data_pvc or --data_host_path, not both");
  }
  Job job;
  absl::StatusOr<v1::JobConfig> config = LoadConfig(config_path);
  if (!config.ok()) return config.status();
  job.config = *std::move(config);
  job.config_name = std::filesystem::path(config_path).filename().string();
  job.chain = job.config.model().combine() == v1::CHAIN;
  job.image = absl::GetFlag(FLAGS_image);
  job.gpu_image = absl::GetFlag(FLAGS_gpu_image);
  job.data_pvc = absl::GetFlag(FLAGS_data_pvc);
  job.data_host_path = absl::GetFlag(FLAGS_data_host_path);
  job.model_pvc = absl::GetFlag(FLAGS_model_pvc);
  const bool own_model_volume = job.model_pvc.empty();
  if (own_model_volume) job.model_pvc = "segps-model";
  if (absl::Status names = CheckNames(job); !names.ok()) return names;
  absl::StatusOr<std::set<int>> gpu = GpuSegments(job.config, absl::GetFlag(FLAGS_gpu_segments));
  if (!gpu.ok()) return gpu.status();
  job.gpu_segments = *gpu;
  absl::StatusOr<std::string> pod_config = PodConfig(job, config_path);
  if (!pod_config.ok()) return pod_config.status();

  std::error_code error;
  std::filesystem::create_directories(out, error);
  const std::filesystem::path dir = std::filesystem::absolute(out).lexically_normal();
  const std::filesystem::path base = std::filesystem::absolute(absl::GetFlag(FLAGS_base)).lexically_normal();
  if (!std::filesystem::exists(base / "kustomization.yaml")) {
    return absl::InvalidArgumentError(absl::StrCat("--base ", base.string(), " has no kustomization.yaml"));
  }
  std::string workers;
  for (int k = 0; k < job.config.model().segments_size(); ++k) workers += WorkerJob(job, k);
  if (job.chain) workers += StagesService();
  std::filesystem::remove(dir / "model-volume.yaml", error);
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"kustomization.yaml", Kustomization(job, base.lexically_relative(dir).string(), own_model_volume)},
           {"job.pbtxt", *pod_config},
           {"workers.yaml", workers.substr(4)},  // without the first document separator
           {"eval.yaml", EvalJob(job)},
           {"model-volume.yaml", own_model_volume ? ModelVolume(job) : ""}}) {
    if (text.empty()) continue;
    if (absl::Status s = Write(dir / name, text); !s.ok()) return s;
  }
  std::cout << "segps-k8s: wrote " << out << " for " << job.config_name << "; apply with kubectl apply -k " << out
            << " after its Secrets (see the top of " << out << "/kustomization.yaml)" << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace segps

int main(int argc, char** argv) {
  // --data-pvc and --data_pvc alike: a flag's name may be written with dashes.
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-' || argv[i][1] != '-') continue;
    for (char* c = argv[i] + 2; *c != '\0' && *c != '='; ++c) {
      if (*c == '-') *c = '_';
    }
  }
  segps::ParseCommandLine(argc, argv,
                          "Writes the Kubernetes overlay (kustomize) of a job config.\n"
                          "  segps-k8s --config job.pbtxt --out DIR [--image IMG] [--gpu-segments 0,2]\n"
                          "            [--data-pvc NAME | --data-host-path PATH] [--model-pvc NAME]\n"
                          "(a flag's name may be written with dashes or underscores)");
  if (absl::Status s = segps::Generate(); !s.ok()) {
    std::cerr << "segps-k8s: " << s.message() << std::endl;
    return 1;
  }
  return 0;
}
