#include "training/optimizer.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "rpc/optimizer_codec.h"

namespace capstan::training {
namespace {

using Kind = Optimizer::Kind;

// The shortest text that reads back as `value` ("0.01", "1e-07", "nan").
std::string format_double(double value) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  if (ec != std::errc()) return "?";
  return std::string(buf, end);
}

// Each check is written so that NaN fails it.
Status check_positive(const Optimizer& c, const char* field, double value) {
  if (value > 0 && std::isfinite(value)) return Status::Ok();
  return Status::InvalidArgument("optimizer " + optimizer_name(c.kind) + ": " + field +
                                 " must be > 0, got " + format_double(value));
}
Status check_non_negative(const Optimizer& c, const char* field, double value) {
  if (value >= 0 && std::isfinite(value)) return Status::Ok();
  return Status::InvalidArgument("optimizer " + optimizer_name(c.kind) + ": " + field +
                                 " must be >= 0, got " + format_double(value));
}
Status check_unit_interval(const Optimizer& c, const char* field, double value) {
  if (value >= 0 && value < 1) return Status::Ok();
  return Status::InvalidArgument("optimizer " + optimizer_name(c.kind) + ": " + field +
                                 " must be in [0, 1), got " + format_double(value));
}

// What one update needs, computed once per call (Adam's bias correction and
// FTRL's beta folded in, as Keras does before calling the kernels).
struct Coefficients {
  Kind kind;
  double lr;  // Adam: lr_t
  double momentum;
  bool nesterov;
  double epsilon;
  double beta_1;
  double beta_2;
  double lr_power;
  double l1;
  double l2;  // FTRL: l2 + beta / (2 * lr), Keras' adjusted_l2_regularization_strength
  double l2_shrinkage;
};

// The 1-based `step` is Keras' iterations + 1: the schedule is evaluated at
// step - 1 (Keras' _decayed_lr), Adam's bias correction at step (its
// local_step).
// An override replaces the schedule's rate everywhere the rate enters.
Coefficients coefficients_for(const Optimizer& c, int64_t step, std::optional<double> override_rate) {
  const double lr = override_rate ? *override_rate : learning_rate_at(c, step - 1);
  Coefficients k{c.kind,   lr,       c.momentum,           c.nesterov, c.epsilon,   c.beta_1,
                 c.beta_2, c.learning_rate_power, c.l1, c.l2,       c.l2_shrinkage};
  if (c.kind == Kind::kAdam) {
    double t = static_cast<double>(step);
    k.lr = lr * std::sqrt(1 - std::pow(c.beta_2, t)) / (1 - std::pow(c.beta_1, t));
  }
  if (c.kind == Kind::kFtrl) k.l2 = c.l2 + c.beta / (2 * lr);
  return k;
}

// accumulator^(-lr_power); TF takes sqrt for the default -0.5.
double ftrl_power(double accumulator, double lr_power) {
  return lr_power == -0.5 ? std::sqrt(accumulator) : std::pow(accumulator, -lr_power);
}

// Updates n consecutive elements of a variable, of its slots `s0`, `s1`
// (null when the kind keeps fewer) and reads n gradient values. Every kind
// but Adam's sparse form goes through here.
template <typename T, typename G>
void update_run(const Coefficients& k, size_t n, T* w, T* s0, T* s1, const G* grad) {
  switch (k.kind) {
    case Kind::kNone:
      assert(false && "kNone has no update rule");
      return;
    case Kind::kSgd:
      for (size_t i = 0; i < n; ++i) {
        w[i] = static_cast<T>(w[i] - k.lr * static_cast<double>(grad[i]));
      }
      return;
    case Kind::kMomentum:  // ResourceApplyKerasMomentum
      for (size_t i = 0; i < n; ++i) {
        double g = static_cast<double>(grad[i]);
        double velocity = k.momentum * s0[i] - k.lr * g;
        s0[i] = static_cast<T>(velocity);
        w[i] = static_cast<T>(k.nesterov ? w[i] + k.momentum * velocity - k.lr * g
                                         : w[i] + velocity);
      }
      return;
    case Kind::kAdagrad:  // ResourceApplyAdagradV2
      for (size_t i = 0; i < n; ++i) {
        double g = static_cast<double>(grad[i]);
        double accumulator = s0[i] + g * g;
        s0[i] = static_cast<T>(accumulator);
        w[i] = static_cast<T>(w[i] - k.lr * g / (std::sqrt(accumulator) + k.epsilon));
      }
      return;
    case Kind::kAdam:  // ResourceApplyAdam
      for (size_t i = 0; i < n; ++i) {
        double g = static_cast<double>(grad[i]);
        double m = k.beta_1 * s0[i] + (1 - k.beta_1) * g;
        double v = k.beta_2 * s1[i] + (1 - k.beta_2) * g * g;
        s0[i] = static_cast<T>(m);
        s1[i] = static_cast<T>(v);
        w[i] = static_cast<T>(w[i] - k.lr * m / (std::sqrt(v) + k.epsilon));
      }
      return;
    case Kind::kFtrl:  // ResourceApplyFtrlV2 (ApplyFtrl when l2_shrinkage is 0)
      // FTRL divides by the rate. validate() keeps every schedule's rate
      // above 0, but an exponential_decay can underflow to 0 after very
      // many steps, and an override may be 0: such an update leaves the
      // variable and its slots alone.
      if (!(k.lr > 0)) return;
      for (size_t i = 0; i < n; ++i) {
        double g = static_cast<double>(grad[i]);
        double var = w[i];
        double accumulator = s0[i];
        // The shrinkage term enters the linear term only; the accumulator
        // sums the raw squared gradient (as the dense kernel does).
        double g_shrunk = g + 2 * k.l2_shrinkage * var;
        double new_accumulator = accumulator + g * g;
        double new_power = ftrl_power(new_accumulator, k.lr_power);
        double linear =
            s1[i] + g_shrunk - (new_power - ftrl_power(accumulator, k.lr_power)) / k.lr * var;
        double quadratic = new_power / k.lr + 2 * k.l2;
        double sign = linear < 0 ? -1.0 : 1.0;
        w[i] = static_cast<T>(std::abs(linear) > k.l1 ? (sign * k.l1 - linear) / quadratic : 0.0);
        s0[i] = static_cast<T>(new_accumulator);
        s1[i] = static_cast<T>(linear);
      }
      return;
  }
}

template <typename T>
T* slot_data(std::span<const std::span<T>> slots, size_t i) {
  return i < slots.size() ? slots[i].data() : nullptr;
}

Status schedule_error(const Optimizer& c, const std::string& what) {
  return Status::InvalidArgument("optimizer " + optimizer_name(c.kind) + ": " +
                                 learning_rate_schedule_name(c.schedule.kind) + " schedule: " + what);
}

// The schedule's arguments (see LearningRateSchedule), each check written so
// that NaN fails it.
Status validate_schedule(const Optimizer& c) {
  using ScheduleKind = LearningRateSchedule::Kind;
  const LearningRateSchedule& s = c.schedule;
  switch (s.kind) {
    case ScheduleKind::kConstant:
      return Status::Ok();
    case ScheduleKind::kExponentialDecay:
      if (s.decay_steps <= 0) {
        return schedule_error(c, "decay_steps must be > 0, got " + std::to_string(s.decay_steps));
      }
      if (!(s.decay_rate > 0) || !std::isfinite(s.decay_rate)) {
        return schedule_error(c, "decay_rate must be > 0, got " + format_double(s.decay_rate));
      }
      return Status::Ok();
    case ScheduleKind::kPiecewiseConstantDecay:
      if (s.values.size() != s.boundaries.size() + 1) {
        return schedule_error(c, "values must have one more entry than boundaries (" +
                                     std::to_string(s.boundaries.size()) + "), got " +
                                     std::to_string(s.values.size()));
      }
      for (size_t i = 0; i < s.boundaries.size(); ++i) {
        if (i == 0 && s.boundaries[0] < 0) {
          return schedule_error(c, "boundaries[0] must be >= 0, got " + std::to_string(s.boundaries[0]));
        }
        if (i > 0 && s.boundaries[i] <= s.boundaries[i - 1]) {
          return schedule_error(c, "boundaries must increase, got boundaries[" + std::to_string(i) +
                                       "] = " + std::to_string(s.boundaries[i]) + " after " +
                                       std::to_string(s.boundaries[i - 1]));
        }
      }
      for (size_t i = 0; i < s.values.size(); ++i) {
        if (!(s.values[i] > 0) || !std::isfinite(s.values[i])) {
          return schedule_error(c, "values[" + std::to_string(i) + "] must be > 0, got " +
                                       format_double(s.values[i]));
        }
      }
      if (c.learning_rate != s.values[0]) {
        return schedule_error(c, "learning_rate " + format_double(c.learning_rate) +
                                     " must equal values[0] " + format_double(s.values[0]) +
                                     " (the rate of the first update; with_schedule sets it)");
      }
      return Status::Ok();
    case ScheduleKind::kCosineDecay:
      if (s.decay_steps <= 0) {
        return schedule_error(c, "decay_steps must be > 0, got " + std::to_string(s.decay_steps));
      }
      if (!(s.alpha >= 0 && s.alpha <= 1)) {
        return schedule_error(c, "alpha must be in [0, 1], got " + format_double(s.alpha));
      }
      if (c.kind == Kind::kFtrl && !(s.alpha > 0)) {
        return schedule_error(c, "alpha must be > 0 for ftrl, which divides by the rate, got " +
                                     format_double(s.alpha));
      }
      return Status::Ok();
  }
  return Status::InvalidArgument("optimizer " + optimizer_name(c.kind) + ": unknown schedule kind " +
                                 std::to_string(static_cast<int>(s.kind)));
}

Status validate_hyperparameters(const Optimizer& c) {
  switch (c.kind) {
    case Kind::kNone:
      return Status::Ok();
    case Kind::kSgd:
      return check_positive(c, "learning_rate", c.learning_rate);
    case Kind::kMomentum:
      CAPSTAN_RETURN_IF_ERROR(check_positive(c, "learning_rate", c.learning_rate));
      return check_unit_interval(c, "momentum", c.momentum);
    case Kind::kAdagrad:
      CAPSTAN_RETURN_IF_ERROR(check_positive(c, "learning_rate", c.learning_rate));
      CAPSTAN_RETURN_IF_ERROR(
          check_non_negative(c, "initial_accumulator_value", c.initial_accumulator_value));
      return check_positive(c, "epsilon", c.epsilon);
    case Kind::kAdam:
      CAPSTAN_RETURN_IF_ERROR(check_positive(c, "learning_rate", c.learning_rate));
      CAPSTAN_RETURN_IF_ERROR(check_unit_interval(c, "beta_1", c.beta_1));
      CAPSTAN_RETURN_IF_ERROR(check_unit_interval(c, "beta_2", c.beta_2));
      return check_positive(c, "epsilon", c.epsilon);
    case Kind::kFtrl:
      CAPSTAN_RETURN_IF_ERROR(check_positive(c, "learning_rate", c.learning_rate));
      if (!(c.learning_rate_power <= 0) || !std::isfinite(c.learning_rate_power)) {
        return Status::InvalidArgument("optimizer ftrl: learning_rate_power must be <= 0, got " +
                                       format_double(c.learning_rate_power));
      }
      CAPSTAN_RETURN_IF_ERROR(
          check_non_negative(c, "initial_accumulator_value", c.initial_accumulator_value));
      CAPSTAN_RETURN_IF_ERROR(check_non_negative(c, "l1", c.l1));
      CAPSTAN_RETURN_IF_ERROR(check_non_negative(c, "l2", c.l2));
      CAPSTAN_RETURN_IF_ERROR(check_non_negative(c, "l2_shrinkage", c.l2_shrinkage));
      return check_non_negative(c, "beta", c.beta);
  }
  return Status::InvalidArgument("optimizer: unknown kind " +
                                 std::to_string(static_cast<int>(c.kind)));
}

}  // namespace

