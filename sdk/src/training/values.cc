// The value types of capstan/training.h (optimizers, partitioners,
// initializers): no RPC, so the internal libraries that describe variables
// (checkpoints, the optimizer codec, the variable router) use them from
// capstan_base without reaching up to the client.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <random>

#include "capstan/training.h"

namespace capstan {
namespace {

template <typename T>
Result<Tensor> fill(DType dtype, Shape shape, const std::function<double()>& next) {
  CAPSTAN_ASSIGN_OR_RETURN(Tensor t, Tensor::uninitialized(dtype, std::move(shape)));
  for (auto& v : t.mutable_flat<T>()) v = static_cast<T>(next());
  return t;
}

Result<Tensor> filled(DType dtype, Shape shape, const std::function<double()>& next) {
  switch (dtype) {
    case DType::kFloat32: return fill<float>(dtype, std::move(shape), next);
    case DType::kFloat64: return fill<double>(dtype, std::move(shape), next);
    case DType::kInt32: return fill<int32_t>(dtype, std::move(shape), next);
    case DType::kInt64: return fill<int64_t>(dtype, std::move(shape), next);
    default:
      return Status::InvalidArgument("initializers support float32, float64, int32 and int64, not " +
                                     std::string(dtype_name(dtype)));
  }
}

}  // namespace

// ---- Optimizers, partitioners, initializers ---------------------------------------

namespace {
constexpr std::pair<Optimizer::Kind, const char*> kOptimizerNames[] = {
    {Optimizer::Kind::kNone, "none"},       {Optimizer::Kind::kSgd, "sgd"},   {Optimizer::Kind::kMomentum, "momentum"},
    {Optimizer::Kind::kAdagrad, "adagrad"}, {Optimizer::Kind::kAdam, "adam"}, {Optimizer::Kind::kFtrl, "ftrl"},
};
}  // namespace

std::string optimizer_name(Optimizer::Kind kind) {
  for (const auto& [k, name] : kOptimizerNames) {
    if (k == kind) return name;
  }
  return "unknown(" + std::to_string(static_cast<int>(kind)) + ")";
}

std::optional<Optimizer::Kind> optimizer_kind_from_name(std::string_view name) {
  for (const auto& [k, n] : kOptimizerNames) {
    if (name == n) return k;
  }
  return std::nullopt;
}

namespace {
constexpr std::pair<LearningRateSchedule::Kind, const char*> kScheduleNames[] = {
    {LearningRateSchedule::Kind::kConstant, "constant"},
    {LearningRateSchedule::Kind::kExponentialDecay, "exponential_decay"},
    {LearningRateSchedule::Kind::kPiecewiseConstantDecay, "piecewise_constant_decay"},
    {LearningRateSchedule::Kind::kCosineDecay, "cosine_decay"},
};
}  // namespace

std::string learning_rate_schedule_name(LearningRateSchedule::Kind kind) {
  for (const auto& [k, name] : kScheduleNames) {
    if (k == kind) return name;
  }
  return "unknown(" + std::to_string(static_cast<int>(kind)) + ")";
}

std::optional<LearningRateSchedule::Kind> learning_rate_schedule_kind_from_name(std::string_view name) {
  for (const auto& [k, n] : kScheduleNames) {
    if (name == n) return k;
  }
  return std::nullopt;
}

LearningRateSchedule LearningRateSchedule::constant() { return {}; }
LearningRateSchedule LearningRateSchedule::exponential_decay(int64_t decay_steps, double decay_rate, bool staircase) {
  return {.kind = Kind::kExponentialDecay, .decay_steps = decay_steps, .decay_rate = decay_rate, .staircase = staircase};
}
LearningRateSchedule LearningRateSchedule::piecewise_constant_decay(std::vector<int64_t> boundaries,
                                                                   std::vector<double> values) {
  return {.kind = Kind::kPiecewiseConstantDecay, .boundaries = std::move(boundaries), .values = std::move(values)};
}
LearningRateSchedule LearningRateSchedule::cosine_decay(int64_t decay_steps, double alpha) {
  return {.kind = Kind::kCosineDecay, .decay_steps = decay_steps, .alpha = alpha};
}

Optimizer Optimizer::with_schedule(LearningRateSchedule s) const {
  Optimizer out = *this;
  if (s.kind == LearningRateSchedule::Kind::kPiecewiseConstantDecay && !s.values.empty()) {
    out.learning_rate = s.values.front();
  }
  out.schedule = std::move(s);
  return out;
}

// Keras' formulas (tf.keras.optimizers.schedules), in double. The
// optimizer's validate() keeps the arguments in range; out of range they
// give whatever the formula gives, never a crash.
double learning_rate_at(const Optimizer& optimizer, int64_t iterations) {
  const LearningRateSchedule& s = optimizer.schedule;
  const double step = static_cast<double>(std::max<int64_t>(iterations, 0));
  switch (s.kind) {
    case LearningRateSchedule::Kind::kConstant:
      return optimizer.learning_rate;
    case LearningRateSchedule::Kind::kExponentialDecay: {
      double p = step / static_cast<double>(s.decay_steps);
      if (s.staircase) p = std::floor(p);
      return optimizer.learning_rate * std::pow(s.decay_rate, p);
    }
    case LearningRateSchedule::Kind::kPiecewiseConstantDecay: {
      // The first boundary not below `iterations` picks the value before it.
      auto above = std::lower_bound(s.boundaries.begin(), s.boundaries.end(), iterations);
      auto i = static_cast<size_t>(above - s.boundaries.begin());
      if (s.values.empty()) return optimizer.learning_rate;
      return s.values[std::min(i, s.values.size() - 1)];
    }
    case LearningRateSchedule::Kind::kCosineDecay: {
      const double decay_steps = static_cast<double>(s.decay_steps);
      const double completed = std::min(step, decay_steps) / decay_steps;
      const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * completed));
      return optimizer.learning_rate * ((1 - s.alpha) * cosine + s.alpha);
    }
  }
  return optimizer.learning_rate;
}

