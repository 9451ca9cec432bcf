// decode_csv: tf.io.decode_csv for Capstan's tf.data engine.
//
// Glossary:
//   record   one line of CSV text (no line terminator), one element of the
//            kString `records` tensor
//   column   a field's position in the record (0-based, counting every field)
//   field    an output position: column select_cols[f], or column f when
//            select_cols is empty; error messages count fields, as TF does
//
// Example: records ["1,a", "2,"] with record_defaults {int64 [] (required),
// string "?"} give two components: int64 [2] {1, 2} and string [2] {"a", "?"}.
//
// Semantics follow TensorFlow: RFC 4180 quoting ("" is an escaped quote
// inside a quoted field), a field that is empty or equals na_value takes the
// column's default, numbers may have spaces around them, a trailing delimiter
// ends with one more (empty) field, an empty record has no fields, and with
// select_cols the fields after the last selected column are not looked at.
// Capstan adds trim_whitespace.
//
// decode_csv is a pure function: safe to call from many threads at once.
#ifndef CAPSTAN_LIB_DATA_OPS_CSV_H_
#define CAPSTAN_LIB_DATA_OPS_CSV_H_

#include "capstan/data/parsing.h"  // CsvSpec
#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::data {

// CsvSpec (capstan/data/parsing.h), as decode_csv reads it:
//   record_defaults  one per output field: its dtype (int32, int64, float32,
//                    float64 or string) and default, a one-element tensor (a
//                    scalar, or TF's shape [1]); an empty tensor ([0]) makes
//                    the field required. At least one.
//   field_delim      exactly one character; not '"' when use_quote_delim.
//   use_quote_delim  RFC 4180 quotes; when false '"' is an ordinary character.
//   na_value         a field whose text equals it counts as missing (the
//                    empty field always does).
//   select_cols      columns to decode, strictly increasing, non-negative, one
//                    per record_defaults entry; empty means every column.
//   trim_whitespace  Capstan extension: drop spaces and tabs around each field
//                    (outside its quotes), for files like UCI adult.data whose
//                    delimiter is ", "; applies before the na_value comparison.
//
// Decodes `records` (a kString tensor of any shape) into one component per
// field, each with the shape of `records` and the dtype of its default. The
// components are unnamed. Errors are InvalidArgument and name the record
// (its index in row-major order), the field and the offending text.
Result<Element> decode_csv(const Tensor& records, const CsvSpec& spec);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_OPS_CSV_H_
