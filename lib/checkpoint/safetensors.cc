#include "checkpoint/safetensors.h"

#include "io/crc32c.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <set>

#include "checkpoint/json.h"
#include "io/durable_file.h"

namespace capstan::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this code copies it as is");

namespace {

struct DTypeEntry {
  std::string_view name;  // safetensors
  DType dtype;            // kInvalid: no Capstan counterpart
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {"F16", DType::kFloat16, 2}, {"BF16", DType::kBFloat16, 2},   {"F32", DType::kFloat32, 4},
    {"F64", DType::kFloat64, 8}, {"I8", DType::kInt8, 1},         {"I16", DType::kInt16, 2},
    {"I32", DType::kInt32, 4},   {"I64", DType::kInt64, 8},       {"U8", DType::kUInt8, 1},
    {"BOOL", DType::kBool, 1},   {"U16", DType::kInvalid, 2},     {"U32", DType::kInvalid, 4},
    {"U64", DType::kInvalid, 8}, {"F8_E4M3", DType::kInvalid, 1}, {"F8_E5M2", DType::kInvalid, 1},
};

const DTypeEntry* find_dtype(std::string_view name) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string range_string(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

std::string le64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

uint64_t decode_le64(const unsigned char* in) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | in[i];
  return value;
}

// Number of elements of `shape` when it fits the bytes of a file: false on
// a negative dimension or overflow.
bool checked_elements(const Shape& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return false;
    if (dim != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return false;
    }
    n *= static_cast<uint64_t>(dim);
  }
  *out = n;
  return true;
}

// "[3]", "[2, 3]", "[]" (shape_string's output) back into a shape.
std::optional<Shape> parse_shape_string(std::string_view text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  text = text.substr(1, text.size() - 2);
  Shape shape;
  if (text.find_first_not_of(' ') == std::string_view::npos) return shape;
  while (true) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int64_t dim;
    if (!internal::parse_json_int64(item, &dim) || dim < 0) return std::nullopt;
    shape.push_back(dim);
    if (comma == std::string_view::npos) return shape;
    text.remove_prefix(comma + 1);
  }
}

// Length of the UTF-8 sequence starting at s[i]; 0 when it is not valid.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  auto byte = [&s](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t length;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // beyond U+10FFFF
  } else {
    return 0;
  }
  if (i + length > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return length;
}

bool is_json_integer(std::string_view text) {
  if (!text.empty() && text.front() == '-') text.remove_prefix(1);
  if (text.empty()) return false;
  if (text.front() == '0') return text.size() == 1;
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}


}  // namespace

std::optional<std::string_view> safetensors_dtype_name(DType dtype) {
  for (const auto& entry : kDTypes) {
    if (entry.dtype == dtype && dtype != DType::kInvalid) return entry.name;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- writing

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata, io::FileSystem& fs,
                         uint32_t* crc32c) {
  auto invalid = [&path](const std::string& why) {
    return Status::InvalidArgument("cannot write safetensors file '" + path + "': " + why);
  };
  std::map<std::string, std::string> all_metadata;
  for (const auto& [key, value] : metadata) {
    if (!internal::is_valid_utf8(key) || !internal::is_valid_utf8(value)) {
      return invalid("metadata " + in_quotes(key) + " is not valid UTF-8");
    }
    if (key.starts_with(kStringDTypeKeyPrefix) || key.starts_with(kStringShapeKeyPrefix)) {
      return invalid("metadata key " + in_quotes(key) +
                     " uses a prefix reserved for string tensors");
    }
    all_metadata[key] = value;
  }

  std::string header = "{";
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  std::vector<std::string_view> pieces = {std::string_view(), std::string_view()};
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == kSafetensorsMetadataKey || !internal::is_valid_utf8(name)) {
      return invalid("bad tensor name " + in_quotes(name) +
                     " (names are non-empty UTF-8 and not __metadata__)");
    }
    if (!seen.insert(name).second) return invalid("tensor " + in_quotes(name) + " given twice");
    Status valid = tensor.validate();
    if (!valid.ok()) return invalid("tensor " + in_quotes(name) + ": " + valid.message());
    std::string_view dtype;
    Shape shape = tensor.shape();
    if (tensor.dtype() == DType::kString) {
      dtype = "U8";
      shape = {static_cast<int64_t>(tensor.byte_size())};
      all_metadata[std::string(kStringDTypeKeyPrefix) + name] = "string";
      all_metadata[std::string(kStringShapeKeyPrefix) + name] = shape_string(tensor.shape());
    } else {
      dtype = *safetensors_dtype_name(tensor.dtype());
    }
    if (header.size() > 1) header += ",";
    header += json_quote(name) + ":{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < shape.size(); ++i) {
      if (i > 0) header += ",";
      header += std::to_string(shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + tensor.byte_size()) + "]}";
    offset += tensor.byte_size();
    pieces.emplace_back(reinterpret_cast<const char*>(tensor.data()), tensor.byte_size());
  }
  if (!all_metadata.empty()) {
    if (header.size() > 1) header += ",";
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : all_metadata) {
      if (!first) header += ",";
      first = false;
      header += json_quote(key) + ":" + json_quote(value);
    }
    header += "}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxSafetensorsHeaderBytes) {
    return invalid("the header would have " + std::to_string(header.size()) +
                   " bytes, more than readers accept");
  }
  const std::string length = le64(header.size());
  pieces[0] = length;
  pieces[1] = header;
  if (crc32c != nullptr) {
    uint32_t crc = 0;
    for (std::string_view piece : pieces) crc = io::crc32c_extend(crc, piece.data(), piece.size());
    *crc32c = crc;
  }
  return io::write_file_durably(fs, path, pieces);
}

