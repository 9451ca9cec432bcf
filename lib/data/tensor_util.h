// Tensor utilities behind the tf.data engine's batching ops: batch
// (stack, batch_elements), padded_batch (pad_and_stack), unbatch and
// from_tensor_slices (unstack, slice_rows), rebatch (concat_rows) and cast.
//
// Fixed-size dtypes are moved with memcpy in the largest contiguous runs the
// layouts allow; string tensors are rebuilt in one pass (offsets rebased,
// bytes copied run by run), never through per-element std::string copies.
//
// Errors are InvalidArgument, with TensorFlow-like messages: they come from
// the user's data or pipeline definition, and retrying cannot help. Element
// and part indices in messages are 0-based.
//
// Thread-safety: the functions are stateless and may run concurrently; the
// input tensors must not be written to while they run.
#ifndef CAPSTAN_LIB_DATA_TENSOR_UTIL_H_
#define CAPSTAN_LIB_DATA_TENSOR_UTIL_H_

#include <cstdint>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::data {

// tf.stack / batch: rows of one dtype and shape into a tensor of shape
// [rows.size()] + row shape (scalars give [n]). Needs at least one row; no
// row may be null. `component` only names the component in error messages:
// "Cannot batch tensors with different shapes in component 0. First element
// had shape [3] and element 2 had shape [4]."
Result<Tensor> stack(const std::vector<const Tensor*>& rows, int component = 0);

// batch: stacks component i of every element into component i of the result.
// All elements must have the same number of components; the result keeps the
// names of the first element. Needs at least one element.
Result<Element> batch_elements(const std::vector<Element>& elements);

// padded_batch: rows of one dtype and rank, possibly of different shapes,
// each padded at the end of every dimension with `padding_value` into a
// tensor of shape [rows.size()] + the resolved padded shape.
//
// `padded_shape` has the rows' rank. Each dimension is a fixed size (>= 0; a
// row larger than it is an error) or -1: the largest row of this batch in
// that dimension. `padding_value` is a scalar of the rows' dtype (see
// default_padding()).
Result<Tensor> pad_and_stack(const std::vector<const Tensor*>& rows, const Shape& padded_shape,
                             const Tensor& padding_value, int component = 0);

// Rows [begin, end) of `t` along dimension 0; needs rank >= 1 and
// 0 <= begin <= end <= dim 0.
//
// For fixed-size dtypes the result aliases t's buffer without copying and
// keeps all of it alive; as with any Tensor copy, writes through one are seen
// through the other. Such a slice is aligned to its element size only, not to
// the 64 bytes of a fresh buffer. String slices are copies (a string tensor's
// offsets must start at its own buffer).
Result<Tensor> slice_rows(const Tensor& t, int64_t begin, int64_t end);

// from_tensor_slices / unbatch: the dim(0) rows of `t` (rank >= 1), each of
// shape t.shape()[1:]. Rows alias t's buffer as slice_rows() does.
Result<std::vector<Tensor>> unstack(const Tensor& t);

// rebatch: concatenation along dimension 0 of parts of one dtype whose
// dimensions after the first match (rank >= 1). Needs at least one part. A
// single part is returned as is (sharing its buffer).
Result<Tensor> concat_rows(const std::vector<const Tensor*>& parts);

// tf.cast between the numeric dtypes and bool; casting to the same dtype
// (string included) returns `t` itself, sharing its buffer.
//   - to bool: x != 0 (NaN is true); from bool: 0 or 1.
//   - float16 / bfloat16 convert through float32 (round to nearest even).
//   - integer to integer: C++ static_cast, so narrowing wraps (300 -> int8 44).
//   - floating to integer: truncation toward zero like static_cast; where
//     static_cast is undefined the result is defined here: out-of-range
//     values saturate to the target's min / max and NaN becomes 0.
// Casting string to or from anything else is an error ("Cast string to
// float32 is not supported").
Result<Tensor> cast(const Tensor& t, DType to);

// The scalar padded_batch pads with when the user gives none: 0, false or "".
Result<Tensor> default_padding(DType dtype);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_TENSOR_UTIL_H_
