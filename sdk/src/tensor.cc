#include "capstan/tensor.h"
#include "sync/mutex.h"

#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <sstream>

namespace capstan {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 12> kDTypes = {{
    {DType::kInvalid, "invalid", 0},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kUInt8, "uint8", 1},
    {DType::kBool, "bool", 1},
    {DType::kString, "string", 0},
}};

constexpr size_t kAlignment = 64;

constexpr size_t kLargeBuffer = 1u << 20;
// Below this, a buffer and its reference counts are one allocation.
constexpr size_t kSmallBuffer = 64u << 10;

// Large freed buffers are kept for reuse, up to a byte limit. A fresh large
// allocation is an mmap whose pages fault in one by one (about as slow as
// sending the bytes over loopback), so reusing warm buffers roughly doubles
// the speed of repeated large transfers. This cache is process-wide, like
// malloc's arenas that it sits on; see set_buffer_cache_limit().
class BufferCache {
 public:
  // A cached buffer of at least `*size` bytes (at most 1/8 more), or null.
  // Sets `*size` to the buffer's real size.
  void* take(size_t* size) LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(mutex_);
    auto it = free_.lower_bound(*size);
    if (it == free_.end() || it->first > *size + *size / 8) return nullptr;
    void* p = it->second;
    *size = it->first;
    cached_ -= it->first;
    free_.erase(it);
    return p;
  }
  void give(void* p, size_t size) LOCKS_EXCLUDED(mutex_) {
    {
      MutexLock lock(mutex_);
      while (!free_.empty() && cached_ + size > limit_) {
        auto victim = free_.begin();  // the smallest: cheapest to recreate
        cached_ -= victim->first;
        std::free(victim->second);
        free_.erase(victim);
      }
      if (cached_ + size <= limit_) {
        free_.emplace(size, p);
        cached_ += size;
        return;
      }
    }
    std::free(p);
  }
  void set_limit(size_t bytes) LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(mutex_);
    limit_ = bytes;
    while (!free_.empty() && cached_ > limit_) {
      auto victim = free_.begin();
      cached_ -= victim->first;
      std::free(victim->second);
      free_.erase(victim);
    }
  }

 private:
  Mutex mutex_;
  std::multimap<size_t, void*> free_ GUARDED_BY(mutex_);  // size -> buffer
  size_t cached_ GUARDED_BY(mutex_) = 0;
  size_t limit_ GUARDED_BY(mutex_) = size_t{1} << 30;
};

BufferCache& buffer_cache() {
  static auto* cache = new BufferCache();  // never destroyed: tensors may outlive main()
  return *cache;
}

// Buffers are 64-byte aligned so SIMD loops and NCCL may use them directly.
std::shared_ptr<std::byte> allocate_buffer(size_t size, bool zero) {
  if (size == 0) return nullptr;
  // Rounding up must not wrap to a tiny allocation.
  if (size > std::numeric_limits<size_t>::max() - (kLargeBuffer - 1)) throw std::bad_alloc();
  size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < kSmallBuffer) {
    // One plain allocation holds the reference counts and the bytes, aligned
    // by hand: aligned_alloc splits a larger chunk and frees the pieces, and
    // with a second allocation for the counts, that churn was most of the
    // time of pipelines of small elements (glibc consolidating the pieces).
    auto block = std::make_shared_for_overwrite<std::byte[]>(rounded + kAlignment - 1);
    const auto address = reinterpret_cast<uintptr_t>(block.get());
    std::byte* data = block.get() + (kAlignment - address % kAlignment) % kAlignment;
    if (zero) std::memset(data, 0, size);
    return std::shared_ptr<std::byte>(std::move(block), data);
  }
  void* p = nullptr;
  if (rounded >= kLargeBuffer) {
    rounded = (size + kLargeBuffer - 1) / kLargeBuffer * kLargeBuffer;
    p = buffer_cache().take(&rounded);
  }
  if (p == nullptr) p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (zero) std::memset(p, 0, size);
  if (rounded >= kLargeBuffer) {
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [rounded](std::byte* q) {
      buffer_cache().give(q, rounded);
    });
  }
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mantissa & 0x3ffu) << 13;
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exponent = (x >> 23) & 0xffu;
  uint32_t mantissa = x & 0x7fffffu;
  if (exponent == 0xff) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (mantissa != 0 ? 0x200u : 0));
  }
  int e = static_cast<int>(exponent) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (e <= 0) {                                                 // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | static_cast<uint32_t>(e) << 10 | mantissa >> 13;
  uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: correct
  return static_cast<uint16_t>(half);
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  auto index = static_cast<size_t>(dtype);
  return index < kDTypes.size() ? kDTypes[index].name : "invalid";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name && info.dtype != DType::kInvalid) return info.dtype;
  }
  if (name == "float") return DType::kFloat32;
  if (name == "double") return DType::kFloat64;
  if (name == "half") return DType::kFloat16;
  return std::nullopt;
}

