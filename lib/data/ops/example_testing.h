// Test helpers for parse_example: a writer of protobuf wire bytes, random
// Examples (valid and damaged) written with it, and the comparison of the
// wire parser with the protobuf reference.
#ifndef CAPSTAN_LIB_DATA_OPS_EXAMPLE_TESTING_H_
#define CAPSTAN_LIB_DATA_OPS_EXAMPLE_TESTING_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"

namespace capstan::data::testing {

// Protobuf wire format, written by hand so that tests can write what a
// message builder would not (repeated keys, merged messages, groups, bad
// bytes).
class WireWriter {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void tag(uint32_t field, uint32_t wire_type) { varint(uint64_t{field} << 3 | wire_type); }
  void bytes(uint32_t field, std::string_view value) {
    tag(field, 2);
    varint(value.size());
    out_.append(value);
  }
  void fixed32(uint32_t field, uint32_t bits) {
    tag(field, 5);
    out_.append(reinterpret_cast<const char*>(&bits), 4);
  }
  void fixed64(uint32_t field, uint64_t bits) {
    tag(field, 1);
    out_.append(reinterpret_cast<const char*>(&bits), 8);
  }
  void raw(std::string_view bytes) { out_.append(bytes); }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

// Random serialized Examples over the keys "a" (mostly int64), "b" (mostly
// float), "c" (mostly bytes), "label" (mostly one int64) and others, written
// in every form the wire format allows: packed and unpacked values, keys and
// values repeated, lists of two kinds in one Feature, unknown fields and
// groups, `features` given twice. damaged() then breaks some of them.
class RandomExamples {
 public:
  explicit RandomExamples(uint32_t seed) : rng_(seed) {}

  std::string example() {
    WireWriter w;
    int parts = pick(3) == 0 ? 2 : 1;
    for (int p = 0; p < parts; ++p) {
      if (pick(6) == 0) unknown(w, 0);
      w.bytes(1, features());
    }
    if (pick(6) == 0) unknown(w, 0);
    return w.str();
  }

  // `bytes` with one of: truncated, a byte changed, a byte inserted, garbage
  // appended, a length or tag made too large.
  std::string damaged(std::string bytes) {
    switch (pick(6)) {
      case 0:
        if (!bytes.empty()) bytes.resize(pick(static_cast<uint32_t>(bytes.size())));
        break;
      case 1:
        if (!bytes.empty()) bytes[pick(static_cast<uint32_t>(bytes.size()))] = static_cast<char>(pick(256));
        break;
      case 2: bytes.insert(bytes.begin() + pick(static_cast<uint32_t>(bytes.size() + 1)), static_cast<char>(pick(256))); break;
      case 3:
        for (uint32_t n = 1 + pick(4); n > 0; --n) bytes.push_back(static_cast<char>(pick(256)));
        break;
      case 4:
        if (!bytes.empty()) bytes[pick(static_cast<uint32_t>(bytes.size()))] = static_cast<char>(0xff);
        break;
      default:
        if (!bytes.empty()) bytes[pick(static_cast<uint32_t>(bytes.size()))] = 0;
        break;
    }
    return bytes;
  }

  uint32_t pick(uint32_t n) { return n == 0 ? 0 : std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_); }

 private:
  std::string features() {
    WireWriter w;
    for (uint32_t n = pick(6); n > 0; --n) {
      if (pick(10) == 0) unknown(w, 0);
      w.bytes(1, entry());
    }
    return w.str();
  }

  std::string entry() {
    static const char* const kKeys[] = {"a", "b", "c", "label", "other", "", "\xc3\xa9t\xc3\xa9", "bad\xff"};
    uint32_t k = pick(20);
    std::string key = kKeys[k < 16 ? k % 5 : 5 + (k - 16) % 3];
    int kind = preferred_kind(key);
    if (pick(16) == 0) kind = static_cast<int>(pick(4));  // 3: no list
    WireWriter w;
    bool value_first = pick(4) == 0;
    if (value_first) w.bytes(2, feature(kind, key));
    w.bytes(1, key);
    if (pick(12) == 0) unknown(w, 0);
    if (!value_first) w.bytes(2, feature(kind, key));
    if (pick(10) == 0) w.bytes(2, feature(pick(3) == 0 ? static_cast<int>(pick(3)) : kind, key));
    return w.str();
  }

