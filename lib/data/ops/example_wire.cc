#include "data/ops/example_wire.h"

#include <algorithm>
#include <cstring>

namespace capstan::data {
namespace {

// How deep messages and groups may nest, as protobuf's default recursion
// limit has it: the Example's own fields are at 100, each nested message or
// group takes one, and going below 0 is an error.
constexpr int kRecursionLimit = 100;

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

constexpr uint32_t tag_of(uint32_t field, WireType type) { return field << 3 | type; }

// A cursor over one message body; every read checks the bounds.
class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : p_(bytes.data()), end_(bytes.data() + bytes.size()) {}

  bool done() const { return p_ == end_; }

  // Up to 10 bytes; bits past 64 are dropped, as protobuf does.
  bool varint(uint64_t* value) {
    uint64_t result = 0;
    for (int i = 0; i < 10; ++i) {
      if (p_ == end_) return false;
      auto byte = static_cast<uint8_t>(*p_++);
      result |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if (byte < 0x80) {
        *value = result;
        return true;
      }
    }
    return false;
  }

  // A tag: up to 5 bytes, wrapping at 32 bits, as protobuf's ReadTag.
  bool tag(uint32_t* value) {
    uint32_t result = 0;
    for (int i = 0; i < 5; ++i) {
      if (p_ == end_) return false;
      auto byte = static_cast<uint8_t>(*p_++);
      result += static_cast<uint32_t>(byte & 0x7f) << (7 * i);
      if (byte < 0x80) {
        *value = result;
        return true;
      }
    }
    return false;
  }

  // A length prefix (up to 5 bytes, under 2 GiB) and that many bytes.
  bool length_delimited(std::string_view* body) {
    uint32_t size = 0;
    for (int i = 0;; ++i) {
      if (p_ == end_) return false;
      auto byte = static_cast<uint8_t>(*p_++);
      if (i == 4) {
        if (byte >= 8) return false;
        size |= static_cast<uint32_t>(byte) << 28;
        break;
      }
      size |= static_cast<uint32_t>(byte & 0x7f) << (7 * i);
      if (byte < 0x80) break;
    }
    if (size > static_cast<size_t>(end_ - p_)) return false;
    *body = std::string_view(p_, size);
    p_ += size;
    return true;
  }

  bool fixed32(uint32_t* value) {
    if (end_ - p_ < 4) return false;
    std::memcpy(value, p_, 4);
    p_ += 4;
    return true;
  }

  bool skip(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    p_ += n;
    return true;
  }

  // Skips the value of a field this parser does not know (`tag` read).
  // Groups are walked to their matching end tag.
  bool skip_field(uint32_t tag, int depth) {
    if ((tag >> 3) == 0) return false;
    switch (tag & 7) {
      case kVarint: {
        uint64_t ignored;
        return varint(&ignored);
      }
      case kFixed64: return skip(8);
      case kLengthDelimited: {
        std::string_view ignored;
        return length_delimited(&ignored);
      }
      case kFixed32: return skip(4);
      case kStartGroup: {
        if (depth - 1 < 0) return false;
        while (true) {
          uint32_t inner;
          if (!this->tag(&inner)) return false;
          if (inner == 0) return false;
          if ((inner & 7) == kEndGroup) return inner == tag + 1;  // the same field's end
          if (!skip_field(inner, depth - 1)) return false;
        }
      }
      default: return false;  // a stray end-group tag, or wire type 6 or 7
    }
  }

  // Reads the next tag of a message body; false at a tag that may not
  // appear there (0, or an end-group outside a group).
  bool message_tag(uint32_t* value) { return tag(value) && *value != 0 && (*value & 7) != kEndGroup; }

 private:
  const char* p_;
  const char* end_;
};

// Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF.
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const auto* end = p + s.size();
  uint8_t high = 0;  // most keys are ASCII
  for (const auto* q = p; q < end; ++q) high |= *q;
  if (high < 0x80) return true;
  while (p < end) {
    uint8_t c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    size_t n;
    uint8_t lo = 0x80, hi = 0xbf;  // the range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (static_cast<size_t>(end - p) < n) return false;
    if (p[1] < lo || p[1] > hi) return false;
    for (size_t k = 2; k < n; ++k) {
      if (p[k] < 0x80 || p[k] > 0xbf) return false;
    }
    p += n;
  }
  return true;
}

