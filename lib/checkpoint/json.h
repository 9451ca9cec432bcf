// Strict JSON parsing for the checkpoint formats (safetensors headers, the
// manifest, the checkpoint index), on nlohmann-json.
//
// nlohmann-json checks the syntax (RFC 8259, UTF-8, one value and nothing
// after it); this adds what checkpoint readers need on top: a duplicate key
// in an object is an error (the library would keep one of them silently),
// and nesting is bounded. Objects keep their keys in file order.
#ifndef CAPSTAN_LIB_CHECKPOINT_JSON_H_
#define CAPSTAN_LIB_CHECKPOINT_JSON_H_

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"

namespace capstan::checkpoint {

using Json = nlohmann::ordered_json;

constexpr int kMaxJsonDepth = 64;

// Where parse_json() found a key twice: the path from the root to the object
// holding it (object keys, and "[i]" for array elements), and the key.
struct JsonDuplicateKey {
  std::vector<std::string> path;
  std::string key;
};

// Parses `text` as one JSON value. InvalidArgument naming the problem (and
// the byte offset for a syntax error); a duplicate key also fills
// `*duplicate` when it is given.
Result<Json> parse_json(std::string_view text, JsonDuplicateKey* duplicate = nullptr);

// `path` as a field name: {"variables", "[0]", "name"} -> "variables[0].name".
std::string json_field(const std::vector<std::string>& path);

// `s` (valid UTF-8) as a JSON string literal.
std::string json_quote(std::string_view s);

}  // namespace capstan::checkpoint

#endif  // CAPSTAN_LIB_CHECKPOINT_JSON_H_
