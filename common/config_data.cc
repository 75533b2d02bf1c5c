// The data block of a job config, and the early stopping that stands on its
// validation set: checks and defaults.
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/config_locator.h"

namespace segps {

namespace {

// training.early_stopping: scored on the validation set, ensembles only.
absl::Status ValidateEarlyStopping(const v1::JobConfig& c, const Locator& at) {
  if (!c.training().has_early_stopping()) return absl::OkStatus();
  const v1::EarlyStopping& stop = c.training().early_stopping();
  if (stop.patience() < 1) {
    return at.Error({{"training", -1}, {"early_stopping", -1}, {"patience", -1}},
                    "must be at least 1 (epochs without improvement before stopping)");
  }
  if (!(stop.min_delta() >= 0 && std::isfinite(stop.min_delta()))) {
    return at.Error({{"training", -1}, {"early_stopping", -1}, {"min_delta", -1}},
                    absl::StrCat("must be a finite number >= 0, got ", stop.min_delta()));
  }
  if (c.data().validation_fraction() <= 0) {
    return at.Error({{"training", -1}, {"early_stopping", -1}},
                    "stops on the validation loss: set data.validation_fraction (0.1, say) to hold out a validation "
                    "set");
  }
  if (c.model().combine() == v1::CHAIN) {
    return at.Error({{"training", -1}, {"early_stopping", -1}}, "is not supported with combine: CHAIN yet");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDataSource(v1::JobConfig& c, const Locator& at) {
  auto* model = c.mutable_model();
  auto* data = c.mutable_data();
  if (data->source() == v1::DATA_SOURCE_UNSPECIFIED && TensorsOnly(*model)) return absl::OkStatus();
  if (data->source() == v1::DATA_SOURCE_UNSPECIFIED) {
    return at.Error({{"data", -1}, {"source", -1}},
                    "is required: SYNTHETIC_SEED, SYNTHETIC_TEACHER, FASHION_MNIST, NPY, CSV or SYNTHETIC_CTR");
  }
  const bool ids = data->source() == v1::NPY || data->source() == v1::CSV || data->source() == v1::SYNTHETIC_CTR;
  if (model->categorical_fields() > 0 && !ids) {
    return at.Error({{"model", -1}, {"categorical_fields", -1}},
                    absl::StrCat("needs ids: data.source NPY (data.train_ids), CSV (data.categorical_columns) or "
                                 "SYNTHETIC_CTR, not ",
                                 v1::DataSource_Name(data->source())));
  }
  if (data->source() == v1::CSV &&
      static_cast<uint32_t>(data->categorical_columns_size()) != model->categorical_fields()) {
    return at.Error({{"data", -1}, {"categorical_columns", -1}},
                    absl::StrCat("names ", data->categorical_columns_size(), " columns for model.categorical_fields ",
                                 model->categorical_fields()));
  }
  if (data->categorical_columns_size() > 0 && data->source() != v1::CSV) {
    return at.Error({{"data", -1}, {"categorical_columns", -1}}, "is used by data.source CSV only");
  }
  if (data->source() == v1::SYNTHETIC_CTR && (model->categorical_fields() == 0 || model->num_classes() != 2)) {
    return at.Error({{"model", -1}, {"categorical_fields", -1}},
                    "SYNTHETIC_CTR needs model.categorical_fields > 0 and model.num_classes 2");
  }
  if (data->source() == v1::NPY && model->categorical_fields() > 0 && data->train_ids().empty()) {
    return at.Error({{"data", -1}, {"train_ids", -1}}, "is required for NPY with model.categorical_fields > 0");
  }
  if (data->test_ids().empty() != data->test_x().empty() && model->categorical_fields() > 0) {
    return at.Error({{"data", -1}, {"test_ids", -1}}, "goes with test_x: give both or neither");
  }
  if (data->split() == v1::SPLIT_UNSPECIFIED) data->set_split(v1::BY_SEGMENT);
  if (data->train_samples() == 0) data->set_train_samples(10000);
  if (data->test_samples() == 0) data->set_test_samples(2000);
  if (data->path().empty()) data->set_path("/usr/share/datasets/fashion-mnist");
  if (data->teacher_hidden() == 0) data->set_teacher_hidden(32);
  if (!data->has_label_noise()) data->set_label_noise(0.02f);
  if (!(data->label_noise() >= 0 && data->label_noise() <= 1)) {
    return at.Error({{"data", -1}, {"label_noise", -1}}, "must be in [0, 1]");
  }
  if (!data->has_data_seed()) data->set_data_seed(data->source() == v1::SYNTHETIC_SEED ? 42 : 1);
  if (data->source() == v1::FASHION_MNIST &&
      (model->input_width() != 784 || model->num_classes() != 10)) {
    return at.Error({{"model", -1}, {"input_width", -1}},
                    "FASHION_MNIST needs model.input_width 784 and model.num_classes 10");
  }
  if (data->normalize() == v1::NORMALIZE_UNSPECIFIED) data->set_normalize(v1::NONE);
  return absl::OkStatus();
}

absl::Status ValidateDataFiles(v1::JobConfig& c, const Locator& at) {
  auto* data = c.mutable_data();
  if (data->source() == v1::DATA_SOURCE_UNSPECIFIED) return absl::OkStatus();  // TensorsOnly
  const bool npy = data->source() == v1::NPY, csv = data->source() == v1::CSV;
  // Fields of one file source are refused under another, so that a typo in
  // `source` does not silently train on something else.
  struct FileField {
    const char* name;
    const std::string& value;
    bool belongs;
  };
  for (const FileField& f : {FileField{"train_x", data->train_x(), npy}, FileField{"train_y", data->train_y(), npy},
                             FileField{"test_x", data->test_x(), npy}, FileField{"test_y", data->test_y(), npy},
                             FileField{"train_ids", data->train_ids(), npy}, FileField{"test_ids", data->test_ids(), npy},
                             FileField{"train_csv", data->train_csv(), csv},
                             FileField{"test_csv", data->test_csv(), csv},
                             FileField{"label_column", data->label_column(), csv},
                             FileField{"delimiter", data->delimiter(), csv}}) {
    if (!f.value.empty() && !f.belongs) {
      return at.Error({{"data", -1}, {f.name, -1}},
                      absl::StrCat("is not used by data.source ", v1::DataSource_Name(data->source())));
    }
  }
  if (data->has_scale() && !npy) return at.Error({{"data", -1}, {"scale", -1}}, "is used by data.source NPY only");
  if (data->has_header() && !csv) return at.Error({{"data", -1}, {"header", -1}}, "is used by data.source CSV only");
  if (npy) {
    if (data->train_x().empty()) return at.Error({{"data", -1}, {"train_x", -1}}, "is required for NPY: an .npy file of inputs [n, input_width]");
    if (data->train_y().empty()) return at.Error({{"data", -1}, {"train_y", -1}}, "is required for NPY: an .npy file of labels [n]");
    if (data->test_x().empty() != data->test_y().empty()) {
      return at.Error({{"data", -1}, {data->test_x().empty() ? "test_x" : "test_y", -1}},
                      "is missing: give test_x and test_y together, or neither (then test_fraction holds out a split)");
    }
    if (data->has_scale() && !(data->scale() > 0 && std::isfinite(data->scale()))) {
      return at.Error({{"data", -1}, {"scale", -1}}, absl::StrCat("must be finite and > 0, got ", data->scale()));
    }
  }
  if (csv) {
    if (data->train_csv().empty()) return at.Error({{"data", -1}, {"train_csv", -1}}, "is required for CSV");
    if (data->delimiter().empty()) data->set_delimiter(",");
    if (data->delimiter().size() != 1 || data->delimiter() == "\"" || data->delimiter() == "\n") {
      return at.Error({{"data", -1}, {"delimiter", -1}},
                      absl::StrCat("must be one character other than a quote or a newline, got \"", data->delimiter(), "\""));
    }
    if (!data->has_header()) data->set_header(true);
    if (data->categorical_columns_size() > 0 && !data->header()) {
      return at.Error({{"data", -1}, {"categorical_columns", -1}}, "names columns by the header: data.header must be true");
    }
  }
  if (npy || csv) {
    const bool has_test = !data->test_x().empty() || !data->test_csv().empty();
    if (has_test && data->has_test_fraction()) {
      return at.Error({{"data", -1}, {"test_fraction", -1}}, "applies only without test files, and test files are given");
    }
    if (!has_test && !data->has_test_fraction()) data->set_test_fraction(0.2f);
    if (!has_test && !(data->test_fraction() > 0 && data->test_fraction() < 1)) {
      return at.Error({{"data", -1}, {"test_fraction", -1}},
                      absl::StrCat("must be in (0, 1), got ", data->test_fraction()));
    }
  } else if (data->has_test_fraction()) {
    return at.Error({{"data", -1}, {"test_fraction", -1}}, "is used by data.source NPY and CSV only");
  }
  if (!(data->validation_fraction() >= 0 && data->validation_fraction() < 1)) {
    return at.Error({{"data", -1}, {"validation_fraction", -1}},
                    absl::StrCat("must be in [0, 1), got ", data->validation_fraction()));
  }
  if (c.model().loss() == v1::MSE && data->source() != v1::NPY && data->source() != v1::CSV) {
    return at.Error({{"data", -1}, {"source", -1}},
                    absl::StrCat(v1::DataSource_Name(data->source()),
                                 " has classes for labels; model.loss MSE regresses real-valued targets: NPY or CSV"));
  }
  return ValidateEarlyStopping(c, at);
}

}  // namespace segps