// What a message walker's field reader says about one field.
enum class Field { kRead, kBad, kUnknown };

// Walks a message body: `read(tag, in)` reads a field it knows (kRead, or
// kBad when it is damaged) or leaves it (kUnknown), which is then skipped.
template <typename Read>
bool walk_message(std::string_view body, int depth, Read&& read) {
  Cursor in(body);
  while (!in.done()) {
    uint32_t tag;
    if (!in.message_tag(&tag)) return false;
    switch (read(tag, in)) {
      case Field::kRead: break;
      case Field::kBad: return false;
      case Field::kUnknown:
        if (!in.skip_field(tag, depth)) return false;
        break;
    }
  }
  return true;
}

Field field_result(bool ok) { return ok ? Field::kRead : Field::kBad; }

// BytesList, FloatList and Int64List bodies, appended to `out` (nullptr:
// only checked).
bool parse_bytes_list(std::string_view body, FeatureValues* out, int depth) {
  return walk_message(body, depth, [out](uint32_t tag, Cursor& in) {
    if (tag != tag_of(1, kLengthDelimited)) return Field::kUnknown;
    std::string_view value;
    if (!in.length_delimited(&value)) return Field::kBad;
    if (out) {
      out->bytes.push_back(value);
      ++out->count;
    }
    return Field::kRead;
  });
}

// Appends `n` values of type T from `src` to `out`'s row or vector.
template <typename T>
void append_values(FeatureValues* out, std::vector<T>& vector, const void* src, size_t n) {
  if (out->in_row()) {
    int64_t room = std::max<int64_t>(0, out->row_capacity - out->count);
    size_t k = std::min(n, static_cast<size_t>(room));
    if (k > 0) std::memcpy(out->row + static_cast<size_t>(out->count) * sizeof(T), src, k * sizeof(T));
  } else {
    size_t old = vector.size();
    vector.resize(old + n);
    std::memcpy(vector.data() + old, src, n * sizeof(T));
  }
  out->count += static_cast<int64_t>(n);
}

bool parse_float_list(std::string_view body, FeatureValues* out, int depth) {
  return walk_message(body, depth, [out](uint32_t tag, Cursor& in) {
    if (tag == tag_of(1, kLengthDelimited)) {  // packed
      std::string_view packed;
      if (!in.length_delimited(&packed) || packed.size() % sizeof(float) != 0) return Field::kBad;
      if (out && !packed.empty()) append_values<float>(out, out->floats, packed.data(), packed.size() / sizeof(float));
      return Field::kRead;
    }
    if (tag == tag_of(1, kFixed32)) {
      uint32_t bits;
      if (!in.fixed32(&bits)) return Field::kBad;
      if (out) append_values<float>(out, out->floats, &bits, 1);
      return Field::kRead;
    }
    return Field::kUnknown;
  });
}

void append_int64(FeatureValues* out, uint64_t v) {
  auto value = static_cast<int64_t>(v);
  if (out->in_row()) {
    if (out->count < out->row_capacity) {
      std::memcpy(out->row + static_cast<size_t>(out->count) * sizeof(int64_t), &value, sizeof(value));
    }
  } else {
    out->int64s.push_back(value);
  }
  ++out->count;
}

bool parse_int64_list(std::string_view body, FeatureValues* out, int depth) {
  return walk_message(body, depth, [out](uint32_t tag, Cursor& in) {
    if (tag == tag_of(1, kLengthDelimited)) {  // packed
      std::string_view packed;
      if (!in.length_delimited(&packed)) return Field::kBad;
      Cursor values(packed);
      while (!values.done()) {
        uint64_t v;
        if (!values.varint(&v)) return Field::kBad;
        if (out) append_int64(out, v);
      }
      return Field::kRead;
    }
    if (tag == tag_of(1, kVarint)) {
      uint64_t v;
      if (!in.varint(&v)) return Field::kBad;
      if (out) append_int64(out, v);
      return Field::kRead;
    }
    return Field::kUnknown;
  });
}