Status validate(const Optimizer& c) {
  CAPSTAN_RETURN_IF_ERROR(validate_hyperparameters(c));
  if (c.kind == Kind::kNone) return Status::Ok();
  return validate_schedule(c);
}


std::string optimizer_debug_string(const Optimizer& c) {
  std::string out = optimizer_name(c.kind);
  if (c.kind == Kind::kNone) return out;
  out += "(";
  bool first = true;
  for (const auto& field : rpc::optimizer_fields(c.kind)) {
    out += first ? "" : ", ";
    first = false;
    out += std::string(field.name) + "=" + format_double(c.*field.value);
  }
  if (c.kind == Kind::kMomentum) out += c.nesterov ? ", nesterov=true" : ", nesterov=false";
  if (c.schedule.kind != LearningRateSchedule::Kind::kConstant) {
    out += ", schedule=" + rpc::schedule_debug_string(c.schedule);
  }
  out += ")";
  return out;
}

Status validate_learning_rate_override(double learning_rate) {
  if (learning_rate >= 0 && std::isfinite(learning_rate)) return Status::Ok();
  return Status::InvalidArgument("learning_rate override must be finite and >= 0, got " +
                                 format_double(learning_rate));
}

std::vector<std::string> slot_names(Kind kind) {
  switch (kind) {
    case Kind::kNone:
    case Kind::kSgd:
      return {};
    case Kind::kMomentum:
      return {"momentum"};
    case Kind::kAdagrad:
      return {"accumulator"};
    case Kind::kAdam:
      return {"m", "v"};
    case Kind::kFtrl:
      return {"accumulator", "linear"};
  }
  return {};
}

