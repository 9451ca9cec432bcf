// parse_example: tf.io.parse_example / parse_single_example for Capstan's
// tf.data engine.
//
// Glossary:
//   Example   a serialized tf.train.Example: a map from feature name to a
//             list of bytes, floats or int64s (lib/data/proto/example.proto)
//   FixedLen  a feature with a fixed number of values, parsed to a dense tensor
//   VarLen    a feature with any number of values, parsed to TF's SparseTensor,
//             here three components: indices, values, dense_shape
//
// Example: spec {"label": FixedLen int64 [], "tokens": VarLen string} on a
// vector of 2 Examples gives the components, in key order,
//   "label"               int64 [2]
//   "tokens/indices"      int64 [N, 2]   rows (example, position)
//   "tokens/values"       string [N]
//   "tokens/dense_shape"  int64 [2]      {2, the longest list's length}
// On a scalar (one Example) the batch dimension is dropped: "label" is int64
// [], indices are [N, 1] and dense_shape is [length].
//
// Semantics follow TensorFlow's fast parser: a feature whose list kind is not
// set counts as missing; a present FixedLen feature must have exactly the
// shape's number of values, even when it has a default; features that the
// spec does not name are ignored. (Where a serialized map repeats a key, the
// last entry wins, as protobuf's parser has it.)
//
// parse_example is a pure function: safe to call from many threads at once.
#ifndef CAPSTAN_LIB_DATA_OPS_EXAMPLE_H_
#define CAPSTAN_LIB_DATA_OPS_EXAMPLE_H_

#include "capstan/data/parsing.h"  // FixedLenFeature, VarLenFeature, FeatureSpec
#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::data {

// The spec types (capstan/data/parsing.h), as parse_example reads them:
//   FixedLenFeature  dtype int64, float32 or string; shape without negative
//                    dimensions; default_value, when given, has the dtype and
//                    the shape's number of elements (it is reshaped to
//                    `shape`, as TF's Python layer does); without one the
//                    feature is required.
//   VarLenFeature    dtype int64, float32 or string.
//
// Parses `serialized`, a kString scalar (one Example) or vector [B], into
// named components in the spec's key order (see above). Errors are
// InvalidArgument and name the feature ("Key: x") and the example's index in
// the batch ("Index: 3").
//
// Reads the wire format directly (ExampleWireParser, data/ops/example_wire.h).
Result<Element> parse_example(const Tensor& serialized, const FeatureSpec& spec);

// The same through protobuf's generated parser: slower, kept as the reference
// the tests and benchmarks compare parse_example with. Same results, same
// errors.
Result<Element> parse_example_reference(const Tensor& serialized, const FeatureSpec& spec);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_OPS_EXAMPLE_H_
