// Initializers that run where a variable lives: each parameter server
// computes the rows of the shards it holds (capstan::Initializer in
// capstan/training.h). Element i (row-major) of the whole, logical variable
// is a function of (kind, parameters, seed, i) alone, so the rows [a, b) a
// shard computes are exactly those the unpartitioned variable has there, on
// any number of shards and servers.
//
// The random kinds draw 64-bit numbers from SplitMix64 at counter
// (index * kDrawsPerElement + k + 1) of a stream keyed by the seed: the
// k-th draw of element `index`. Normals are Box-Muller's cosine branch of
// two draws; a truncated normal takes the next pair while |z| > 2 (TF's
// redraw beyond 2 stddev), up to kDrawsPerElement / 2 pairs (then the mean:
// a chance of 0.0455^32, never seen).
//
// Example:
//   Initializer init = Initializer::glorot_uniform(7);
//   CAPSTAN_RETURN_IF_ERROR(validate_initializer(init, DType::kFloat32));
//   Tensor rows = initial_rows(init, DType::kFloat32, {1000, 64}, 500, 250).value();  // [250, 64]
//
// Thread-safe: pure functions.
#ifndef CAPSTAN_LIB_TRAINING_INITIALIZER_H_
#define CAPSTAN_LIB_TRAINING_INITIALIZER_H_

#include <cstdint>
#include <string>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "capstan/training.h"

namespace capstan::training {

inline constexpr uint64_t kDrawsPerElement = 64;

// OK when `init` can fill a variable of `dtype`; InvalidArgument naming the
// offending kind, dtype or value otherwise: kind none or unknown; a string
// or invalid dtype; a random kind on a dtype other than float32/float64; a
// parameter that is not finite; stddev < 0; minval > maxval; a constant
// that the dtype cannot hold (not an integer, out of range, bool not 0/1).
Status validate_initializer(const Initializer& init, DType dtype);

// Keras' compute_fans of the whole variable's shape: [] -> (1, 1);
// [n] -> (n, n); [a, b] -> (a, b); [..., a, b] -> (a * r, b * r), r the
// product of the leading dims.
struct Fans {
  double in = 1;
  double out = 1;
};
Fans keras_fans(const Shape& shape);

// Element `index` (row-major, in the whole variable of `shape`) of a valid
// initializer, as a double (before the cast to the variable's dtype).
double initial_element(const Initializer& init, const Shape& shape, uint64_t index);

// Rows [first_row, first_row + rows) of the variable of `dtype` and `shape`
// that `init` makes: shape [rows] + shape[1:]. A scalar (shape []) has one
// row: first_row 0, rows 1. InvalidArgument for a bad initializer (above) or
// a range outside [0, shape[0]]. Large ranges are filled on several threads.
Result<Tensor> initial_rows(const Initializer& init, DType dtype, const Shape& shape, int64_t first_row,
                            int64_t rows);

// "glorot_uniform(seed=7)", "random_normal(mean=0, stddev=0.05, seed=1)":
// for messages and logs.
std::string initializer_debug_string(const Initializer& init);

}  // namespace capstan::training

#endif  // CAPSTAN_LIB_TRAINING_INITIALIZER_H_
