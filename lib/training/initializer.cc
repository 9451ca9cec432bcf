#include "training/initializer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numbers>
#include <span>
#include <thread>
#include <vector>

namespace capstan::training {
namespace {

using Kind = Initializer::Kind;

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
// Keras' constant: the stddev of a standard normal truncated to [-2, 2].
constexpr double kTruncatedStddev = .87962566103423978;
// Elements one thread fills before another is worth starting.
constexpr int64_t kElementsPerThread = int64_t{1} << 20;

uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The k-th draw of element `index` of the stream keyed by `key`.
uint64_t draw(uint64_t key, uint64_t index, uint64_t k) {
  return mix64(key + kGolden * (index * kDrawsPerElement + k + 1));
}

// [0, 1) and (0, 1], 53 bits.
double unit_closed_open(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }
double unit_open_closed(uint64_t bits) { return static_cast<double>((bits >> 11) + 1) * 0x1.0p-53; }

// A standard normal from draws k and k + 1 (Box-Muller, cosine branch).
double normal(uint64_t key, uint64_t index, uint64_t k) {
  double u1 = unit_open_closed(draw(key, index, k));
  double u2 = unit_closed_open(draw(key, index, k + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double truncated_normal(uint64_t key, uint64_t index) {
  for (uint64_t k = 0; k + 1 < kDrawsPerElement; k += 2) {
    double z = normal(key, index, k);
    if (std::abs(z) <= 2.0) return z;
  }
  return 0.0;
}

bool is_random(Kind kind) {
  return kind == Kind::kRandomNormal || kind == Kind::kTruncatedNormal || kind == Kind::kRandomUniform ||
         kind == Kind::kGlorotUniform || kind == Kind::kGlorotNormal;
}

std::string number(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return ec == std::errc() ? std::string(buffer, end) : std::to_string(value);
}

Status bad(const Initializer& init, const std::string& why) {
  return Status::InvalidArgument("initializer " + initializer_debug_string(init) + ": " + why);
}

// The constant `value` fits `dtype` (integers: an integer in range; bool: 0
// or 1; floats: finite).
Status check_constant(const Initializer& init, DType dtype) {
  const double v = init.value;
  if (!std::isfinite(v)) return bad(init, "value " + number(v) + " is not finite");
  auto integral_in = [&](double lo, double hi) -> Status {
    if (v != std::trunc(v) || v < lo || v > hi) {
      return bad(init, "value " + number(v) + " does not fit a " + std::string(dtype_name(dtype)) + " variable");
    }
    return Status::Ok();
  };
  switch (dtype) {
    case DType::kInt8: return integral_in(-128, 127);
    case DType::kInt16: return integral_in(-32768, 32767);
    case DType::kInt32: return integral_in(-2147483648.0, 2147483647.0);
    // Doubles at and beyond 2^63 do not fit.
    case DType::kInt64: return integral_in(-9223372036854775808.0, 9223372036854774784.0);
    case DType::kUInt8: return integral_in(0, 255);
    case DType::kBool: return integral_in(0, 1);
    default: return Status::Ok();
  }
}

template <typename T>
T cast_to(double v) {
  if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
    return T::from_float(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
void fill_constant(Tensor& t, double value) {
  auto flat = t.mutable_flat<T>();
  std::fill(flat.begin(), flat.end(), cast_to<T>(value));
}

// out[j] = element first_index + j, for j in [begin, end).
template <typename T>
void fill_random(const Initializer& init, const Shape& shape, uint64_t first_index, std::span<T> out,
                 size_t begin, size_t end) {
  for (size_t j = begin; j < end; ++j) out[j] = static_cast<T>(initial_element(init, shape, first_index + j));
}

template <typename T>
void fill_random_parallel(const Initializer& init, const Shape& shape, uint64_t first_index, Tensor& t) {
  std::span<T> out = t.mutable_flat<T>();
  const size_t n = out.size();
  const size_t threads = std::clamp<size_t>(n / kElementsPerThread, 1,
                                            std::max<size_t>(1, std::min(8u, std::thread::hardware_concurrency())));
  if (threads == 1) {
    fill_random<T>(init, shape, first_index, out, 0, n);
    return;
  }
  std::vector<std::thread> pool;
  const size_t per = (n + threads - 1) / threads;
  for (size_t i = 0; i < threads; ++i) {
    size_t begin = std::min(n, i * per);
    size_t end = std::min(n, begin + per);
    pool.emplace_back([&init, &shape, first_index, out, begin, end]() {
      fill_random<T>(init, shape, first_index, out, begin, end);
    });
  }
  for (std::thread& thread : pool) thread.join();
}

}  // namespace

Status validate_initializer(const Initializer& init, DType dtype) {
  const bool known = init.kind >= Kind::kZeros && init.kind <= Kind::kGlorotNormal;
  if (!known) {
    return Status::InvalidArgument("initializer kind " + initializer_name(init.kind) +
                                   " is not one of zeros, constant, random_normal, truncated_normal, "
                                   "random_uniform, glorot_uniform, glorot_normal");
  }
  if (dtype == DType::kInvalid || dtype == DType::kString) {
    return bad(init, "cannot fill a " + std::string(dtype_name(dtype)) + " variable");
  }
  if (is_random(init.kind) && dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    return bad(init, "a random initializer needs a float32 or float64 variable, not " +
                         std::string(dtype_name(dtype)) + " (zeros and constant fill any dtype)");
  }
  switch (init.kind) {
    case Kind::kConstant:
      return check_constant(init, dtype);
    case Kind::kRandomNormal:
    case Kind::kTruncatedNormal:
      if (!std::isfinite(init.mean)) return bad(init, "mean " + number(init.mean) + " is not finite");
      if (!std::isfinite(init.stddev) || init.stddev < 0) {
        return bad(init, "stddev " + number(init.stddev) + " must be finite and >= 0");
      }
      return Status::Ok();
    case Kind::kRandomUniform:
      if (!std::isfinite(init.minval)) return bad(init, "minval " + number(init.minval) + " is not finite");
      if (!std::isfinite(init.maxval)) return bad(init, "maxval " + number(init.maxval) + " is not finite");
      if (init.minval > init.maxval) {
        return bad(init, "minval " + number(init.minval) + " is greater than maxval " + number(init.maxval));
      }
      return Status::Ok();
    default:
      return Status::Ok();
  }
}

Fans keras_fans(const Shape& shape) {
  if (shape.empty()) return {1, 1};
  if (shape.size() == 1) return {static_cast<double>(shape[0]), static_cast<double>(shape[0])};
  if (shape.size() == 2) return {static_cast<double>(shape[0]), static_cast<double>(shape[1])};
  double receptive = 1;
  for (size_t d = 0; d + 2 < shape.size(); ++d) receptive *= static_cast<double>(shape[d]);
  return {static_cast<double>(shape[shape.size() - 2]) * receptive,
          static_cast<double>(shape[shape.size() - 1]) * receptive};
}

double initial_element(const Initializer& init, const Shape& shape, uint64_t index) {
  const uint64_t key = mix64(init.seed);
  switch (init.kind) {
    case Kind::kNone:
    case Kind::kZeros:
      return 0.0;
    case Kind::kConstant:
      return init.value;
    case Kind::kRandomNormal:
      return init.mean + init.stddev * normal(key, index, 0);
    case Kind::kTruncatedNormal:
      return init.mean + init.stddev * truncated_normal(key, index);
    case Kind::kRandomUniform:
      return init.minval + (init.maxval - init.minval) * unit_closed_open(draw(key, index, 0));
    case Kind::kGlorotUniform: {
      Fans fans = keras_fans(shape);
      // Keras' VarianceScaling(1, "fan_avg", "uniform"): scale / max(1, fan_avg).
      double limit = std::sqrt(3.0 / std::max(1.0, (fans.in + fans.out) / 2));
      return -limit + 2 * limit * unit_closed_open(draw(key, index, 0));
    }
    case Kind::kGlorotNormal: {
      Fans fans = keras_fans(shape);
      double stddev = std::sqrt(1.0 / std::max(1.0, (fans.in + fans.out) / 2)) / kTruncatedStddev;
      return stddev * truncated_normal(key, index);
    }
  }
  return 0.0;
}

Result<Tensor> initial_rows(const Initializer& init, DType dtype, const Shape& shape, int64_t first_row,
                            int64_t rows) {
  CAPSTAN_RETURN_IF_ERROR(validate_initializer(init, dtype));
  for (int64_t d : shape) {
    if (d < 0) return Status::InvalidArgument("initializer: shape " + shape_string(shape) + " has a negative dim");
  }
  Shape out_shape;
  if (shape.empty()) {
    if (first_row != 0 || rows != 1) {
      return Status::InvalidArgument("initializer: a scalar has one row (first row 0, 1 row), not first row " +
                                     std::to_string(first_row) + ", " + std::to_string(rows) + " rows");
    }
  } else {
    if (first_row < 0 || rows < 0 || first_row > shape[0] || rows > shape[0] - first_row) {
      return Status::InvalidArgument("initializer: rows [" + std::to_string(first_row) + ", " +
                                     std::to_string(first_row) + " + " + std::to_string(rows) +
                                     ") are outside the variable's " + std::to_string(shape[0]) + " rows");
    }
    out_shape = shape;
    out_shape[0] = rows;
  }
  if (init.kind == Kind::kZeros) return Tensor::zeros(dtype, std::move(out_shape));
  const int64_t row_size = shape.empty() ? 1 : shape_num_elements(Shape(shape.begin() + 1, shape.end()));
  const uint64_t first_index = static_cast<uint64_t>(first_row) * static_cast<uint64_t>(row_size);
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dtype, std::move(out_shape)));
  if (init.kind == Kind::kConstant) {
    switch (dtype) {
      case DType::kFloat16: fill_constant<Float16>(out, init.value); break;
      case DType::kBFloat16: fill_constant<BFloat16>(out, init.value); break;
      case DType::kFloat32: fill_constant<float>(out, init.value); break;
      case DType::kFloat64: fill_constant<double>(out, init.value); break;
      case DType::kInt8: fill_constant<int8_t>(out, init.value); break;
      case DType::kInt16: fill_constant<int16_t>(out, init.value); break;
      case DType::kInt32: fill_constant<int32_t>(out, init.value); break;
      case DType::kInt64: fill_constant<int64_t>(out, init.value); break;
      case DType::kUInt8: fill_constant<uint8_t>(out, init.value); break;
      case DType::kBool: fill_constant<bool>(out, init.value); break;
      case DType::kString:
      case DType::kInvalid:
        break;  // refused by validate_initializer
    }
    return out;
  }
  if (dtype == DType::kFloat32) {
    fill_random_parallel<float>(init, shape, first_index, out);
  } else {
    fill_random_parallel<double>(init, shape, first_index, out);
  }
  return out;
}

std::string initializer_debug_string(const Initializer& init) {
  std::string s = initializer_name(init.kind);
  switch (init.kind) {
    case Kind::kConstant:
      return s + "(value=" + number(init.value) + ")";
    case Kind::kRandomNormal:
    case Kind::kTruncatedNormal:
      return s + "(mean=" + number(init.mean) + ", stddev=" + number(init.stddev) +
             ", seed=" + std::to_string(init.seed) + ")";
    case Kind::kRandomUniform:
      return s + "(minval=" + number(init.minval) + ", maxval=" + number(init.maxval) +
             ", seed=" + std::to_string(init.seed) + ")";
    case Kind::kGlorotUniform:
    case Kind::kGlorotNormal:
      return s + "(seed=" + std::to_string(init.seed) + ")";
    default:
      return s;
  }
}

}  // namespace capstan::training
