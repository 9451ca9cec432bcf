// The optimizers, one implementation for the parameter servers (variables
// updated where they live) and for mirrored variables (every replica applies
// the all-reduced gradient): their configuration, the slots each keeps, and
// the in-place update rules for dense and sparse gradients.
//
// The rules are those of TensorFlow 2's Keras optimizers for dense gradients
// (tf.keras.optimizers.SGD / Adagrad / Adam / Ftrl, which call the
// ResourceApply* kernels of tensorflow/core/kernels/training_ops.cc):
//
//   sgd       w -= lr * g
//   momentum  velocity = momentum * velocity - lr * g                (slot "momentum")
//             w += velocity;  nesterov: w += momentum * velocity - lr * g
//   adagrad   accumulator += g^2                                     (slot "accumulator",
//             w -= lr * g / (sqrt(accumulator) + epsilon)             initially
//                                                                     initial_accumulator_value)
//   adam      lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)        (slots "m", "v")
//             m = beta_1 * m + (1 - beta_1) * g
//             v = beta_2 * v + (1 - beta_2) * g^2
//             w -= lr_t * m / (sqrt(v) + epsilon)
//   ftrl      ApplyFtrlV2, with Keras' l2' = l2 + beta / (2 * lr):   (slots "accumulator",
//             g_s = g + 2 * l2_shrinkage * w                          initially
//             new_acc = accumulator + g^2                             initial_accumulator_value,
//             linear += g_s - (new_acc^-p - accumulator^-p) / lr * w  and "linear", initially 0;
//             w = |linear| > l1 ? (sign(linear) * l1 - linear)        p = learning_rate_power)
//                                 / (new_acc^-p / lr + 2 * l2') : 0
//             accumulator = new_acc
//
// t is the 1-based step of the update (see VariableStore::apply_dense), and
// lr is the optimizer's schedule at t - 1 (learning_rate_at in
// capstan/training.h: Keras evaluates it at iterations, the updates before
// this one); FTRL's beta term and Adam's lr_t use that rate too, as Keras'
// _decayed_lr feeds them. An update given a learning-rate override
// (`learning_rate` below: ApplyOptions in capstan/training.h, a rate set
// from outside, as Keras' optimizer.learning_rate = r) uses it as lr
// instead of the schedule's, and is then exactly the update of an optimizer
// created with rate r (at the same step: Adam's bias correction is the
// step's).
// Sparse gradients (ids + rows) follow TF's sparse resource ops; see
// apply_sparse_update().
//
// The math runs in double and is rounded to the variable's type (float32 or
// float64) when stored; TF computes in the variable's type, so float32 results
// may differ from TF's in the last bit.
//
// Thread-safety: the functions are stateless; the caller serializes updates
// to one variable (VariableStore holds the shard's mutex).
#ifndef CAPSTAN_LIB_TRAINING_OPTIMIZER_H_
#define CAPSTAN_LIB_TRAINING_OPTIMIZER_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "capstan/training.h"