void set_buffer_cache_limit(size_t bytes) { buffer_cache().set_limit(bytes); }

size_t dtype_size(DType dtype) {
  auto index = static_cast<size_t>(dtype);
  return index < kDTypes.size() ? kDTypes[index].size : 0;
}

Float16 Float16::from_float(float value) { return Float16{float_to_half(value)}; }
float Float16::to_float() const { return half_to_float(bits); }

BFloat16 BFloat16::from_float(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((x >> 16) | 0x40u)};
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((x + rounding) >> 16)};
}
float BFloat16::to_float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

int64_t shape_num_elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::string shape_string(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

Result<Tensor> Tensor::allocate(DType dtype, Shape shape, size_t size, bool zero) {
  Tensor t;
  t.dtype_ = dtype;
  t.num_elements_ = shape_num_elements(shape);
  t.shape_ = std::move(shape);
  t.size_ = size;
  t.data_ = allocate_buffer(size, zero);
  return t;
}

Result<Tensor> Tensor::uninitialized(DType dtype, Shape shape) {
  if (dtype == DType::kInvalid || dtype == DType::kString || dtype_size(dtype) == 0) {
    return Status::InvalidArgument("uninitialized: dtype must be a fixed-size type, not " +
                                   std::string(dtype_name(dtype)));
  }
  int64_t n = shape_num_elements(shape);
  if (n < 0) return Status::InvalidArgument("invalid shape " + shape_string(shape));
  if (static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / dtype_size(dtype)) {
    return Status::InvalidArgument("shape " + shape_string(shape) + " is too large");
  }
  return allocate(dtype, std::move(shape), static_cast<size_t>(n) * dtype_size(dtype), false);
}

Result<Tensor> Tensor::zeros(DType dtype, Shape shape) {
  if (dtype != DType::kString && dtype_size(dtype) == 0) {
    return Status::InvalidArgument("zeros: invalid dtype " +
                                   std::to_string(static_cast<int>(dtype)));
  }
  int64_t n = shape_num_elements(shape);
  if (n < 0) return Status::InvalidArgument("invalid shape " + shape_string(shape));
  // A string tensor of n empty strings is n + 1 zero offsets.
  uint64_t count = static_cast<uint64_t>(n) + (dtype == DType::kString ? 1 : 0);
  size_t elem = dtype == DType::kString ? sizeof(uint64_t) : dtype_size(dtype);
  if (count > std::numeric_limits<size_t>::max() / elem) {
    return Status::InvalidArgument("shape " + shape_string(shape) + " is too large");
  }
  return allocate(dtype, std::move(shape), static_cast<size_t>(count) * elem, true);
}

Result<Tensor> Tensor::from_strings(const std::vector<std::string>& values, Shape shape) {
  int64_t n = shape_num_elements(shape);
  if (n < 0 || static_cast<size_t>(n) != values.size()) {
    return Status::InvalidArgument("from_strings: " + std::to_string(values.size()) +
                                   " values do not fill shape " + shape_string(shape));
  }
  size_t header = (values.size() + 1) * sizeof(uint64_t);
  size_t total = header;
  for (const auto& v : values) total += v.size();
  auto t = allocate(DType::kString, std::move(shape), total, false);
  auto* offsets = reinterpret_cast<uint64_t*>(t->data_.get());
  std::byte* bytes = t->data_.get() + header;
  uint64_t pos = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    offsets[i] = pos;
    std::memcpy(bytes + pos, values[i].data(), values[i].size());
    pos += values[i].size();
  }
  offsets[values.size()] = pos;
  return t;
}

Result<Tensor> Tensor::from_buffer(DType dtype, Shape shape, std::shared_ptr<void> owner,
                                   std::byte* data, size_t size) {
  Tensor t;
  t.dtype_ = dtype;
  t.num_elements_ = shape_num_elements(shape);
  t.shape_ = std::move(shape);
  t.size_ = size;
  t.data_ = std::shared_ptr<std::byte>(std::move(owner), data);
  CAPSTAN_RETURN_IF_ERROR(t.validate());
  return t;
}