// The factories name only the fields they set (designated initializers, in
// declaration order); the rest keep their defaults.
EmbeddingInitializer EmbeddingInitializer::zeros() { return {.kind = "zeros"}; }
EmbeddingInitializer EmbeddingInitializer::constant(double value) { return {.kind = "constant", .value = value}; }
EmbeddingInitializer EmbeddingInitializer::random_normal(double mean, double stddev, uint64_t seed) {
  return {.kind = "random_normal", .mean = mean, .stddev = stddev, .seed = seed};
}

Initializer Initializer::zeros() { return {.kind = Kind::kZeros}; }
Initializer Initializer::constant(double value) { return {.kind = Kind::kConstant, .value = value}; }
Initializer Initializer::random_normal(double mean, double stddev, uint64_t seed) {
  return {.kind = Kind::kRandomNormal, .mean = mean, .stddev = stddev, .seed = seed};
}
Initializer Initializer::truncated_normal(double mean, double stddev, uint64_t seed) {
  return {.kind = Kind::kTruncatedNormal, .mean = mean, .stddev = stddev, .seed = seed};
}
Initializer Initializer::random_uniform(double minval, double maxval, uint64_t seed) {
  return {.kind = Kind::kRandomUniform, .minval = minval, .maxval = maxval, .seed = seed};
}
Initializer Initializer::glorot_uniform(uint64_t seed) { return {.kind = Kind::kGlorotUniform, .seed = seed}; }
Initializer Initializer::glorot_normal(uint64_t seed) { return {.kind = Kind::kGlorotNormal, .seed = seed}; }

namespace {
constexpr std::pair<Initializer::Kind, const char*> kInitializerNames[] = {
    {Initializer::Kind::kNone, "none"},
    {Initializer::Kind::kZeros, "zeros"},
    {Initializer::Kind::kConstant, "constant"},
    {Initializer::Kind::kRandomNormal, "random_normal"},
    {Initializer::Kind::kTruncatedNormal, "truncated_normal"},
    {Initializer::Kind::kRandomUniform, "random_uniform"},
    {Initializer::Kind::kGlorotUniform, "glorot_uniform"},
    {Initializer::Kind::kGlorotNormal, "glorot_normal"},
};
}  // namespace

