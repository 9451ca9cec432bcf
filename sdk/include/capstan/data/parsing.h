// Specifications of the built-in parsing functions (tf.io.decode_csv and
// tf.io.parse_example), used with Fn::decode_csv() and Fn::parse_example().
#ifndef CAPSTAN_DATA_PARSING_H_
#define CAPSTAN_DATA_PARSING_H_

#include "capstan/export.h"

#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "capstan/tensor.h"

namespace capstan CAPSTAN_API {
namespace data {

// tf.io.decode_csv: one output column per record default.
struct CsvSpec {
  // Per column: a scalar of the column's dtype (its default value), or a
  // 0-element tensor of that dtype meaning the field is required. Dtypes:
  // int32, int64, float32, float64, string.
  std::vector<Tensor> record_defaults;
  std::string field_delim = ",";  // one character
  bool use_quote_delim = true;    // RFC 4180 quoting; "" escapes a quote
  std::string na_value;           // a field with this text counts as missing
  std::vector<int64_t> select_cols;  // sorted and unique; empty means all
  // Capstan extension: strip spaces around each field (files such as UCI
  // adult.data separate fields with ", ").
  bool trim_whitespace = false;
};

// tf.io.FixedLenFeature: dtype int64, float32 or string.
struct FixedLenFeature {
  DType dtype = DType::kFloat32;
  Shape shape;
  std::optional<Tensor> default_value;
};

// tf.io.VarLenFeature: parsed into three components, "<key>/indices" (int64
// [N, rank]), "<key>/values" ([N]) and "<key>/dense_shape" (int64 [rank]),
// TensorFlow's SparseTensor.
struct VarLenFeature {
  DType dtype = DType::kFloat32;
};

// Feature key -> how to parse it; outputs come in key order.
using FeatureSpec = std::map<std::string, std::variant<FixedLenFeature, VarLenFeature>>;

}  // namespace data
}  // namespace capstan

#endif  // CAPSTAN_DATA_PARSING_H_
