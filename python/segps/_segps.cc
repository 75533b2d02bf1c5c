// The Python binding of the C++ client (worker/client/segment_session.h):
// segps._segps.Session, pulling into and pushing from NumPy float32
// arrays, and the config checks. The GIL is released while a call waits on
// the servers, so other Python threads (a data loader) run meanwhile; calls
// on one session from several threads take turns.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/shard_map.h"
#include "google/protobuf/text_format.h"
#include "worker/client/segment_session.h"

namespace py = pybind11;

namespace {

// segps.Error: a server's or the client's status, its code kept.
py::handle error_type;

[[noreturn]] void Raise(const absl::Status& status) {
  const std::string code = absl::StatusCodeToString(status.code());
  py::object error = py::reinterpret_borrow<py::object>(error_type)(absl::StrCat(code, ": ", status.message()));
  error.attr("code") = code;
  PyErr_SetObject(error_type.ptr(), error.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

segps::v1::JobConfig Load(const std::string& path, const std::string& text) {
  if (path.empty() && text.empty()) {
    Raise(absl::InvalidArgumentError("no job config: give its file (config) or its text (config_text)"));
  }
  absl::StatusOr<segps::v1::JobConfig> config =
      text.empty() ? segps::LoadConfig(path) : segps::ParseConfig(text, path.empty() ? "<config text>" : path);
  if (!config.ok()) Raise(config.status());
  return *std::move(config);
}

// The session, as Python holds it.
class Session {
 public:
  Session(const std::string& config_path, const std::string& config_text, const std::vector<std::string>& servers,
          const std::string& segment, std::optional<std::string> rank, const std::string& tls_ca,
          const std::string& tls_cert, const std::string& tls_key, const std::string& token_file) {
    segps::v1::JobConfig config = Load(config_path, config_text);
    segps::v1::SecurityConfig& security = *config.mutable_security();
    if (!tls_ca.empty()) security.set_ca_cert(tls_ca);
    if (!tls_cert.empty()) security.set_cert(tls_cert);
    if (!tls_key.empty()) security.set_key(tls_key);
    if (!token_file.empty()) security.set_token_file(token_file);
    absl::StatusOr<std::unique_ptr<segps::SegmentSession>> opened;
    {
      py::gil_scoped_release release;
      opened = segps::SegmentSession::Open(std::move(config), servers, segment, std::move(rank));
    }
    if (!opened.ok()) Raise(opened.status());
    session_ = *std::move(opened);
  }

  uint64_t Pull(py::array_t<float, py::array::c_style> dest) {
    if (!dest.writeable()) Raise(absl::InvalidArgumentError("pull: the destination array is read-only"));
    float* data = dest.mutable_data();
    const size_t n = static_cast<size_t>(dest.size());
    absl::StatusOr<uint64_t> at;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> one_at_a_time(mu_);
      at = session_->Pull(absl::MakeSpan(data, n));
    }
    if (!at.ok()) Raise(at.status());
    return *at;
  }

  void Push(py::array_t<float, py::array::c_style | py::array::forcecast> gradient) {
    const float* data = gradient.data();
    const size_t n = static_cast<size_t>(gradient.size());
    absl::Status pushed;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> one_at_a_time(mu_);
      pushed = session_->Push(absl::MakeConstSpan(data, n));
    }
    Check(pushed);
  }

  void Close() {
    absl::Status closed;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> one_at_a_time(mu_);
      closed = session_->Close();
    }
    Check(closed);
  }

  // (name, shape, offset) of each tensor in the segment's flat order; the
  // name without the segment's ("0.weight", "dense_0/kernel").
  std::vector<py::tuple> Tensors() const {
    std::vector<py::tuple> out;
    const segps::v1::ModelConfig& model = session_->config().model();
    const std::string prefix = model.segments(session_->segment()).name() + "/";
    for (const segps::TensorLayout& t : session_->tensors()) {
      out.push_back(py::make_tuple(segps::TensorName(model, session_->segment(), t).substr(prefix.size()),
                                   segps::TensorShape(t), t.offset));
    }
    return out;
  }

  const segps::SegmentSession& get() const { return *session_; }

 private:
  // The session takes one call at a time; Python threads may share it.
  std::mutex mu_;
  std::unique_ptr<segps::SegmentSession> session_;
};

// The config at `path` (or `text`), checked and with its defaults filled
// in, as text: what servers and workers will read.
std::string CheckConfig(const std::string& path, const std::string& text) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(Load(path, text), &out);
  return out;
}

}  // namespace

PYBIND11_MODULE(_segps, m) {
  m.doc() = "The segps C++ client (worker/client/segment_session.h); use segps.Client or segps.torch.";
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  error.doc() = "A refusal or failure from the servers or the client: str(e) is 'CODE: message', e.code the code.";
  error_type = error;
  m.def("check_config", &CheckConfig, py::arg("path") = "", py::arg("text") = "",
        "Checks a job config (a file, or its text) as servers do; returns it with its defaults filled in.");
  py::class_<Session>(m, "Session")
      .def(py::init<const std::string&, const std::string&, const std::vector<std::string>&, const std::string&,
                    std::optional<std::string>, const std::string&, const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("config_path"), py::arg("config_text"), py::arg("servers"), py::arg("segment"), py::arg("rank"),
           py::arg("tls_ca") = "", py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("token_file") = "")
      .def("pull", &Session::Pull, py::arg("dest"))
      .def("push", &Session::Push, py::arg("gradient"))
      .def("close", &Session::Close)
      .def("tensors", &Session::Tensors)
      .def_property_readonly("size", [](const Session& s) { return s.get().size(); })
      .def_property_readonly("rank", [](const Session& s) -> std::optional<uint32_t> {
        if (s.get().reader()) return std::nullopt;
        return s.get().rank();
      })
      .def_property_readonly("clock", [](const Session& s) { return s.get().clock(); })
      .def_property_readonly("steps", [](const Session& s) { return s.get().steps(); })
      .def_property_readonly("recoveries", [](const Session& s) { return s.get().recoveries(); })
      .def_property_readonly("segment", [](const Session& s) {
        return s.get().config().model().segments(s.get().segment()).name();
      });
}
