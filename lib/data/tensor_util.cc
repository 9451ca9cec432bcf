#include "data/tensor_util.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace capstan::data {
namespace {

std::string component_string(int component) { return "component " + std::to_string(component); }

std::string dtype_string(DType dtype) { return std::string(dtype_name(dtype)); }

// [n] + shape.
Shape prepend(int64_t n, const Shape& shape) {
  Shape out;
  out.reserve(shape.size() + 1);
  out.push_back(n);
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

// Elements per row of a tensor of `shape` (rank >= 1): the product of the
// dimensions after the first. Computed from the shape, as dim 0 may be 0.
int64_t row_elements(const Shape& shape) {
  return shape_num_elements(Shape(shape.begin() + 1, shape.end()));
}

// The string tensor layout of capstan/tensor.h: (n + 1) uint64 offsets, then
// the bytes; element i is bytes[offsets[i], offsets[i + 1]).
const uint64_t* string_offsets(const Tensor& t) {
  return reinterpret_cast<const uint64_t*>(t.data());
}
const char* string_bytes(const Tensor& t) {
  return reinterpret_cast<const char*>(t.data()) +
         (static_cast<size_t>(t.num_elements()) + 1) * sizeof(uint64_t);
}
// Bytes held by elements [begin, begin + count) of a string tensor.
uint64_t string_range_bytes(const Tensor& t, int64_t begin, int64_t count) {
  const uint64_t* offsets = string_offsets(t);
  return offsets[begin + count] - offsets[begin];
}

// Appends runs of elements of one fixed-size dtype, in row-major order, to a
// tensor allocated by the caller. "*out" must outlive the writer.
class FixedWriter {
 public:
  explicit FixedWriter(Tensor* out)
      : elem_(dtype_size(out->dtype())), next_(out->mutable_data()) {}

  // Appends elements [begin, begin + count) of `src` (same dtype).
  void copy(const Tensor& src, int64_t begin, int64_t count) {
    size_t bytes = static_cast<size_t>(count) * elem_;
    if (bytes == 0) return;
    std::memcpy(next_, src.data() + static_cast<size_t>(begin) * elem_, bytes);
    next_ += bytes;
  }

  // Appends `count` copies of the element whose bytes are at `value`.
  void fill(const std::byte* value, int64_t count) {
    size_t bytes = static_cast<size_t>(count) * elem_;
    if (bytes == 0) return;
    if (std::all_of(value, value + elem_, [](std::byte b) { return b == std::byte{0}; })) {
      std::memset(next_, 0, bytes);
    } else if (elem_ == 1) {
      std::memset(next_, std::to_integer<int>(*value), bytes);
    } else {
      // Doubling copies: log2(count) memcpy calls instead of count.
      std::memcpy(next_, value, elem_);
      size_t done = elem_;
      while (done < bytes) {
        size_t chunk = std::min(done, bytes - done);
        std::memcpy(next_ + done, next_, chunk);
        done += chunk;
      }
    }
    next_ += bytes;
  }

 private:
  const size_t elem_;
  std::byte* next_;
};

// Builds a string tensor of a known shape and total byte count: elements are
// appended in row-major order, then finish() wraps the buffer.
class StringWriter {
 public:
  static Result<StringWriter> create(Shape shape, uint64_t total_bytes) {
    int64_t n = shape_num_elements(shape);
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (n < 0 || static_cast<uint64_t>(n) >= kMax / sizeof(uint64_t)) {
      return Status::InvalidArgument("string tensor shape " + shape_string(shape) +
                                     " is too large");
    }
    uint64_t header = (static_cast<uint64_t>(n) + 1) * sizeof(uint64_t);
    if (total_bytes > kMax - header) {
      return Status::InvalidArgument("string tensor of shape " + shape_string(shape) + " with " +
                                     std::to_string(total_bytes) + " bytes is too large");
    }
    auto backing = Tensor::uninitialized(DType::kUInt8,
                                         Shape{static_cast<int64_t>(header + total_bytes)});
    if (!backing.ok()) return backing.status();
    return StringWriter(std::move(shape), n, *std::move(backing), header);
  }

  // Appends elements [begin, begin + count) of the string tensor `src`.
  void copy(const Tensor& src, int64_t begin, int64_t count) {
    if (count == 0) return;
    const uint64_t* in = string_offsets(src) + begin;
    // Rebase: in[j] - in[0] + pos_, computed modulo 2^64 so it cannot overflow.
    uint64_t shift = pos_ - in[0];
    for (int64_t j = 0; j < count; ++j) offsets_[next_ + j] = in[j] + shift;
    uint64_t bytes = in[count] - in[0];
    if (bytes > 0) std::memcpy(bytes_ + pos_, string_bytes(src) + in[0], bytes);
    next_ += count;
    pos_ += bytes;
  }

  // Appends `count` copies of `value`.
  void fill(std::string_view value, int64_t count) {
    for (int64_t j = 0; j < count; ++j) {
      offsets_[next_++] = pos_;
      if (!value.empty()) std::memcpy(bytes_ + pos_, value.data(), value.size());
      pos_ += value.size();
    }
  }

  // Precondition: exactly the shape's elements and total_bytes were appended.
  Result<Tensor> finish() {
    assert(next_ == num_elements_);
    offsets_[next_] = pos_;
    std::byte* data = backing_.mutable_data();
    size_t size = backing_.byte_size();
    // The uint8 tensor owns the buffer; the string tensor keeps it alive.
    return Tensor::from_buffer(DType::kString, std::move(shape_),
                               std::make_shared<Tensor>(std::move(backing_)), data, size);
  }

 private:
  StringWriter(Shape shape, int64_t num_elements, Tensor backing, uint64_t header)
      : shape_(std::move(shape)),
        num_elements_(num_elements),
        backing_(std::move(backing)),
        offsets_(reinterpret_cast<uint64_t*>(backing_.mutable_data())),
        bytes_(reinterpret_cast<char*>(backing_.mutable_data()) + header) {}

  Shape shape_;
  [[maybe_unused]] int64_t num_elements_;  // checked by assert only
  Tensor backing_;     // kUInt8, header + total bytes; its buffer never moves
  uint64_t* offsets_;  // into backing_
  char* bytes_;        // into backing_, after the offsets
  int64_t next_ = 0;   // elements appended so far
  uint64_t pos_ = 0;   // string bytes appended so far
};

// Fails unless `rows` is non-empty, holds no null or invalid tensor, and all
// rows have the dtype of the first.
Status check_rows(const std::vector<const Tensor*>& rows, int component) {
  if (rows.empty()) {
    return Status::InvalidArgument("Cannot batch zero tensors in " + component_string(component) +
                                   ".");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] == nullptr || !rows[i]->valid()) {
      return Status::InvalidArgument("Cannot batch tensors in " + component_string(component) +
                                     ": element " + std::to_string(i) +
                                     (rows[i] == nullptr ? " is null." : " has no dtype."));
    }
    if (rows[i]->dtype() != rows[0]->dtype()) {
      return Status::InvalidArgument(
          "Cannot batch tensors with different dtypes in " + component_string(component) +
          ". First element had dtype " + dtype_string(rows[0]->dtype()) + " and element " +
          std::to_string(i) + " had dtype " + dtype_string(rows[i]->dtype()) + ".");
    }
  }
  return Status::Ok();
}

