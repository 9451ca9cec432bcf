// StringTensorBuilder: gathers strings one by one and wraps them as a kString
// tensor, for ops that produce strings (decode_csv, parse_example); and how
// those parsers show the bytes they reject.
//
// The strings go into two flat buffers, the offsets and the bytes, so n
// strings cost a few allocations rather than n; finish() lays them out as
// capstan/tensor.h describes: (n + 1) uint64 offsets, then the bytes.
//
// Thread-safety: not thread-safe; each builder has one writer.
#ifndef CAPSTAN_LIB_DATA_STRING_BUILDER_H_
#define CAPSTAN_LIB_DATA_STRING_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::data {

class StringTensorBuilder {
 public:
  // `expected` strings are reserved for; more may be appended.
  explicit StringTensorBuilder(size_t expected = 0);

  void append(std::string_view s) {
    bytes_.append(s);
    offsets_.push_back(bytes_.size());
  }

  // A kString tensor of `shape` holding what was appended (one per element),
  // in a buffer of its own: the builder may be appended to or dropped after.
  Result<Tensor> finish(Shape shape) const;

 private:
  std::vector<uint64_t> offsets_;  // offsets_[0] == 0; one more per string
  std::string bytes_;
};

// The first `max_bytes` of `text` as the parsers' error messages show it: in
// single quotes, bytes outside printable ASCII (and the backslash) escaped as \xNN.
// Callers say how a longer text was cut short.
std::string quoted_prefix(std::string_view text, size_t max_bytes);

}  // namespace capstan::data

#endif  // CAPSTAN_LIB_DATA_STRING_BUILDER_H_