  static int preferred_kind(const std::string& key) {
    if (key == "a" || key == "label") return 2;
    if (key == "b") return 1;
    return 0;
  }

  // kind 0 bytes, 1 float, 2 int64, 3 none.
  std::string feature(int kind, const std::string& key) {
    WireWriter w;
    if (kind == 3) {
      if (pick(2) == 0) unknown(w, 0);
      return w.str();
    }
    uint32_t count = key == "label" && pick(10) != 0 ? 1 : pick(5);
    w.bytes(static_cast<uint32_t>(kind) + 1, list(kind, count));
    if (pick(15) == 0) w.bytes(static_cast<uint32_t>(pick(3)) + 1, list(static_cast<int>(pick(3)), pick(3)));
    if (pick(15) == 0) unknown(w, 0);
    return w.str();
  }

  std::string list(int kind, uint32_t count) {
    WireWriter w;
    if (kind == 0) {
      for (uint32_t i = 0; i < count; ++i) w.bytes(1, std::string(pick(6), static_cast<char>('a' + pick(26))));
    } else if (kind == 1) {
      std::vector<float> values(count);
      for (auto& v : values) v = static_cast<float>(static_cast<int>(pick(2001)) - 1000) / 8.0f;
      if (pick(3) == 0) {
        for (float v : values) {
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          w.fixed32(1, bits);
        }
      } else {
        w.bytes(1, std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
      }
    } else {
      std::vector<int64_t> values(count);
      for (auto& v : values) v = pick(5) == 0 ? -static_cast<int64_t>(pick(1000)) : static_cast<int64_t>(pick(100000));
      if (pick(3) == 0) {
        for (int64_t v : values) {
          w.tag(1, 0);
          w.varint(static_cast<uint64_t>(v));
        }
      } else {
        WireWriter packed;
        for (int64_t v : values) packed.varint(static_cast<uint64_t>(v));
        w.bytes(1, packed.str());
      }
    }
    if (pick(12) == 0) unknown(w, 0);
    return w.str();
  }

  // An unknown field of a random wire type (groups nest a little).
  void unknown(WireWriter& w, int depth) {
    uint32_t field = 2 + pick(30);
    switch (pick(depth < 2 ? 5 : 4)) {
      case 0:
        w.tag(field, 0);
        w.varint(pick(1u << 20));
        break;
      case 1: w.fixed64(field, pick(1000)); break;
      case 2: w.bytes(field, std::string(pick(5), 'x')); break;
      case 3: w.fixed32(field, pick(1000)); break;
      default:
        w.tag(field, 3);
        unknown(w, depth + 1);
        w.tag(field, 4);
        break;
    }
  }

  std::mt19937 rng_;
};

// "" when both results are the same: equal errors, or the same names,
// dtypes, shapes and values; else what differs.
inline std::string compare_results(const Result<Element>& fast, const Result<Element>& reference) {
  if (!reference.ok() || !fast.ok()) {
    if (fast.ok() != reference.ok() || fast.status().code() != reference.status().code() ||
        fast.status().message() != reference.status().message()) {
      return "fast: " + (fast.ok() ? std::string("OK") : fast.status().to_string()) +
             "; reference: " + (reference.ok() ? std::string("OK") : reference.status().to_string());
    }
    return "";
  }
  if (fast->names != reference->names) return "component names differ";
  for (size_t i = 0; i < fast->components.size(); ++i) {
    const Tensor& a = fast->components[i];
    const Tensor& b = reference->components[i];
    const std::string& name = fast->names[i];
    if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
      return name + ": " + std::string(dtype_name(a.dtype())) + shape_string(a.shape()) + " vs " +
             std::string(dtype_name(b.dtype())) + shape_string(b.shape());
    }
    if (a.dtype() == DType::kString) {
      for (int64_t k = 0; k < a.num_elements(); ++k) {
        if (a.string_at(k) != b.string_at(k)) return name + ": string " + std::to_string(k) + " differs";
      }
    } else if (a.byte_size() != b.byte_size() ||
               (a.byte_size() > 0 && std::memcmp(a.data(), b.data(), a.byte_size()) != 0)) {
      return name + ": values differ";
    }
  }
  return "";
}

}  // namespace capstan::data::testing

#endif  // CAPSTAN_LIB_DATA_OPS_EXAMPLE_TESTING_H_
