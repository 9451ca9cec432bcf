// Tensor and Element: the values that datasets yield, closures take and
// return, and variables hold.
//
// A Tensor is a dtype, a shape and a row-major contiguous buffer. Copying a
// Tensor is cheap: copies share the buffer (like tf.Tensor handles). A tensor
// that arrived over RPC may share the memory of the message it came in.
//
// String tensors keep their bytes in the same single buffer: (n + 1) uint64
// offsets followed by the concatenated bytes, so element i is
// bytes[offsets[i], offsets[i+1]). This keeps every tensor one contiguous
// blob on the wire.
//
// Thread-safety: a Tensor may be read from many threads at once; writing
// through mutable_data()/mutable_flat() while others read is the caller's
// business, as with TensorFlow.
#ifndef CAPSTAN_TENSOR_H_
#define CAPSTAN_TENSOR_H_

#include "capstan/export.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"

namespace capstan CAPSTAN_API {

enum class DType : uint8_t {
  kInvalid = 0,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kBool,
  kString,
};

// "float32", "int64", "string", ... (TensorFlow's names).
std::string_view dtype_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);
// Bytes per element; 0 for kString (variable length) and kInvalid.
size_t dtype_size(DType dtype);

// IEEE half and bfloat16 are stored as their 16 bits.
struct Float16 {
  uint16_t bits = 0;
  static Float16 from_float(float value);
  float to_float() const;
};
struct BFloat16 {
  uint16_t bits = 0;
  static BFloat16 from_float(float value);  // round to nearest even
  float to_float() const;
};

template <typename T>
struct DTypeOf;
template <> struct DTypeOf<Float16> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kInt8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::kInt16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };

// Freed tensor buffers of 1 MiB and more are kept for reuse (fresh large
// allocations fault their pages in one by one, which halves transfer speed).
// This sets how many bytes of them the process keeps; 0 disables the cache.
// Default: 1 GiB.
void set_buffer_cache_limit(size_t bytes);

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar); -1 if a dimension is negative
// or the product overflows.
int64_t shape_num_elements(const Shape& shape);
// "[2, 3]"; "[]" for a scalar.
std::string shape_string(const Shape& shape);

class Tensor {
 public:
  // An invalid tensor (dtype kInvalid); what a default-constructed slot holds.
  Tensor() = default;

  // A zero-filled tensor (empty strings for kString).
  static Result<Tensor> zeros(DType dtype, Shape shape);
  // A tensor whose bytes are not initialized (not for kString); the fastest
  // way to get a buffer that will be overwritten.
  static Result<Tensor> uninitialized(DType dtype, Shape shape);
  // Copies `values` into a new tensor of `shape` (sizes must match).
  template <typename T>
  static Result<Tensor> from_vector(const std::vector<T>& values, Shape shape);
  template <typename T>
  static Tensor scalar(T value) {
    return *from_vector<T>(std::vector<T>{value}, Shape{});
  }
  static Result<Tensor> from_strings(const std::vector<std::string>& values, Shape shape);
  // Wraps `size` bytes at `data` without copying; `owner` keeps them alive.
  // The bytes must be laid out as described above for the dtype.
  static Result<Tensor> from_buffer(DType dtype, Shape shape, std::shared_ptr<void> owner,
                                    std::byte* data, size_t size);

  bool valid() const { return dtype_ != DType::kInvalid; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t num_elements() const { return num_elements_; }
  // Size of the buffer in bytes (for kString: offsets plus string bytes).
  size_t byte_size() const { return size_; }
  const std::byte* data() const { return data_.get(); }
  std::byte* mutable_data() { return data_.get(); }

  // Typed views; throw std::logic_error when T does not match dtype().
  template <typename T>
  std::span<const T> flat() const {
    check_type(DTypeOf<T>::value);
    return {reinterpret_cast<const T*>(data_.get()), static_cast<size_t>(num_elements_)};
  }
  template <typename T>
  std::span<T> mutable_flat() {
    check_type(DTypeOf<T>::value);
    return {reinterpret_cast<T*>(data_.get()), static_cast<size_t>(num_elements_)};
  }
  // Element i of a kString tensor.
  std::string_view string_at(int64_t i) const;

  // Same dtype, shape and bytes.
  bool equals(const Tensor& other) const;
  // "float32[2, 3] {1, 2, 3, 4, 5, 6}", at most `max_values` values shown.
  std::string debug_string(size_t max_values = 8) const;

  // Checks that the buffer is consistent with dtype and shape (for tensors
  // built from untrusted bytes): size matches, string offsets are in range
  // and non-decreasing.
  Status validate() const;

 private:
  void check_type(DType wanted) const;
  static Result<Tensor> allocate(DType dtype, Shape shape, size_t size, bool zero);

  DType dtype_ = DType::kInvalid;
  Shape shape_;
  int64_t num_elements_ = 0;
  size_t size_ = 0;
  std::shared_ptr<std::byte> data_;
};

// A tuple of tensors: what a dataset yields and a closure takes or returns.
// `names` is empty or names each component.
struct Element {
  std::vector<Tensor> components;
  std::vector<std::string> names;

  size_t size() const { return components.size(); }
  // Total bytes of all component buffers.
  size_t byte_size() const;
  bool equals(const Element& other) const;
};

template <typename T>
Result<Tensor> Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  int64_t n = shape_num_elements(shape);
  if (n < 0 || static_cast<size_t>(n) != values.size()) {
    return Status::InvalidArgument("from_vector: " + std::to_string(values.size()) +
                                   " values do not fill shape " + shape_string(shape));
  }
  auto tensor = uninitialized(DTypeOf<T>::value, std::move(shape));
  if (!tensor.ok()) return tensor;
  auto out = tensor->template mutable_flat<T>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return tensor;
}

}  // namespace capstan

#endif  // CAPSTAN_TENSOR_H_