namespace capstan::training {

// Checks the fields the kind uses (others are ignored): learning_rate > 0
// (all but none); momentum in [0, 1); epsilon > 0 (adagrad, adam);
// initial_accumulator_value >= 0 (adagrad, ftrl); beta_1, beta_2 in [0, 1);
// learning_rate_power <= 0, l1, l2, l2_shrinkage, beta >= 0 (ftrl). NaN and
// infinities are rejected. Then the schedule (kinds but none): decay_steps
// > 0 (exponential, cosine); decay_rate > 0 (exponential); values one more
// than boundaries, boundaries increasing from >= 0, values > 0 and
// learning_rate == values[0] (piecewise); alpha in [0, 1], and > 0 for
// ftrl, which divides by the rate (cosine). InvalidArgument naming the
// field and the value: "optimizer adam: beta_1 must be in [0, 1), got 1.5",
// "optimizer adam: cosine_decay schedule: decay_steps must be > 0, got 0".
Status validate(const Optimizer& config);

// "adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-07)": the
// fields the kind uses, for messages and logs, and a schedule other than
// constant: ", schedule=cosine_decay(decay_steps=1000, alpha=0))".
std::string optimizer_debug_string(const Optimizer& config);

// Checks a learning-rate override (ApplyOptions::learning_rate): finite and
// >= 0 (0 leaves the variable where it is: sgd, momentum's new velocity,
// adagrad, adam; ftrl skips the whole update). InvalidArgument naming it:
// "learning_rate override must be finite and >= 0, got nan".
Status validate_learning_rate_override(double learning_rate);

// The slots the kind keeps, in a fixed order (Keras' names): none, sgd: {};
// momentum: {"momentum"}; adagrad: {"accumulator"}; adam: {"m", "v"};
// ftrl: {"accumulator", "linear"}.
std::vector<std::string> slot_names(Optimizer::Kind kind);
// The value every element of slot `index` (in slot_names() order) starts at:
// initial_accumulator_value for "accumulator", 0 otherwise.
double slot_initial_value(const Optimizer& config, size_t index);

// Updates `var` in place by `gradient` (same number of elements), and the
// slots, which are given in slot_names() order, each with var's size.
// T is float or double. `learning_rate`: the override, if any (see above).
// Preconditions (the caller checks them; they are asserted here):
// validate(config) is OK, kind is not kNone, step >= 1, and
// validate_learning_rate_override(*learning_rate) is OK.
template <typename T>
void apply_dense_update(const Optimizer& config, int64_t step, std::span<T> var,
                        std::span<const std::span<T>> slots, std::span<const T> gradient,
                        std::optional<double> learning_rate = std::nullopt);

// Updates the rows of `var` (viewed as [var.size() / row_size, row_size])
// named by `ids`; `rows` holds one gradient row per id ([ids.size(),
// row_size]). Preconditions as for apply_dense_update(), plus row_size >= 1,
// var.size() a multiple of row_size and every id in range.
//
// As TF's Keras optimizers do (_deduplicate_indexed_slices before
// _resource_apply_sparse), the rows of a repeated id are summed first, so an
// id listed twice is one update with the summed gradient, not two updates.
// Then, as TF's ResourceSparseApply* kernels do, sgd, momentum, adagrad and
// ftrl touch only the rows named (and the same rows of their slots): an
// untouched row keeps its value, its momentum and its accumulator.
// Adam follows tf.compat.v1 AdamOptimizer._apply_sparse (which Keras'
// OptimizerV2 Adam kept): m and v of every row decay (m *= beta_1, v *=
// beta_2), the named rows add (1 - beta_1) * g and (1 - beta_2) * g^2, and
// then every row of var moves by lr_t * m / (sqrt(v) + epsilon), so rows with
// momentum left from earlier steps keep moving. This keeps sparse Adam equal
// to dense Adam with a gradient that is zero outside the named rows.
template <typename T>
void apply_sparse_update(const Optimizer& config, int64_t step, int64_t row_size,
                         std::span<T> var, std::span<const std::span<T>> slots,
                         std::span<const int64_t> ids, std::span<const T> rows,
                         std::optional<double> learning_rate = std::nullopt);

extern template void apply_dense_update<float>(const Optimizer&, int64_t, std::span<float>,
                                               std::span<const std::span<float>>,
                                               std::span<const float>, std::optional<double>);
extern template void apply_dense_update<double>(const Optimizer&, int64_t,
                                                std::span<double>,
                                                std::span<const std::span<double>>,
                                                std::span<const double>, std::optional<double>);
extern template void apply_sparse_update<float>(const Optimizer&, int64_t, int64_t,
                                                std::span<float>,
                                                std::span<const std::span<float>>,
                                                std::span<const int64_t>, std::span<const float>,
                                                std::optional<double>);
extern template void apply_sparse_update<double>(const Optimizer&, int64_t, int64_t,
                                                 std::span<double>,
                                                 std::span<const std::span<double>>,
                                                 std::span<const int64_t>,
                                                 std::span<const double>, std::optional<double>);

}  // namespace capstan::training

#endif  // CAPSTAN_LIB_TRAINING_OPTIMIZER_H_