double slot_initial_value(const Optimizer& config, size_t index) {
  std::vector<std::string> names = slot_names(config.kind);
  if (index < names.size() && names[index] == "accumulator") {
    return config.initial_accumulator_value;
  }
  return 0.0;
}

template <typename T>
void apply_dense_update(const Optimizer& config, int64_t step, std::span<T> var,
                        std::span<const std::span<T>> slots, std::span<const T> gradient,
                        std::optional<double> learning_rate) {
  assert(config.kind != Kind::kNone && step >= 1);
  assert(!learning_rate || validate_learning_rate_override(*learning_rate).ok());
  assert(gradient.size() == var.size());
  assert(slots.size() == slot_names(config.kind).size());
  for ([[maybe_unused]] const auto& slot : slots) assert(slot.size() == var.size());
  Coefficients k = coefficients_for(config, step, learning_rate);
  update_run(k, var.size(), var.data(), slot_data(slots, 0), slot_data(slots, 1),
             gradient.data());
}

template <typename T>
void apply_sparse_update(const Optimizer& config, int64_t step, int64_t row_size,
                         std::span<T> var, std::span<const std::span<T>> slots,
                         std::span<const int64_t> ids, std::span<const T> rows,
                         std::optional<double> learning_rate) {
  assert(config.kind != Kind::kNone && step >= 1 && row_size >= 1);
  assert(!learning_rate || validate_learning_rate_override(*learning_rate).ok());
  const size_t width = static_cast<size_t>(row_size);
  assert(var.size() % width == 0);
  assert(rows.size() == ids.size() * width);
  assert(slots.size() == slot_names(config.kind).size());
  for ([[maybe_unused]] const auto& slot : slots) assert(slot.size() == var.size());
  const int64_t num_rows = static_cast<int64_t>(var.size() / width);

  // Sum the rows of repeated ids (in double), keeping first-appearance order.
  std::vector<int64_t> unique_ids;
  std::vector<double> summed;
  std::unordered_map<int64_t, size_t> position;
  position.reserve(ids.size());
  for (size_t j = 0; j < ids.size(); ++j) {
    assert(ids[j] >= 0 && ids[j] < num_rows);
    auto [it, inserted] = position.try_emplace(ids[j], unique_ids.size());
    if (inserted) {
      unique_ids.push_back(ids[j]);
      summed.resize(summed.size() + width, 0.0);
    }
    double* out = summed.data() + it->second * width;
    const T* in = rows.data() + j * width;
    for (size_t i = 0; i < width; ++i) out[i] += static_cast<double>(in[i]);
  }

  Coefficients k = coefficients_for(config, step, learning_rate);
  T* s0 = slot_data(slots, 0);
  T* s1 = slot_data(slots, 1);
  if (config.kind != Kind::kAdam) {
    for (size_t u = 0; u < unique_ids.size(); ++u) {
      size_t offset = static_cast<size_t>(unique_ids[u]) * width;
      update_run(k, width, var.data() + offset, s0 ? s0 + offset : nullptr,
                 s1 ? s1 + offset : nullptr, summed.data() + u * width);
    }
    return;
  }

  // Adam: every row is updated, the named ones with their summed gradient,
  // the others with a zero gradient (the decay of m and v, and the move of
  // var by what is left of m). Walking the rows in order against the sorted
  // ids keeps this one pass without a row-sized index.
  std::vector<size_t> order(unique_ids.size());
  for (size_t u = 0; u < order.size(); ++u) order[u] = u;
  std::sort(order.begin(), order.end(),
            [&unique_ids](size_t a, size_t b) { return unique_ids[a] < unique_ids[b]; });
  const std::vector<double> zeros(width, 0.0);
  size_t next = 0;
  for (int64_t r = 0; r < num_rows; ++r) {
    const double* g = zeros.data();
    if (next < order.size() && unique_ids[order[next]] == r) {
      g = summed.data() + order[next] * width;
      ++next;
    }
    size_t offset = static_cast<size_t>(r) * width;
    update_run(k, width, var.data() + offset, s0 + offset, s1 + offset, g);
  }
}

template void apply_dense_update<float>(const Optimizer&, int64_t, std::span<float>,
                                        std::span<const std::span<float>>,
                                        std::span<const float>, std::optional<double>);
template void apply_dense_update<double>(const Optimizer&, int64_t, std::span<double>,
                                         std::span<const std::span<double>>,
                                         std::span<const double>, std::optional<double>);
template void apply_sparse_update<float>(const Optimizer&, int64_t, int64_t,
                                         std::span<float>, std::span<const std::span<float>>,
                                         std::span<const int64_t>, std::span<const float>,
                                         std::optional<double>);
template void apply_sparse_update<double>(const Optimizer&, int64_t, int64_t,
                                          std::span<double>, std::span<const std::span<double>>,
                                          std::span<const int64_t>, std::span<const double>,
                                          std::optional<double>);

}  // namespace capstan::training