// How one row of shape `row` lays out inside the padded row shape `target`
// (same rank): dimensions after block_dim match, so each index in dims
// [0, block_dim) selects one contiguous run of row[block_dim] * stride
// elements, followed by its padding. block_dim is -1 when row == target.
struct PaddedLayout {
  PaddedLayout(const Shape& row_shape, const Shape& target_shape)
      : row(row_shape), target(target_shape), row_stride(row.size()), target_stride(row.size()) {
    int64_t r = 1;
    int64_t t = 1;
    for (int d = static_cast<int>(row.size()) - 1; d >= 0; --d) {
      row_stride[d] = r;
      target_stride[d] = t;
      r *= row[d];
      t *= target[d];
      if (block_dim < 0 && row[d] != target[d]) block_dim = d;
    }
  }

  const Shape& row;
  const Shape& target;
  std::vector<int64_t> row_stride;     // elements per step in dim d of the row
  std::vector<int64_t> target_stride;  // elements per step in dim d of the target
  int block_dim = -1;
};

// Appends `src` (shaped layout.row) padded to layout.target, in row-major
// order, starting at dimension d and source element src_begin.
template <typename Writer, typename Pad>
void write_padded(const PaddedLayout& layout, int d, int64_t src_begin, const Tensor& src,
                  const Pad& pad, Writer& out) {
  const int64_t rows = layout.row[d];
  const int64_t padding = (layout.target[d] - rows) * layout.target_stride[d];
  if (d == layout.block_dim) {
    out.copy(src, src_begin, rows * layout.row_stride[d]);
  } else {
    for (int64_t i = 0; i < rows; ++i) {
      write_padded(layout, d + 1, src_begin + i * layout.row_stride[d], src, pad, out);
    }
  }
  out.fill(pad, padding);
}

