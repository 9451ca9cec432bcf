#include "training/initializer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace capstan::training {
namespace {

using Kind = Initializer::Kind;

template <typename T>
std::vector<double> values(const Tensor& t) {
  auto flat = t.flat<T>();
  return {flat.begin(), flat.end()};
}

std::vector<double> as_doubles(const Tensor& t) {
  return t.dtype() == DType::kFloat32 ? values<float>(t) : values<double>(t);
}

std::vector<double> rows_of(const Initializer& init, DType dtype, const Shape& shape, int64_t first, int64_t rows) {
  auto t = initial_rows(init, dtype, shape, first, rows);
  REQUIRE(t.ok());
  return as_doubles(*t);
}

struct Moments {
  double mean = 0;
  double stddev = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
};

Moments moments(const std::vector<double>& v) {
  Moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - m.mean) * (x - m.mean);
  m.stddev = std::sqrt(var / static_cast<double>(v.size()));
  return m;
}

// The concatenation of shards of `sizes` rows equals the whole variable.
void check_shard_invariance(const Initializer& init, DType dtype, const Shape& shape,
                            const std::vector<int64_t>& sizes) {
  std::vector<double> whole = rows_of(init, dtype, shape, 0, shape[0]);
  std::vector<double> joined;
  int64_t first = 0;
  for (int64_t rows : sizes) {
    std::vector<double> part = rows_of(init, dtype, shape, first, rows);
    joined.insert(joined.end(), part.begin(), part.end());
    first += rows;
  }
  REQUIRE(first == shape[0]);
  CHECK(joined == whole);
}

constexpr int64_t kLarge = 1 << 20;  // elements for the statistics

TEST_CASE("zeros and constant fill every dtype they can hold", "[initializer]") {
  auto zeros = initial_rows(Initializer::zeros(), DType::kInt32, {3, 2}, 0, 3);
  REQUIRE(zeros.ok());
  CHECK(zeros->shape() == Shape{3, 2});
  for (int32_t v : zeros->flat<int32_t>()) CHECK(v == 0);
  auto sevens = initial_rows(Initializer::constant(7), DType::kInt64, {4}, 1, 2);
  REQUIRE(sevens.ok());
  CHECK(sevens->shape() == Shape{2});
  for (int64_t v : sevens->flat<int64_t>()) CHECK(v == 7);
  auto halves = initial_rows(Initializer::constant(0.5), DType::kFloat64, {}, 0, 1);
  REQUIRE(halves.ok());
  CHECK(halves->shape().empty());
  CHECK(halves->flat<double>()[0] == 0.5);
  auto half16 = initial_rows(Initializer::constant(0.5), DType::kFloat16, {2}, 0, 2);
  REQUIRE(half16.ok());
  CHECK(half16->flat<Float16>()[1].to_float() == 0.5f);
  auto truth = initial_rows(Initializer::constant(1), DType::kBool, {2}, 0, 2);
  REQUIRE(truth.ok());
  CHECK(truth->flat<bool>()[0]);
}

TEST_CASE("random_normal has the mean and stddev asked for", "[initializer]") {
  Moments m = moments(rows_of(Initializer::random_normal(1.5, 2.0, 3), DType::kFloat64, {kLarge}, 0, kLarge));
  CHECK(m.mean == Approx(1.5).margin(0.01));
  CHECK(m.stddev == Approx(2.0).epsilon(0.01));
  CHECK(m.max > 1.5 + 2 * 4);  // tails beyond 4 stddev: not truncated
}

TEST_CASE("truncated_normal never draws beyond 2 stddev and keeps TF's stddev", "[initializer]") {
  std::vector<double> v = rows_of(Initializer::truncated_normal(-1, 0.5, 11), DType::kFloat32, {1024, 1024}, 0, 1024);
  Moments m = moments(v);
  const double slack = 1e-6;  // float32 rounding
  CHECK(m.min >= -1 - 2 * 0.5 - slack);
  CHECK(m.max <= -1 + 2 * 0.5 + slack);
  CHECK(m.mean == Approx(-1).margin(0.005));
  // A standard normal truncated to [-2, 2] has stddev .8796.
  CHECK(m.stddev == Approx(0.5 * .87962566103423978).epsilon(0.01));
}

TEST_CASE("random_uniform stays at or above minval and below maxval with a uniform mean", "[initializer]") {
  Moments m = moments(rows_of(Initializer::random_uniform(-3, 5, 4), DType::kFloat64, {kLarge}, 0, kLarge));
  CHECK(m.min >= -3);
  CHECK(m.max < 5);
  CHECK(m.mean == Approx(1).margin(0.02));
  CHECK(m.stddev == Approx(8 / std::sqrt(12.0)).epsilon(0.01));
}

TEST_CASE("glorot_uniform's limit comes from the whole variable's fans, not the shard's", "[initializer]") {
  const Shape shape{2048, 512};
  const double limit = std::sqrt(6.0 / (2048 + 512));
  // One shard of 64 rows: fans still (2048, 512).
  std::vector<double> shard = rows_of(Initializer::glorot_uniform(5), DType::kFloat64, shape, 1024, 64);
  Moments m = moments(shard);
  CHECK(m.min >= -limit);
  CHECK(m.max <= limit);
  CHECK(m.max > 0.99 * limit);
  CHECK(m.stddev == Approx(limit / std::sqrt(3.0)).epsilon(0.02));
}

