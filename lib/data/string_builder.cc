#include "data/string_builder.h"

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

}  // namespace capstan::data