template <typename Writer, typename Pad>
void write_padded_row(const Tensor& src, const Shape& target, const Pad& pad, Writer& out) {
  PaddedLayout layout(src.shape(), target);
  if (layout.block_dim < 0) {
    out.copy(src, 0, src.num_elements());
  } else {
    write_padded(layout, 0, 0, src, pad, out);
  }
}

// Rows [begin, end) of `*owner` (a fixed-size dtype, rank >= 1), shaped
// `shape` (same number of elements), sharing its buffer; the result holds
// `owner`, which keeps that buffer alive.
Result<Tensor> alias_rows(const std::shared_ptr<Tensor>& owner, int64_t begin, int64_t end,
                          Shape shape) {
  const size_t row_bytes =
      static_cast<size_t>(row_elements(owner->shape())) * dtype_size(owner->dtype());
  std::byte* data = owner->mutable_data();
  if (data != nullptr) data += static_cast<size_t>(begin) * row_bytes;
  return Tensor::from_buffer(owner->dtype(), std::move(shape), owner, data,
                             static_cast<size_t>(end - begin) * row_bytes);
}

// Rows [begin, end) of a string tensor (rank >= 1), copied into a tensor of
// `shape` (same number of elements).
Result<Tensor> copy_string_rows(const Tensor& t, int64_t begin, int64_t end, Shape shape) {
  const int64_t per_row = row_elements(t.shape());
  const int64_t first = begin * per_row;
  const int64_t count = (end - begin) * per_row;
  CAPSTAN_ASSIGN_OR_RETURN(
      StringWriter out, StringWriter::create(std::move(shape), string_range_bytes(t, first, count)));
  out.copy(t, first, count);
  return out.finish();
}

// ---- cast ----

template <typename T>
struct Tag {
  using type = T;
};

// Calls fn(Tag<T>{}) for the element type T of a numeric or bool dtype;
// returns false for string and invalid.
template <typename Fn>
bool visit_numeric(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16: fn(Tag<Float16>{}); return true;
    case DType::kBFloat16: fn(Tag<BFloat16>{}); return true;
    case DType::kFloat32: fn(Tag<float>{}); return true;
    case DType::kFloat64: fn(Tag<double>{}); return true;
    case DType::kInt8: fn(Tag<int8_t>{}); return true;
    case DType::kInt16: fn(Tag<int16_t>{}); return true;
    case DType::kInt32: fn(Tag<int32_t>{}); return true;
    case DType::kInt64: fn(Tag<int64_t>{}); return true;
    case DType::kUInt8: fn(Tag<uint8_t>{}); return true;
    case DType::kBool: fn(Tag<bool>{}); return true;
    case DType::kString:
    case DType::kInvalid: return false;
  }
  return false;
}

// How an element of type T sits in the buffer. Bools are read as bytes so
// that a byte other than 0 or 1 (from the wire) is not undefined behaviour.
template <typename T>
using Storage = std::conditional_t<
    std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>, uint16_t,
    std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>>;

// The stored element as a C++ arithmetic value.
template <typename T>
auto load(Storage<T> stored) {
  if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
    return T{stored}.to_float();
  } else if constexpr (std::is_same_v<T, bool>) {
    return stored != 0;
  } else {
    return stored;
  }
}