TEST_CASE("glorot_normal is a truncated normal with Keras' stddev from the whole shape", "[initializer]") {
  const Shape shape{3, 3, 64, 128};  // a conv kernel: fans 9 * 64, 9 * 128
  const double fan_in = 9 * 64, fan_out = 9 * 128;
  const double stddev = std::sqrt(2.0 / (fan_in + fan_out)) / .87962566103423978;
  std::vector<double> v = rows_of(Initializer::glorot_normal(8), DType::kFloat64, shape, 1, 2);
  Moments m = moments(v);
  CHECK(m.max <= 2 * stddev);
  CHECK(m.min >= -2 * stddev);
  CHECK(m.stddev == Approx(std::sqrt(2.0 / (fan_in + fan_out))).epsilon(0.02));
}

TEST_CASE("keras_fans follows compute_fans", "[initializer]") {
  CHECK(keras_fans({}).in == 1);
  CHECK(keras_fans({7}).in == 7);
  CHECK(keras_fans({7}).out == 7);
  CHECK(keras_fans({7, 3}).in == 7);
  CHECK(keras_fans({7, 3}).out == 3);
  CHECK(keras_fans({2, 5, 7, 3}).in == 70);
  CHECK(keras_fans({2, 5, 7, 3}).out == 30);
}

TEST_CASE("the same seed gives the same values, another seed others", "[initializer]") {
  for (Initializer init : {Initializer::random_normal(0, 1, 9), Initializer::truncated_normal(0, 1, 9),
                           Initializer::random_uniform(0, 1, 9), Initializer::glorot_uniform(9),
                           Initializer::glorot_normal(9)}) {
    INFO(initializer_debug_string(init));
    std::vector<double> a = rows_of(init, DType::kFloat32, {100, 10}, 0, 100);
    CHECK(a == rows_of(init, DType::kFloat32, {100, 10}, 0, 100));
    Initializer other = init;
    other.seed = 10;
    std::vector<double> b = rows_of(other, DType::kFloat32, {100, 10}, 0, 100);
    CHECK(a != b);
  }
}

TEST_CASE("shards computed apart concatenate to the unpartitioned variable", "[initializer]") {
  for (Initializer init : {Initializer::constant(2), Initializer::random_normal(0, 1, 1),
                           Initializer::truncated_normal(0, 1, 2), Initializer::random_uniform(-1, 1, 3),
                           Initializer::glorot_uniform(4), Initializer::glorot_normal(5)}) {
    INFO(initializer_debug_string(init));
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      check_shard_invariance(init, dtype, {10, 3}, {4, 3, 3});   // TF's div split of 10 rows in 3
      check_shard_invariance(init, dtype, {10, 3}, {10});
      check_shard_invariance(init, dtype, {7, 2, 5}, {1, 1, 1, 1, 1, 1, 1});
      check_shard_invariance(init, dtype, {5}, {0, 2, 0, 3});
    }
  }
}

TEST_CASE("a large shard filled on several threads equals the same rows filled in pieces", "[initializer]") {
  const Shape shape{1 << 12, 1 << 10};  // 4M elements: several threads
  std::vector<double> whole = rows_of(Initializer::truncated_normal(0, 1, 21), DType::kFloat32, shape, 0, 1 << 12);
  std::vector<double> piece = rows_of(Initializer::truncated_normal(0, 1, 21), DType::kFloat32, shape, 4000, 3);
  for (size_t i = 0; i < piece.size(); ++i) REQUIRE(piece[i] == whole[4000 * 1024 + i]);
}

TEST_CASE("a bad initializer is InvalidArgument naming the value", "[initializer]") {
  struct Case {
    Initializer init;
    DType dtype;
    std::string names;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Case> cases = {
      {Initializer::random_normal(0, -1), DType::kFloat32, "stddev -1"},
      {Initializer::truncated_normal(0, nan), DType::kFloat32, "stddev nan"},
      {Initializer::random_normal(inf, 1), DType::kFloat64, "mean inf"},
      {Initializer::random_uniform(2, 1), DType::kFloat32, "minval 2 is greater than maxval 1"},
      {Initializer::random_uniform(-inf, 1), DType::kFloat32, "minval -inf"},
      {Initializer::constant(nan), DType::kFloat32, "value nan"},
      {Initializer::constant(0.5), DType::kInt32, "value 0.5 does not fit a int32"},
      {Initializer::constant(300), DType::kUInt8, "value 300"},
      {Initializer::constant(2), DType::kBool, "value 2"},
      {Initializer::random_normal(0, 1), DType::kInt32, "not int32"},
      {Initializer::glorot_uniform(1), DType::kFloat16, "not float16"},
      {Initializer::zeros(), DType::kString, "string"},
      {Initializer{}, DType::kFloat32, "none"},
      {Initializer{.kind = static_cast<Kind>(42)}, DType::kFloat32, "unknown(42)"},
  };
  for (const Case& c : cases) {
    Status status = validate_initializer(c.init, c.dtype);
    INFO(status.to_string());
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK(status.message().find(c.names) != std::string::npos);
    CHECK(initial_rows(c.init, c.dtype, {2}, 0, 2).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("rows outside the variable are InvalidArgument", "[initializer]") {
  Initializer init = Initializer::random_normal(0, 1, 1);
  CHECK(initial_rows(init, DType::kFloat32, {10, 2}, 8, 3).status().code() == StatusCode::kInvalidArgument);
  CHECK(initial_rows(init, DType::kFloat32, {10, 2}, -1, 2).status().code() == StatusCode::kInvalidArgument);
  CHECK(initial_rows(init, DType::kFloat32, {10, 2}, 0, -1).status().code() == StatusCode::kInvalidArgument);
  CHECK(initial_rows(init, DType::kFloat32, {}, 0, 2).status().code() == StatusCode::kInvalidArgument);
  CHECK(initial_rows(init, DType::kFloat32, {-4}, 0, 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(initial_rows(init, DType::kFloat32, {10, 2}, 10, 0).ok());  // an empty shard at the end
}

}  // namespace
}  // namespace capstan::training