// ---------------------------------------------------------------- reading

Result<std::unique_ptr<SafetensorsReader>> SafetensorsReader::open(const std::string& path, io::FileSystem& fs) {
  Result<std::unique_ptr<io::RandomAccessFile>> file = fs.open_readable(path);
  if (file.status().code() == StatusCode::kFailedPrecondition) {
    return Status::FailedPrecondition("safetensors file '" + path + "' is not a regular file");
  }
  if (!file.ok()) return file.status().with_context("cannot open safetensors file '" + path + "'");
  const uint64_t file_size = (*file)->size();
  std::unique_ptr<SafetensorsReader> reader(new SafetensorsReader(path, std::move(*file)));
  if (file_size < 8) {
    return reader->corrupt("the file has " + std::to_string(file_size) +
                           " bytes, too few for the 8-byte header length");
  }
  unsigned char length_bytes[8];
  CAPSTAN_RETURN_IF_ERROR(reader->pread_data(0, length_bytes, 8, ""));
  const uint64_t header_length = decode_le64(length_bytes);
  if (header_length > kMaxSafetensorsHeaderBytes) {
    return reader->corrupt("header length " + std::to_string(header_length) +
                           " exceeds the limit of " + std::to_string(kMaxSafetensorsHeaderBytes) +
                           " bytes");
  }
  if (header_length > file_size - 8) {
    return reader->corrupt("header length " + std::to_string(header_length) + " exceeds the " +
                           std::to_string(file_size - 8) + " bytes after it");
  }
  std::string header(header_length, '\0');
  CAPSTAN_RETURN_IF_ERROR(reader->pread_data(8, header.data(), header.size(), ""));
  reader->data_start_ = 8 + header_length;
  CAPSTAN_RETURN_IF_ERROR(reader->parse_header(header));

  // The ranges must tile the data exactly, as the reference reader demands.
  const uint64_t data_size = file_size - reader->data_start_;
  uint64_t expected = 0;
  for (const auto& name : reader->order_) {
    const auto& info = reader->tensors_.at(name);
    if (info.begin < expected) {
      return reader->corrupt(
          "tensor " + in_quotes(name) + ": data_offsets " + range_string(info.begin, info.end) +
          " overlap the previous tensor, which ends at " + std::to_string(expected));
    }
    if (info.begin > expected) {
      return reader->corrupt(
          "tensor " + in_quotes(name) + ": data_offsets " + range_string(info.begin, info.end) +
          " leave a gap after the previous tensor, which ends at " + std::to_string(expected));
    }
    if (info.end > data_size) {
      return reader->corrupt("tensor " + in_quotes(name) + ": data_offsets " +
                             range_string(info.begin, info.end) + " run past the " +
                             std::to_string(data_size) + " data bytes (truncated file?)");
    }
    expected = info.end;
  }
  if (expected != data_size) {
    return reader->corrupt(std::to_string(data_size - expected) +
                           " bytes follow the last tensor's data");
  }
  return reader;
}

SafetensorsReader::~SafetensorsReader() = default;

Status SafetensorsReader::corrupt(const std::string& why) const {
  return Status::DataLoss("corrupt safetensors file '" + path_ + "': " + why);
}