// Truncation toward zero, saturating where static_cast would be undefined.
template <typename I, typename F>
I float_to_int(F value) {
  if (std::isnan(value)) return 0;
  constexpr double kLow = static_cast<double>(std::numeric_limits<I>::min());
  // max + 1, a power of two (for int64, max rounds up to 2^63 already).
  constexpr double kHighExclusive = static_cast<double>(std::numeric_limits<I>::max()) + 1.0;
  const double v = static_cast<double>(value);
  if (v <= kLow) return std::numeric_limits<I>::min();
  if (v >= kHighExclusive) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

template <typename To, typename V>
Storage<To> convert(V value) {
  if constexpr (std::is_same_v<To, bool>) {
    return value != V(0) ? 1 : 0;
  } else if constexpr (std::is_same_v<To, Float16> || std::is_same_v<To, BFloat16>) {
    return To::from_float(static_cast<float>(value)).bits;
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<V>) {
    return float_to_int<To>(value);
  } else {
    return static_cast<To>(value);
  }
}

template <typename From, typename To>
void cast_elements(const std::byte* in, std::byte* out, size_t n) {
  const auto* src = reinterpret_cast<const Storage<From>*>(in);
  auto* dst = reinterpret_cast<Storage<To>*>(out);
  for (size_t i = 0; i < n; ++i) dst[i] = convert<To>(load<From>(src[i]));
}

}  // namespace

Result<Tensor> stack(const std::vector<const Tensor*>& rows, int component) {
  CAPSTAN_RETURN_IF_ERROR(check_rows(rows, component));
  const Tensor& first = *rows[0];
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i]->shape() != first.shape()) {
      return Status::InvalidArgument(
          "Cannot batch tensors with different shapes in " + component_string(component) +
          ". First element had shape " + shape_string(first.shape()) + " and element " +
          std::to_string(i) + " had shape " + shape_string(rows[i]->shape()) + ".");
    }
  }
  Shape shape = prepend(static_cast<int64_t>(rows.size()), first.shape());
  if (first.dtype() == DType::kString) {
    uint64_t total = 0;
    for (const Tensor* row : rows) total += string_range_bytes(*row, 0, row->num_elements());
    CAPSTAN_ASSIGN_OR_RETURN(StringWriter out, StringWriter::create(std::move(shape), total));
    for (const Tensor* row : rows) out.copy(*row, 0, row->num_elements());
    return out.finish();
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(first.dtype(), std::move(shape)));
  FixedWriter writer(&out);
  for (const Tensor* row : rows) writer.copy(*row, 0, row->num_elements());
  return out;
}

Result<Element> batch_elements(const std::vector<Element>& elements) {
  if (elements.empty()) return Status::InvalidArgument("Cannot batch zero elements.");
  const size_t num_components = elements[0].size();
  for (size_t i = 1; i < elements.size(); ++i) {
    if (elements[i].size() != num_components) {
      return Status::InvalidArgument(
          "Cannot batch elements with different numbers of components. First element had " +
          std::to_string(num_components) + " and element " + std::to_string(i) + " had " +
          std::to_string(elements[i].size()) + ".");
    }
  }
  Element batch;
  batch.names = elements[0].names;
  batch.components.reserve(num_components);
  std::vector<const Tensor*> rows(elements.size());
  for (size_t c = 0; c < num_components; ++c) {
    for (size_t i = 0; i < elements.size(); ++i) rows[i] = &elements[i].components[c];
    CAPSTAN_ASSIGN_OR_RETURN(Tensor stacked, stack(rows, static_cast<int>(c)));
    batch.components.push_back(std::move(stacked));
  }
  return batch;
}