std::string initializer_name(Initializer::Kind kind) {
  for (const auto& [k, name] : kInitializerNames) {
    if (k == kind) return name;
  }
  return "unknown(" + std::to_string(static_cast<int>(kind)) + ")";
}

std::optional<Initializer::Kind> initializer_kind_from_name(std::string_view name) {
  for (const auto& [k, n] : kInitializerNames) {
    if (name == n) return k;
  }
  return std::nullopt;
}

uint64_t table_key_hash(int64_t key) {
  // SplitMix64's finalizer: a bijection of 64 bits, so nearby keys spread.
  uint64_t x = static_cast<uint64_t>(key) + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Optimizer Optimizer::none() { return {.kind = Kind::kNone}; }
Optimizer Optimizer::sgd(double learning_rate) { return {.kind = Kind::kSgd, .learning_rate = learning_rate}; }
Optimizer Optimizer::momentum_sgd(double learning_rate, double momentum, bool nesterov) {
  return {.kind = Kind::kMomentum, .learning_rate = learning_rate, .momentum = momentum, .nesterov = nesterov};
}
Optimizer Optimizer::adagrad(double learning_rate, double initial_accumulator_value, double epsilon) {
  return {.kind = Kind::kAdagrad,
          .learning_rate = learning_rate,
          .initial_accumulator_value = initial_accumulator_value,
          .epsilon = epsilon};
}
Optimizer Optimizer::adam(double learning_rate, double beta_1, double beta_2, double epsilon) {
  return {.kind = Kind::kAdam, .learning_rate = learning_rate, .epsilon = epsilon, .beta_1 = beta_1, .beta_2 = beta_2};
}
Optimizer Optimizer::ftrl(double learning_rate, double l1, double l2, double learning_rate_power,
                          double initial_accumulator_value) {
  return {.kind = Kind::kFtrl,
          .learning_rate = learning_rate,
          .initial_accumulator_value = initial_accumulator_value,
          .learning_rate_power = learning_rate_power,
          .l1 = l1,
          .l2 = l2};
}

Partitioner Partitioner::none() { return Partitioner{}; }
Partitioner Partitioner::fixed_shards(int64_t num_shards) { return {.kind = "fixed_shards", .num_shards = num_shards}; }
Partitioner Partitioner::min_size(int64_t min_shard_bytes, int64_t max_shards, int64_t bytes_per_string) {
  return {.kind = "min_size",
          .min_shard_bytes = min_shard_bytes,
          .max_shards = max_shards,
          .bytes_per_string = bytes_per_string};
}
Partitioner Partitioner::max_size(int64_t max_shard_bytes, int64_t max_shards, int64_t bytes_per_string) {
  return {.kind = "max_size",
          .max_shard_bytes = max_shard_bytes,
          .max_shards = max_shards,
          .bytes_per_string = bytes_per_string};
}

Result<Tensor> zeros_initializer(DType dtype, Shape shape) { return Tensor::zeros(dtype, std::move(shape)); }

Result<Tensor> constant_initializer(DType dtype, Shape shape, double value) {
  return filled(dtype, std::move(shape), [value]() { return value; });
}

Result<Tensor> random_normal_initializer(DType dtype, Shape shape, double mean, double stddev,
                                         uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(mean, stddev);
  return filled(dtype, std::move(shape), [&]() { return dist(rng); });
}

Result<Tensor> random_uniform_initializer(DType dtype, Shape shape, double minval, double maxval,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(minval, maxval);
  return filled(dtype, std::move(shape), [&]() { return dist(rng); });
}

Tensor PerWorkerDataset::arg() const { return Tensor::scalar<int64_t>(id); }

}  // namespace capstan
