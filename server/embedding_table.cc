#include "server/embedding_table.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/embedding.h"
#include "common/tensor_wire.h"
#include "server/optimizer.h"

namespace segps {
namespace {

// Optimizer slots a row carries beside its values.
size_t SlotsOf(v1::OptimizerKind kind) {
  switch (kind) {
    case v1::MOMENTUM:
    case v1::ADAGRAD:
      return 1;
    case v1::ADAM:
      return 2;
    default:
      return 0;
  }
}

// One update's rates, the same for every row: the scheduled learning rate
// times the push's scale, and Adam's bias-corrected step size.
struct RowRates {
  float lr = 0, alpha = 0;
};

RowRates RatesOf(const v1::OptimizerConfig& c, uint64_t step, float scale) {
  RowRates rates;
  rates.lr = ScheduledRate(c, step) * scale;
  if (c.kind() == v1::ADAM) {
    const double t = static_cast<double>(std::max<uint64_t>(step, 1));
    rates.alpha = static_cast<float>(double{ScheduledRate(c, step)} * std::sqrt(1.0 - std::pow(c.beta2(), t)) /
                                     (1.0 - std::pow(c.beta1(), t))) *
                  scale;
  }
  return rates;
}

// One row's update in place: w (dim values) then its slots, as the dense
// optimizers do it element by element (server/optimizer.cc).
void UpdateRow(const v1::OptimizerConfig& c, const RowRates& rates, size_t dim, float* __restrict row,
               const float* __restrict g) {
  float* w = row;
  const float lr = rates.lr, wd = c.weight_decay();
  switch (c.kind()) {
    case v1::MOMENTUM: {
      float* v = row + dim;
      const float momentum = c.momentum();
      for (size_t i = 0; i < dim; ++i) {
        v[i] = momentum * v[i] - lr * (g[i] + wd * w[i]);
        w[i] += v[i];
      }
      return;
    }
    case v1::ADAGRAD: {
      float* a = row + dim;
      const float epsilon = c.epsilon();
      for (size_t i = 0; i < dim; ++i) {
        const float gi = g[i] + wd * w[i];
        a[i] += gi * gi;
        w[i] -= lr * gi / (std::sqrt(a[i]) + epsilon);
      }
      return;
    }
    case v1::ADAM: {
      float* m = row + dim;
      float* v = row + 2 * dim;
      const float beta1 = c.beta1(), beta2 = c.beta2(), epsilon = c.epsilon();
      for (size_t i = 0; i < dim; ++i) {
        const float gi = g[i] + wd * w[i];
        m[i] += (gi - m[i]) * (1.0f - beta1);
        v[i] += (gi * gi - v[i]) * (1.0f - beta2);
        w[i] -= rates.alpha * m[i] / (std::sqrt(v[i]) + epsilon);
      }
      return;
    }
    default:
      for (size_t i = 0; i < dim; ++i) w[i] -= lr * (g[i] + wd * w[i]);
  }
}

}  // namespace

bool RowBudget::Take(uint64_t rows) {
  uint64_t used = used_.load();
  do {
    if (limit_ > 0 && used + rows > limit_) return false;
  } while (!used_.compare_exchange_weak(used, used + rows));
  return true;
}

EmbeddingTable::EmbeddingTable(const v1::EmbeddingConfig& config, const v1::OptimizerConfig& optimizer,
                               uint64_t seed, int segment, uint32_t table, RowBudget* budget)
    : config_(config),
      optimizer_(optimizer),
      seed_(seed),
      segment_(segment),
      table_(table),
      slots_(SlotsOf(optimizer.kind())),
      stride_(config.dim() * (1 + slots_)),
      budget_(budget) {}

EmbeddingTable::~EmbeddingTable() { budget_->Give(index_.size()); }

void EmbeddingTable::Initial(uint64_t id, float* row) const {
  const size_t dim = config_.dim();
  InitialRow(seed_, segment_, table_, id, absl::MakeSpan(row, dim));
  const float state = optimizer_.kind() == v1::ADAGRAD ? optimizer_.initial_accumulator() : 0.0f;
  std::fill(row + dim, row + stride_, state);
}

void EmbeddingTable::Slots(absl::Span<const uint64_t> ids, std::vector<uint32_t>* slots) const {
  slots->resize(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    if (r + kAhead < ids.size()) index_.prefetch(ids[r + kAhead]);
    const auto it = index_.find(ids[r]);
    (*slots)[r] = it == index_.end() ? kNew : it->second;
  }
}

void EmbeddingTable::PrefetchRow(absl::Span<const uint32_t> slots, size_t r) const {
  if (r >= slots.size() || slots[r] == kNew) return;
  const char* row = reinterpret_cast<const char*>(rows_.data() + size_t{slots[r]} * stride_);
  for (size_t byte = 0; byte < stride_ * sizeof(float); byte += kCacheLine) __builtin_prefetch(row + byte);
}

void EmbeddingTable::Read(absl::Span<const uint64_t> ids, absl::Span<float> out) const {
  const size_t dim = config_.dim();
  std::vector<uint32_t> slots;
  Slots(ids, &slots);
  for (size_t r = 0; r < ids.size(); ++r) {
    PrefetchRow(slots, r + kAhead);
    if (slots[r] != kNew) {
      std::copy_n(rows_.data() + size_t{slots[r]} * stride_, dim, out.data() + r * dim);
    } else {
      InitialRow(seed_, segment_, table_, ids[r], out.subspan(r * dim, dim));
    }
  }
}

absl::Status EmbeddingTable::Update(uint64_t step, float scale, absl::Span<const uint64_t> ids,
                                    absl::Span<const float> grads) {
  const size_t dim = config_.dim();
  pending_ids_.assign(ids.begin(), ids.end());
  Slots(ids, &pending_slots_);
  pending_.resize(ids.size() * stride_);
  pending_new_ = 0;
  // The rows first, as Read gathers them; then the update, row after row.
  for (size_t r = 0; r < ids.size(); ++r) {
    PrefetchRow(pending_slots_, r + kAhead);
    float* row = pending_.data() + r * stride_;
    if (pending_slots_[r] == kNew) {
      Initial(ids[r], row);
      ++pending_new_;
    } else {
      std::copy_n(rows_.data() + size_t{pending_slots_[r]} * stride_, stride_, row);
    }
  }
  const RowRates rates = RatesOf(optimizer_, step, scale);
  std::optional<size_t> bad;
  for (size_t r = 0; r < ids.size(); ++r) {
    float* row = pending_.data() + r * stride_;
    UpdateRow(optimizer_, rates, dim, row, grads.data() + r * dim);
    // Checked while the row is in the cache.
    if (!bad.has_value() && !AllFinite(absl::MakeConstSpan(row, stride_))) bad = r;
  }
  if (bad.has_value()) {
    pending_ids_.clear();
    pending_new_ = 0;
    return absl::InvalidArgumentError(absl::StrCat(
        "Push rows: the gradient of row ", ids[*bad], " of table \"", config_.name(),
        "\" would make its values or optimizer state non-finite; refused, nothing was applied (lower "
        "optimizer.learning_rate)"));
  }
  return absl::OkStatus();
}

void EmbeddingTable::Commit() {
  for (size_t r = 0; r < pending_ids_.size(); ++r) {
    const float* row = pending_.data() + r * stride_;
    if (pending_slots_[r] == kNew) {
      index_.emplace(pending_ids_[r], static_cast<uint32_t>(index_.size()));
      rows_.insert(rows_.end(), row, row + stride_);
    } else {
      std::copy_n(row, stride_, rows_.data() + pending_slots_[r] * stride_);
    }
  }
  pending_ids_.clear();
  pending_new_ = 0;
}

TableState EmbeddingTable::Save() const {
  TableState state;
  state.ids.reserve(index_.size());
  for (const auto& [id, row] : index_) state.ids.push_back(id);
  std::sort(state.ids.begin(), state.ids.end());
  state.rows.resize(state.ids.size() * stride_);
  for (size_t r = 0; r < state.ids.size(); ++r) {
    std::copy_n(rows_.data() + index_.at(state.ids[r]) * stride_, stride_, state.rows.data() + r * stride_);
  }
  return state;
}

void EmbeddingTable::Load(const TableState& state) {
  budget_->Give(index_.size());
  budget_->Force(state.ids.size());
  index_.clear();
  rows_.assign(state.rows.begin(), state.rows.end());
  for (size_t r = 0; r < state.ids.size(); ++r) index_.emplace(state.ids[r], static_cast<uint32_t>(r));
}

}  // namespace segps