Result<Tensor> pad_and_stack(const std::vector<const Tensor*>& rows, const Shape& padded_shape,
                             const Tensor& padding_value, int component) {
  CAPSTAN_RETURN_IF_ERROR(check_rows(rows, component));
  const DType dtype = rows[0]->dtype();
  if (padding_value.dtype() != dtype) {
    return Status::InvalidArgument("Padding value for " + component_string(component) +
                                   " has dtype " + dtype_string(padding_value.dtype()) +
                                   ", but the elements have dtype " + dtype_string(dtype) + ".");
  }
  if (padding_value.rank() != 0) {
    return Status::InvalidArgument("Padding value for " + component_string(component) +
                                   " must be a scalar, got shape " +
                                   shape_string(padding_value.shape()) + ".");
  }
  for (int64_t d : padded_shape) {
    if (d < -1) {
      return Status::InvalidArgument("Padded shape " + shape_string(padded_shape) + " for " +
                                     component_string(component) + " has dimension " +
                                     std::to_string(d) + "; each must be >= 0, or -1 to pad " +
                                     "to the largest element.");
    }
  }

  // Resolve -1 dimensions to the batch maximum, checking fixed ones.
  Shape target = padded_shape;
  for (int64_t& d : target) d = std::max<int64_t>(d, 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Shape& shape = rows[i]->shape();
    if (shape.size() != padded_shape.size()) {
      return Status::InvalidArgument(
          "All elements in a batch must have the same rank as the padded shape for " +
          component_string(component) + ": expected rank " + std::to_string(padded_shape.size()) +
          " but element " + std::to_string(i) + " has shape " + shape_string(shape) + ".");
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      if (padded_shape[d] == -1) {
        target[d] = std::max(target[d], shape[d]);
      } else if (shape[d] > padded_shape[d]) {
        return Status::InvalidArgument(
            "Cannot pad element " + std::to_string(i) + " in " + component_string(component) +
            ": padded shape " + shape_string(padded_shape) + " is smaller than element shape " +
            shape_string(shape) + " in dimension " + std::to_string(d) + ".");
      }
    }
  }
  Shape shape = prepend(static_cast<int64_t>(rows.size()), target);
  const int64_t num_elements = shape_num_elements(shape);
  if (num_elements < 0) {
    return Status::InvalidArgument("Padded batch of shape " + shape_string(shape) + " for " +
                                   component_string(component) + " is too large.");
  }

  if (dtype == DType::kString) {
    const std::string_view pad = padding_value.string_at(0);
    uint64_t row_bytes = 0;
    int64_t row_elements = 0;
    for (const Tensor* row : rows) {
      row_bytes += string_range_bytes(*row, 0, row->num_elements());
      row_elements += row->num_elements();
    }
    const uint64_t pads = static_cast<uint64_t>(num_elements - row_elements);
    if (!pad.empty() && pads > (std::numeric_limits<uint64_t>::max() - row_bytes) / pad.size()) {
      return Status::InvalidArgument("Padded batch of shape " + shape_string(shape) + " for " +
                                     component_string(component) + " is too large.");
    }
    CAPSTAN_ASSIGN_OR_RETURN(StringWriter out,
                             StringWriter::create(std::move(shape), row_bytes + pads * pad.size()));
    for (const Tensor* row : rows) write_padded_row(*row, target, pad, out);
    return out.finish();
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dtype, std::move(shape)));
  FixedWriter writer(&out);
  for (const Tensor* row : rows) write_padded_row(*row, target, padding_value.data(), writer);
  return out;
}

Result<Tensor> slice_rows(const Tensor& t, int64_t begin, int64_t end) {
  if (!t.valid()) return Status::InvalidArgument("slice_rows: tensor has no dtype");
  if (t.rank() == 0) {
    return Status::InvalidArgument("slice_rows needs a tensor of rank >= 1, got a scalar");
  }
  const int64_t dim0 = t.shape()[0];
  if (begin < 0 || begin > end || end > dim0) {
    return Status::InvalidArgument("slice_rows: rows [" + std::to_string(begin) + ", " +
                                   std::to_string(end) + ") are not within the " +
                                   std::to_string(dim0) + " rows of shape " +
                                   shape_string(t.shape()));
  }
  if (begin == 0 && end == dim0) return t;
  Shape shape = t.shape();
  shape[0] = end - begin;
  if (t.dtype() == DType::kString) return copy_string_rows(t, begin, end, std::move(shape));
  return alias_rows(std::make_shared<Tensor>(t), begin, end, std::move(shape));
}