Status SafetensorsReader::parse_header(std::string_view header) {
  if (header.empty() || header.front() != '{') {
    return corrupt("the header does not start with '{'");
  }
  JsonDuplicateKey duplicate;
  auto parsed = parse_json(header, &duplicate);
  if (!parsed.ok()) {
    if (duplicate.key.empty()) return corrupt("the header is not valid JSON: " + parsed.status().message());
    if (duplicate.path.empty()) {
      if (duplicate.key == kSafetensorsMetadataKey) return corrupt("the header has two __metadata__ objects");
      return corrupt("the header names tensor " + in_quotes(duplicate.key) + " twice");
    }
    if (duplicate.path.front() == kSafetensorsMetadataKey) {
      return corrupt("__metadata__ has " + in_quotes(duplicate.key) + " twice");
    }
    return corrupt("tensor " + in_quotes(duplicate.path.front()) + ": its entry has " + in_quotes(duplicate.key) +
                   " twice");
  }
  const Json& root = *parsed;
  if (!root.is_object()) return corrupt("the header is not a JSON object");

  std::map<std::string, std::string> raw_metadata;
  for (const auto& item : root.items()) {
    const std::string& key = item.key();
    const Json& value = item.value();
    if (key == kSafetensorsMetadataKey) {
      if (!value.is_object()) return corrupt("__metadata__ is not a JSON object");
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) return corrupt("__metadata__ " + in_quotes(meta_key) + " is not a string");
        raw_metadata.emplace(meta_key, meta_value.get<std::string>());
      }
      continue;
    }
    auto bad = [this, &key](const std::string& why) { return corrupt("tensor " + in_quotes(key) + ": " + why); };
    if (!value.is_object()) return bad("its entry is not a JSON object");
    SafetensorsTensorInfo info;
    auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) return bad("no \"dtype\" string");
    const DTypeEntry* entry = find_dtype(dtype->get<std::string>());
    if (entry == nullptr) return bad("unknown dtype " + in_quotes(dtype->get<std::string>()));
    info.safetensors_dtype = std::string(entry->name);
    info.dtype = entry->dtype;
    auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) return bad("no \"shape\" list");
    for (const Json& dim : *shape) {
      if (!dim.is_number_integer() || (dim.is_number_unsigned() ? dim.get<uint64_t>() > INT64_MAX : dim.get<int64_t>() < 0)) {
        return bad("shape has a dimension that is not a non-negative integer");
      }
      info.shape.push_back(dim.get<int64_t>());
    }
    auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned()) {
      return bad("\"data_offsets\" is not a list of two non-negative integers");
    }
    info.begin = (*offsets)[0].get<uint64_t>();
    info.end = (*offsets)[1].get<uint64_t>();
    if (info.begin > info.end) {
      return bad("data_offsets " + range_string(info.begin, info.end) + " end before they begin");
    }
    uint64_t elements;
    if (!checked_elements(info.shape, &elements) ||
        elements > std::numeric_limits<uint64_t>::max() / entry->size) {
      return bad("shape " + shape_string(info.shape) + " is too large");
    }
    if (info.end - info.begin != elements * entry->size) {
      return bad("data_offsets " + range_string(info.begin, info.end) + " hold " +
                 std::to_string(info.end - info.begin) + " bytes, but " + info.safetensors_dtype +
                 " " + shape_string(info.shape) + " needs " +
                 std::to_string(elements * entry->size));
    }
    tensors_.emplace(key, std::move(info));
    order_.push_back(key);
  }

  // String tensors: U8 vectors whose real dtype and shape are in metadata.
  for (const auto& [key, value] : raw_metadata) {
    if (key.starts_with(kStringShapeKeyPrefix)) {
      const std::string name = key.substr(kStringShapeKeyPrefix.size());
      if (raw_metadata.count(std::string(kStringDTypeKeyPrefix) + name) == 0) {
        return corrupt("metadata " + in_quotes(key) + " has no matching " +
                       in_quotes(std::string(kStringDTypeKeyPrefix) + name));
      }
      continue;
    }
    if (!key.starts_with(kStringDTypeKeyPrefix)) {
      metadata_.emplace(key, value);
      continue;
    }
    const std::string name = key.substr(kStringDTypeKeyPrefix.size());
    auto bad = [this, &name](const std::string& why) {
      return corrupt("string tensor " + in_quotes(name) + ": " + why);
    };
    if (value != "string") return bad("metadata " + in_quotes(key) + " is " + in_quotes(value));
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return bad("not in the header");
    SafetensorsTensorInfo& info = it->second;
    if (info.dtype != DType::kUInt8 || info.shape.size() != 1) {
      return bad("stored as " + info.safetensors_dtype + " " + shape_string(info.shape) +
                 ", not a U8 vector");
    }
    auto shape_it = raw_metadata.find(std::string(kStringShapeKeyPrefix) + name);
    if (shape_it == raw_metadata.end()) return bad("no shape in the metadata");
    std::optional<Shape> shape = parse_shape_string(shape_it->second);
    uint64_t elements;
    if (!shape || !checked_elements(*shape, &elements) ||
        elements >= std::numeric_limits<uint64_t>::max() / 8 ||
        (elements + 1) * 8 > info.end - info.begin) {
      return bad("shape " + in_quotes(shape_it->second) + " does not fit its " +
                 std::to_string(info.end - info.begin) + " bytes");
    }
    info.dtype = DType::kString;
    info.shape = *shape;
  }

  std::sort(order_.begin(), order_.end(), [this](const std::string& a, const std::string& b) {
    const auto& x = tensors_.at(a);
    const auto& y = tensors_.at(b);
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  return Status::Ok();
}

std::vector<std::string> SafetensorsReader::names() const { return order_; }

const SafetensorsTensorInfo* SafetensorsReader::find(const std::string& name, Status* error) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    *error =
        Status::NotFound("no tensor " + in_quotes(name) + " in safetensors file '" + path_ + "'");
    return nullptr;
  }
  if (it->second.dtype == DType::kInvalid) {
    *error =
        Status::Unimplemented("tensor " + in_quotes(name) + " in '" + path_ + "' has dtype " +
                              it->second.safetensors_dtype + ", which Capstan does not support");
    return nullptr;
  }
  return &it->second;
}

