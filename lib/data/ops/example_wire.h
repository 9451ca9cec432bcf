// Reading tf.train.Example straight from the protobuf wire format.
//
// parse_example's fast path: ExampleWireParser walks the serialized bytes
// once and keeps, for each feature the spec names, that feature's values in
// reusable buffers; it builds no Example message and no map. It accepts and
// refuses exactly what protobuf's generated parser for
// lib/data/proto/example.proto does (the tests compare the two on every
// shared test file and on generated and damaged Examples):
//
//   - every byte is checked, features the spec does not name included;
//   - a field of an unexpected number or wire type is skipped as an unknown
//     field (groups too, to a nesting depth of 100); wire types 6 and 7, a
//     field number 0, a stray end-group tag, a varint over 10 bytes or a
//     length past the end make the Example invalid;
//   - `features` given twice merge; a key given twice: the last entry wins;
//     an entry's `value` given twice merges; every key given must be valid
//     UTF-8, even one a later key in the same entry replaces;
//   - a Feature whose list kind changes keeps only the last kind's values;
//     the same kind given twice appends; float and int64 values may be
//     packed or not (a packed float run must be a multiple of 4 bytes).
//
// Thread-compatible: one parser per thread (parse_example makes one per call).
#ifndef CAPSTAN_LIB_DATA_OPS_EXAMPLE_WIRE_H_
#define CAPSTAN_LIB_DATA_OPS_EXAMPLE_WIRE_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "capstan/tensor.h"

namespace capstan::data {

// One Feature's values. String values point into the serialized Example (or
// the reference parser's message) and live as long as it does.
//
// A FixedLen numeric feature's values may go straight to their row of the
// output tensor instead (set_row): then, while the list's kind is the row's
// dtype, they are written there (at most the row's capacity; `count` keeps
// counting) and the vectors stay empty.
struct FeatureValues {
  DType dtype = DType::kInvalid;  // kInvalid: absent, or no list kind set
  int64_t count = 0;              // values of `dtype`
  std::vector<int64_t> int64s;
  std::vector<float> floats;
  std::vector<std::string_view> bytes;

  DType row_dtype = DType::kInvalid;
  std::byte* row = nullptr;
  int64_t row_capacity = 0;

  bool in_row() const { return row != nullptr && dtype == row_dtype; }
  // Keeps the buffers' capacity and the row.
  void clear() {
    dtype = DType::kInvalid;
    count = 0;
    int64s.clear();
    floats.clear();
    bytes.clear();
  }
};

class ExampleWireParser {
 public:
  // `keys`: the feature names wanted; they must outlive the parser.
  explicit ExampleWireParser(const std::vector<std::string_view>& keys);

  // Parses one serialized Example. False when the bytes are not a valid
  // Example; otherwise values(i) holds the feature named keys[i] (dtype
  // kInvalid when absent).
  bool parse(std::string_view bytes);
  const FeatureValues& values(size_t i) const { return values_[i]; }

  // Where the next parse() writes key i's values when they are of `dtype`:
  // `capacity` values at `row` (see FeatureValues).
  void set_row(size_t i, DType dtype, std::byte* row, int64_t capacity) {
    values_[i].row_dtype = dtype;
    values_[i].row = row;
    values_[i].row_capacity = capacity;
  }

 private:
  bool parse_features(std::string_view body, int depth);
  bool parse_entry(std::string_view body, int depth);

  // Which wanted key, if any, `key` is (-1: none): an open-addressing table
  // with a cheap hash, cheaper for a handful of short keys than
  // std::unordered_map (whose lookup divides and chases a node).
  int64_t find_key(std::string_view key) const;

  struct Slot {
    std::string_view key;
    int64_t index = -1;  // -1: empty
  };
  std::vector<Slot> slots_;  // a power of two, at least twice the keys
  std::vector<FeatureValues> values_;
  std::vector<std::string_view> entry_values_;  // scratch for parse_entry
};

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_OPS_EXAMPLE_WIRE_H_