Result<std::vector<Tensor>> unstack(const Tensor& t) {
  if (!t.valid()) return Status::InvalidArgument("unstack: tensor has no dtype");
  if (t.rank() == 0) {
    return Status::InvalidArgument("Cannot unstack a scalar: it has no dimension 0 to slice");
  }
  const int64_t dim0 = t.shape()[0];
  const Shape row_shape(t.shape().begin() + 1, t.shape().end());
  std::vector<Tensor> rows;
  rows.reserve(static_cast<size_t>(dim0));
  // One owner for all rows: each row holds it, not a copy of its own.
  std::shared_ptr<Tensor> owner;
  if (t.dtype() != DType::kString) owner = std::make_shared<Tensor>(t);
  for (int64_t i = 0; i < dim0; ++i) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor row, owner ? alias_rows(owner, i, i + 1, row_shape)
                                               : copy_string_rows(t, i, i + 1, row_shape));
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<Tensor> concat_rows(const std::vector<const Tensor*>& parts) {
  if (parts.empty()) return Status::InvalidArgument("Cannot concatenate zero tensors.");
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == nullptr || !parts[i]->valid()) {
      return Status::InvalidArgument("Cannot concatenate tensors: part " + std::to_string(i) +
                                     (parts[i] == nullptr ? " is null." : " has no dtype."));
    }
    if (parts[i]->rank() == 0) {
      return Status::InvalidArgument("Cannot concatenate scalars along dimension 0: part " +
                                     std::to_string(i) + " has shape [].");
    }
  }
  const Tensor& first = *parts[0];
  int64_t rows = 0;
  uint64_t string_total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& part = *parts[i];
    if (part.dtype() != first.dtype()) {
      return Status::InvalidArgument(
          "Cannot concatenate tensors with different dtypes. First part had dtype " +
          dtype_string(first.dtype()) + " and part " + std::to_string(i) + " had dtype " +
          dtype_string(part.dtype()) + ".");
    }
    if (!std::equal(part.shape().begin() + 1, part.shape().end(), first.shape().begin() + 1,
                    first.shape().end())) {
      return Status::InvalidArgument(
          "Cannot concatenate tensors whose shapes differ after dimension 0. First part had "
          "shape " +
          shape_string(first.shape()) + " and part " + std::to_string(i) + " had shape " +
          shape_string(part.shape()) + ".");
    }
    rows += part.shape()[0];
    if (part.dtype() == DType::kString) {
      string_total += string_range_bytes(part, 0, part.num_elements());
    }
  }
  if (parts.size() == 1) return first;
  Shape shape = first.shape();
  shape[0] = rows;
  if (first.dtype() == DType::kString) {
    CAPSTAN_ASSIGN_OR_RETURN(StringWriter out,
                             StringWriter::create(std::move(shape), string_total));
    for (const Tensor* part : parts) out.copy(*part, 0, part->num_elements());
    return out.finish();
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(first.dtype(), std::move(shape)));
  FixedWriter writer(&out);
  for (const Tensor* part : parts) writer.copy(*part, 0, part->num_elements());
  return out;
}

Result<Tensor> cast(const Tensor& t, DType to) {
  if (!t.valid()) return Status::InvalidArgument("cast: tensor has no dtype");
  if (t.dtype() == to) return t;
  Result<Tensor> out = Status::InvalidArgument("Cast " + dtype_string(t.dtype()) + " to " +
                                               dtype_string(to) + " is not supported");
  visit_numeric(t.dtype(), [&](auto from_tag) {
    visit_numeric(to, [&](auto to_tag) {
      using From = typename decltype(from_tag)::type;
      using To = typename decltype(to_tag)::type;
      out = Tensor::uninitialized(to, t.shape());
      if (!out.ok()) return;
      cast_elements<From, To>(t.data(), out->mutable_data(),
                              static_cast<size_t>(t.num_elements()));
    });
  });
  return out;
}

Result<Tensor> default_padding(DType dtype) {
  if (dtype != DType::kString && dtype_size(dtype) == 0) {
    return Status::InvalidArgument("default_padding: invalid dtype " +
                                   std::to_string(static_cast<int>(dtype)));
  }
  return Tensor::zeros(dtype, Shape{});
}

}  // namespace capstan::data