Result<SafetensorsTensorInfo> SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return Status::NotFound("no tensor " + in_quotes(name) + " in safetensors file '" + path_ +
                            "'");
  }
  return it->second;
}

Status SafetensorsReader::pread_data(uint64_t offset, void* out, size_t n,
                                     const std::string& tensor) const {
  // The header's ranges were checked against the size at open; a file
  // shorter than that now was cut under us.
  const uint64_t size = file_->size();
  if (offset > size || size - offset < n) {
    const uint64_t missing = offset > size ? n : n - (size - offset);
    return corrupt((tensor.empty() ? std::string("the file") : "tensor " + in_quotes(tensor)) +
                   ": the file ends " + std::to_string(missing) + " bytes early");
  }
  Status status = file_->read(offset, n, static_cast<char*>(out));
  if (status.code() == StatusCode::kInternal) {
    return corrupt((tensor.empty() ? std::string("the file") : "tensor " + in_quotes(tensor)) +
                   ": the file ends early (" + status.message() + ")");
  }
  return status;
}

Result<Tensor> SafetensorsReader::read(const std::string& name) const {
  Status error;
  const SafetensorsTensorInfo* info = find(name, &error);
  if (info == nullptr) return error;
  if (info->dtype == DType::kString) {
    uint64_t elements;
    checked_elements(info->shape, &elements);  // checked when opened
    return read_string_elements(name, *info, 0, elements, info->shape);
  }
  if (info->shape.empty()) return read_fixed_rows(name, *info, 0, Shape{});
  Shape shape = info->shape;
  return read_fixed_rows(name, *info, 0, std::move(shape));
}

Result<Tensor> SafetensorsReader::read_rows(const std::string& name, int64_t begin,
                                            int64_t end) const {
  Status error;
  const SafetensorsTensorInfo* info = find(name, &error);
  if (info == nullptr) return error;
  if (info->shape.empty()) {
    return Status::InvalidArgument("read_rows needs a tensor of rank >= 1; " + in_quotes(name) +
                                   " in '" + path_ + "' is a scalar");
  }
  if (begin < 0 || begin > end || end > info->shape[0]) {
    return Status::InvalidArgument("rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                                   ") are not within the " + std::to_string(info->shape[0]) +
                                   " rows of " + in_quotes(name) + " in '" + path_ + "'");
  }
  Shape shape = info->shape;
  shape[0] = end - begin;
  if (info->dtype == DType::kString) {
    uint64_t row_elements;
    checked_elements(Shape(info->shape.begin() + 1, info->shape.end()), &row_elements);
    return read_string_elements(name, *info, static_cast<uint64_t>(begin) * row_elements,
                                static_cast<uint64_t>(end) * row_elements, std::move(shape));
  }
  return read_fixed_rows(name, *info, begin, std::move(shape));
}

