#include "data/string_builder.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

namespace capstan::data {

StringTensorBuilder::StringTensorBuilder(size_t expected) {
  offsets_.reserve(expected + 1);
  offsets_.push_back(0);
}

Result<Tensor> StringTensorBuilder::finish(Shape shape) const {
  size_t header = offsets_.size() * sizeof(uint64_t);
  size_t total = header + bytes_.size();
  // uint64_t words keep the offsets aligned.
  std::shared_ptr<uint64_t[]> buffer(new uint64_t[total / sizeof(uint64_t) + 1]);
  auto* data = reinterpret_cast<std::byte*>(buffer.get());
  std::memcpy(data, offsets_.data(), header);
  if (!bytes_.empty()) std::memcpy(data + header, bytes_.data(), bytes_.size());
  return Tensor::from_buffer(DType::kString, std::move(shape), std::move(buffer), data, total);
}

std::string quoted_prefix(std::string_view text, size_t max_bytes) {
  std::string out = "'";
  size_t n = std::min(text.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
      out += escaped;
    }
  }
  out += "'";
  return out;
}

}  // namespace capstan::data