// A Feature body, merged into `out` (nullptr: only checked): a list of
// another kind replaces what `out` holds, the same kind appends.
bool parse_feature(std::string_view body, FeatureValues* out, int depth) {
  return walk_message(body, depth, [out, depth](uint32_t tag, Cursor& in) {
    DType kind;
    switch (tag) {
      case tag_of(1, kLengthDelimited): kind = DType::kString; break;
      case tag_of(2, kLengthDelimited): kind = DType::kFloat32; break;
      case tag_of(3, kLengthDelimited): kind = DType::kInt64; break;
      default: return Field::kUnknown;
    }
    std::string_view list;
    if (!in.length_delimited(&list) || depth - 1 < 0) return Field::kBad;
    if (out && out->dtype != kind) {
      out->clear();
      out->dtype = kind;
    }
    switch (kind) {
      case DType::kString: return field_result(parse_bytes_list(list, out, depth - 1));
      case DType::kFloat32: return field_result(parse_float_list(list, out, depth - 1));
      default: return field_result(parse_int64_list(list, out, depth - 1));
    }
  });
}

}  // namespace

namespace {

// FNV-1a: keys are short, and this is not exposed to hash flooding (the
// table holds only the spec's keys; a lookup probes at most until a gap).
uint64_t key_hash(std::string_view key) {
  uint64_t h = 14695981039346656037ull;
  for (char c : key) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

ExampleWireParser::ExampleWireParser(const std::vector<std::string_view>& keys) : values_(keys.size()) {
  size_t size = 8;
  while (size < 2 * keys.size()) size *= 2;
  slots_.resize(size);
  for (size_t i = 0; i < keys.size(); ++i) {
    size_t s = key_hash(keys[i]) & (size - 1);
    while (slots_[s].index >= 0) s = (s + 1) & (size - 1);
    slots_[s] = Slot{keys[i], static_cast<int64_t>(i)};
  }
}

int64_t ExampleWireParser::find_key(std::string_view key) const {
  const size_t mask = slots_.size() - 1;
  for (size_t s = key_hash(key) & mask;; s = (s + 1) & mask) {
    const Slot& slot = slots_[s];
    if (slot.index < 0) return -1;
    if (slot.key.size() == key.size() && std::memcmp(slot.key.data(), key.data(), key.size()) == 0) return slot.index;
  }
}

bool ExampleWireParser::parse(std::string_view bytes) {
  for (auto& v : values_) v.clear();
  return walk_message(bytes, kRecursionLimit, [this](uint32_t tag, Cursor& in) {
    if (tag != tag_of(1, kLengthDelimited)) return Field::kUnknown;
    std::string_view features;
    if (!in.length_delimited(&features)) return Field::kBad;
    return field_result(parse_features(features, kRecursionLimit - 1));
  });
}

bool ExampleWireParser::parse_features(std::string_view body, int depth) {
  return walk_message(body, depth, [this, depth](uint32_t tag, Cursor& in) {
    if (tag != tag_of(1, kLengthDelimited)) return Field::kUnknown;
    std::string_view entry;
    if (!in.length_delimited(&entry) || depth - 1 < 0) return Field::kBad;
    return field_result(parse_entry(entry, depth - 1));
  });
}

// A map entry: the key (the last one given) and its value (all given,
// merged); the entry replaces an earlier one of the same key.
bool ExampleWireParser::parse_entry(std::string_view body, int depth) {
  std::string_view key;
  std::string_view first_value;  // the usual entry has one value
  int values = 0;
  entry_values_.clear();
  bool ok = walk_message(body, depth, [&](uint32_t tag, Cursor& in) {
    if (tag == tag_of(1, kLengthDelimited)) {
      // Every key given must be UTF-8, not only the one that counts.
      return field_result(in.length_delimited(&key) && valid_utf8(key));
    }
    if (tag == tag_of(2, kLengthDelimited)) {
      std::string_view value;
      if (!in.length_delimited(&value)) return Field::kBad;
      if (values++ == 0) {
        first_value = value;
      } else {
        entry_values_.push_back(value);
      }
      return Field::kRead;
    }
    return Field::kUnknown;
  });
  if (!ok) return false;
  FeatureValues* out = nullptr;
  if (int64_t wanted = find_key(key); wanted >= 0) {
    out = &values_[static_cast<size_t>(wanted)];
    out->clear();
  }
  if (values == 0) return true;
  if (depth - 1 < 0 || !parse_feature(first_value, out, depth - 1)) return false;
  for (std::string_view value : entry_values_) {
    if (!parse_feature(value, out, depth - 1)) return false;
  }
  return true;
}

}  // namespace capstan::data