Result<Tensor> SafetensorsReader::read_fixed_rows(const std::string& name,
                                                  const SafetensorsTensorInfo& info, int64_t begin,
                                                  Shape shape) const {
  // Row r starts r * row_bytes into the tensor; a scalar is one row.
  const uint64_t rows = info.shape.empty() ? 1 : static_cast<uint64_t>(info.shape[0]);
  const uint64_t row_bytes = rows == 0 ? 0 : (info.end - info.begin) / rows;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor tensor, Tensor::uninitialized(info.dtype, std::move(shape)));
  CAPSTAN_RETURN_IF_ERROR(
      pread_data(data_start_ + info.begin + static_cast<uint64_t>(begin) * row_bytes,
                 tensor.mutable_data(), tensor.byte_size(), name));
  if (info.dtype == DType::kBool) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(tensor.data());
    for (size_t i = 0; i < tensor.byte_size(); ++i) {
      if (bytes[i] > 1) {
        return corrupt("tensor " + in_quotes(name) + ": bool element " + std::to_string(i) +
                       " of the rows read is " + std::to_string(bytes[i]) + ", not 0 or 1");
      }
    }
  }
  return tensor;
}

Result<Tensor> SafetensorsReader::read_string_elements(const std::string& name,
                                                       const SafetensorsTensorInfo& info,
                                                       uint64_t first, uint64_t last,
                                                       Shape shape) const {
  // The stored buffer: (n + 1) uint64 offsets, then the bytes.
  uint64_t n;
  checked_elements(info.shape, &n);
  const uint64_t stored = info.end - info.begin;
  const uint64_t bytes_start = (n + 1) * 8;  // <= stored, checked when opened
  const uint64_t bytes_size = stored - bytes_start;
  const uint64_t count = last - first;
  std::vector<uint64_t> offsets(count + 1);
  CAPSTAN_RETURN_IF_ERROR(
      pread_data(data_start_ + info.begin + first * 8, offsets.data(), offsets.size() * 8, name));
  auto bad = [this, &name](const std::string& why) {
    return corrupt("string tensor " + in_quotes(name) + ": " + why);
  };
  if (first == 0 && offsets[0] != 0) return bad("the first offset is not 0");
  if (last == n && offsets[count] != bytes_size) {
    return bad("the last offset is " + std::to_string(offsets[count]) + ", not the " +
               std::to_string(bytes_size) + " bytes stored");
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (offsets[i] > offsets[i + 1]) {
      return bad("offset " + std::to_string(first + i + 1) + " goes backwards");
    }
  }
  if (offsets[count] > bytes_size) {
    return bad("offset " + std::to_string(last) + " is beyond the " + std::to_string(bytes_size) +
               " bytes stored");
  }
  const uint64_t base = offsets[0];
  const uint64_t string_bytes = offsets[count] - base;
  CAPSTAN_ASSIGN_OR_RETURN(
      Tensor buffer,
      Tensor::uninitialized(DType::kUInt8, {static_cast<int64_t>((count + 1) * 8 + string_bytes)}));
  auto* out_offsets = reinterpret_cast<uint64_t*>(buffer.mutable_data());
  for (uint64_t i = 0; i <= count; ++i) out_offsets[i] = offsets[i] - base;
  CAPSTAN_RETURN_IF_ERROR(pread_data(data_start_ + info.begin + bytes_start + base,
                                     buffer.mutable_data() + (count + 1) * 8, string_bytes, name));
  auto holder = std::make_shared<Tensor>(buffer);
  auto result = Tensor::from_buffer(DType::kString, std::move(shape), holder,
                                    holder->mutable_data(), holder->byte_size());
  if (!result.ok()) return bad(result.status().message());
  return result;
}

// ---------------------------------------------------------------- internal

namespace internal {

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t length = utf8_sequence_length(s, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

bool parse_json_int64(std::string_view text, int64_t* out) {
  if (!is_json_integer(text)) return false;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return error == std::errc() && end == text.data() + text.size();
}

bool parse_json_uint64(std::string_view text, uint64_t* out) {
  if (!is_json_integer(text) || text.front() == '-') return false;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return error == std::errc() && end == text.data() + text.size();
}

}  // namespace internal

}  // namespace capstan::checkpoint