Status Tensor::validate() const {
  if (dtype_ == DType::kInvalid) return Status::InvalidArgument("tensor has no dtype");
  if (dtype_ != DType::kString && dtype_size(dtype_) == 0) {
    return Status::InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(dtype_)));
  }
  if (num_elements_ < 0) return Status::InvalidArgument("invalid shape " + shape_string(shape_));
  if (size_ > 0 && data_ == nullptr) return Status::InvalidArgument("tensor has no buffer");
  if (dtype_ != DType::kString) {
    size_t elem = dtype_size(dtype_);
    if (static_cast<uint64_t>(num_elements_) > std::numeric_limits<size_t>::max() / elem ||
        static_cast<size_t>(num_elements_) * elem != size_) {
      return Status::InvalidArgument(std::string(dtype_name(dtype_)) + shape_string(shape_) +
                                     " needs " + std::to_string(num_elements_ * elem) +
                                     " bytes, buffer has " + std::to_string(size_));
    }
    return Status::Ok();
  }
  size_t n = static_cast<size_t>(num_elements_);
  if (n >= std::numeric_limits<size_t>::max() / sizeof(uint64_t) - 1 ||
      size_ < (n + 1) * sizeof(uint64_t)) {
    return Status::InvalidArgument("string tensor of shape " + shape_string(shape_) +
                                   " has a buffer of " + std::to_string(size_) +
                                   " bytes, too small for its offsets");
  }
  const auto* offsets = reinterpret_cast<const uint64_t*>(data_.get());
  size_t bytes = size_ - (n + 1) * sizeof(uint64_t);
  if (offsets[0] != 0 || offsets[n] != bytes) {
    return Status::InvalidArgument("string tensor offsets do not cover its " +
                                   std::to_string(bytes) + " bytes");
  }
  for (size_t i = 0; i < n; ++i) {
    if (offsets[i] > offsets[i + 1]) {
      return Status::InvalidArgument("string tensor offset " + std::to_string(i + 1) +
                                     " goes backwards");
    }
  }
  return Status::Ok();
}

std::string_view Tensor::string_at(int64_t i) const {
  check_type(DType::kString);
  if (i < 0 || i >= num_elements_) {
    throw std::out_of_range("string_at(" + std::to_string(i) + ") on " +
                            std::to_string(num_elements_) + " strings");
  }
  const auto* offsets = reinterpret_cast<const uint64_t*>(data_.get());
  const char* bytes = reinterpret_cast<const char*>(data_.get()) +
                      (static_cast<size_t>(num_elements_) + 1) * sizeof(uint64_t);
  return {bytes + offsets[i], static_cast<size_t>(offsets[i + 1] - offsets[i])};
}

void Tensor::check_type(DType wanted) const {
  if (dtype_ != wanted) {
    throw std::logic_error("tensor of dtype " + std::string(dtype_name(dtype_)) +
                           " accessed as " + std::string(dtype_name(wanted)));
  }
}

bool Tensor::equals(const Tensor& other) const {
  if (dtype_ != other.dtype_ || shape_ != other.shape_ || size_ != other.size_) return false;
  return size_ == 0 || std::memcmp(data_.get(), other.data_.get(), size_) == 0;
}

std::string Tensor::debug_string(size_t max_values) const {
  std::ostringstream out;
  out << dtype_name(dtype_) << shape_string(shape_) << " {";
  size_t n = num_elements_ > 0 ? static_cast<size_t>(num_elements_) : 0;
  size_t shown = std::min(n, max_values);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out << ", ";
    const std::byte* p = data_.get();
    switch (dtype_) {
      case DType::kFloat16: out << Float16{reinterpret_cast<const uint16_t*>(p)[i]}.to_float(); break;
      case DType::kBFloat16: out << BFloat16{reinterpret_cast<const uint16_t*>(p)[i]}.to_float(); break;
      case DType::kFloat32: out << reinterpret_cast<const float*>(p)[i]; break;
      case DType::kFloat64: out << reinterpret_cast<const double*>(p)[i]; break;
      case DType::kInt8: out << static_cast<int>(reinterpret_cast<const int8_t*>(p)[i]); break;
      case DType::kInt16: out << reinterpret_cast<const int16_t*>(p)[i]; break;
      case DType::kInt32: out << reinterpret_cast<const int32_t*>(p)[i]; break;
      case DType::kInt64: out << reinterpret_cast<const int64_t*>(p)[i]; break;
      case DType::kUInt8: out << static_cast<int>(reinterpret_cast<const uint8_t*>(p)[i]); break;
      case DType::kBool: out << (reinterpret_cast<const uint8_t*>(p)[i] ? "true" : "false"); break;
      case DType::kString: out << '"' << string_at(static_cast<int64_t>(i)) << '"'; break;
      case DType::kInvalid: break;
    }
  }
  if (shown < n) out << (shown > 0 ? ", ..." : "...");
  out << "}";
  return out.str();
}

size_t Element::byte_size() const {
  size_t total = 0;
  for (const auto& t : components) total += t.byte_size();
  return total;
}

bool Element::equals(const Element& other) const {
  if (components.size() != other.components.size() || names != other.names) return false;
  for (size_t i = 0; i < components.size(); ++i) {
    if (!components[i].equals(other.components[i])) return false;
  }
  return true;
}

}  // namespace capstan
