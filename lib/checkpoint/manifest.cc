#include "checkpoint/manifest.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <set>
#include <utility>

#include "checkpoint/json.h"
#include "io/crc32c.h"
#include "checkpoint/safetensors.h"
#include "rpc/optimizer_codec.h"

namespace capstan::checkpoint {
namespace {

using internal::is_valid_utf8;

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

// ---------------------------------------------------------------- validation

// A problem with a manifest: the field and what is wrong with it.
struct Problem {
  std::string field;
  std::string why;
};

std::optional<Problem> check_name(const std::string& name, const std::string& field) {
  if (name.empty()) return Problem{field, "is empty"};
  if (!is_valid_utf8(name)) return Problem{field, "is not valid UTF-8"};
  return std::nullopt;
}

std::optional<Problem> find_problem(const Manifest& m) {
  if (m.format_version != kManifestFormatVersion) {
    return Problem{"format_version", "is " + std::to_string(m.format_version) +
                                         "; this version of Capstan reads format " +
                                         std::to_string(kManifestFormatVersion)};
  }
  if (m.step < 0) return Problem{"step", "is negative (" + std::to_string(m.step) + ")"};

  std::set<std::string> files;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& file = m.files[i];
    const std::string field = "files[" + std::to_string(i) + "].name";
    if (auto p = check_name(file.name, field)) return p;
    if (file.name.find('/') != std::string::npos || file.name == "." || file.name == ".." ||
        file.name == kManifestFileName) {
      return Problem{field, in_quotes(file.name) + " is not a data file name in the checkpoint"};
    }
    if (!files.insert(file.name).second)
      return Problem{field, in_quotes(file.name) + " is listed twice"};
  }

  std::set<std::string> variables;
  std::set<std::pair<std::string, std::string>> tensors;  // (file, tensor name)
  for (size_t v = 0; v < m.variables.size(); ++v) {
    const ManifestVariable& var = m.variables[v];
    const std::string at = "variables[" + std::to_string(v) + "]";
    if (auto p = check_name(var.name, at + ".name")) return p;
    if (!variables.insert(var.name).second) {
      return Problem{at + ".name", "variable " + in_quotes(var.name) + " is listed twice"};
    }
    if (var.dtype != DType::kString && dtype_size(var.dtype) == 0) {
      return Problem{at + ".dtype", "is not a valid dtype"};
    }
    for (int64_t dim : var.shape) {
      if (dim < 0)
        return Problem{at + ".shape", shape_string(var.shape) + " has a negative dimension"};
    }
    if (shape_num_elements(var.shape) < 0) return Problem{at + ".shape", "is too large"};
    const int64_t rows = var.shape.empty() ? 1 : var.shape[0];
    if (var.partitioning.empty()) return Problem{at + ".partitioning", "is empty"};
    int64_t total = 0;
    for (int64_t part : var.partitioning) {
      if (part < 0 || __builtin_add_overflow(total, part, &total)) {
        return Problem{at + ".partitioning", "has a negative or too large entry"};
      }
    }
    if (total != rows || (var.shape.empty() && var.partitioning.size() != 1)) {
      return Problem{at + ".partitioning",
                     "covers " + std::to_string(total) + " rows in " +
                         std::to_string(var.partitioning.size()) + " shards, but shape " +
                         shape_string(var.shape) + " has " + std::to_string(rows) +
                         (var.shape.empty() ? " (a scalar is one shard of one row)" : "")};
    }
    if (var.shards.size() != var.partitioning.size()) {
      return Problem{at + ".shards", "has " + std::to_string(var.shards.size()) + " entries for " +
                                         std::to_string(var.partitioning.size()) + " partitions"};
    }
    for (size_t s = 0; s < var.slots.size(); ++s) {
      const std::string field = at + ".slots[" + std::to_string(s) + "]";
      if (auto p = check_name(var.slots[s], field)) return p;
      for (size_t t = 0; t < s; ++t) {
        if (var.slots[t] == var.slots[s])
          return Problem{field, in_quotes(var.slots[s]) + " is listed twice"};
      }
    }
    int64_t first_row = 0;
    for (size_t s = 0; s < var.shards.size(); ++s) {
      const ManifestShard& shard = var.shards[s];
      const std::string field = at + ".shards[" + std::to_string(s) + "]";
      if (auto p = check_name(shard.name, field + ".name")) return p;
      if (files.count(shard.file) == 0) {
        return Problem{field + ".file", in_quotes(shard.file) + " is not in files"};
      }
      if (shard.first_row != first_row) {
        return Problem{field + ".first_row", "is " + std::to_string(shard.first_row) +
                                                 "; the partitioning puts it at " +
                                                 std::to_string(first_row)};
      }
      if (shard.rows != var.partitioning[s]) {
        return Problem{field + ".rows", "is " + std::to_string(shard.rows) +
                                            "; the partitioning says " +
                                            std::to_string(var.partitioning[s])};
      }
      first_row += shard.rows;
      if (!tensors.emplace(shard.file, shard.name).second) {
        return Problem{field + ".name", "tensor " + in_quotes(shard.name) + " of " +
                                            in_quotes(shard.file) + " is used twice"};
      }
      for (const auto& slot : var.slots) {
        if (!tensors.emplace(shard.file, slot_tensor_name(shard.name, slot)).second) {
          return Problem{field + ".name", "tensor " +
                                              in_quotes(slot_tensor_name(shard.name, slot)) +
                                              " of " + in_quotes(shard.file) + " is used twice"};
        }
      }
    }
    if (var.optimizer_step < 0) return Problem{at + ".optimizer_step", "is negative"};
    if (var.table) {
      if (var.shape.size() != 2 || var.shape[1] != var.table->dim || var.table->dim < 1) {
        return Problem{at + ".table.dim", "is " + std::to_string(var.table->dim) + " but the shape is " +
                                             shape_string(var.shape) + " (a table is [rows, dim], dim >= 1)"};
      }
      if (var.table->generation < 0 || var.table->generation > (int64_t{1} << 62)) {
        return Problem{at + ".table.generation", "is " + std::to_string(var.table->generation) + ", not in [0, 2^62]"};
      }
      for (size_t s = 0; s < var.shards.size(); ++s) {
        const ManifestShard& shard = var.shards[s];
        for (const auto& extra : {table_keys_tensor_name(shard.name), table_meta_tensor_name(shard.name)}) {
          if (!tensors.emplace(shard.file, extra).second) {
            return Problem{at + ".shards[" + std::to_string(s) + "].name",
                           "tensor " + in_quotes(extra) + " of " + in_quotes(shard.file) + " is used twice"};
          }
        }
      }
    }
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- writing

std::string json_double(double value) {
  if (std::isnan(value)) return "\"NaN\"";
  if (std::isinf(value)) return value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  // "-0" would read back as the integer 0: keep the sign with a fraction.
  if (value == 0 && std::signbit(value)) return "-0.0";
  char buf[64];
  auto [end, error] = std::to_chars(buf, buf + sizeof(buf), value);
  (void)error;  // 64 bytes hold any double
  return std::string(buf, end);
}

std::string json_int_list(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

std::string json_string_list(const std::vector<std::string>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += json_quote(values[i]);
  }
  return out + "]";
}

// {"kind": "cosine_decay", "decay_steps": 1000, "alpha": 0}: the fields
// the kind uses.
std::string schedule_json(const LearningRateSchedule& s) {
  using ScheduleKind = LearningRateSchedule::Kind;
  std::string out = "{\"kind\": " + json_quote(learning_rate_schedule_name(s.kind));
  switch (s.kind) {
    case ScheduleKind::kConstant:
      break;
    case ScheduleKind::kExponentialDecay:
      out += ", \"decay_steps\": " + std::to_string(s.decay_steps) + ", \"decay_rate\": " + json_double(s.decay_rate) +
             ", \"staircase\": " + (s.staircase ? "true" : "false");
      break;
    case ScheduleKind::kPiecewiseConstantDecay: {
      out += ", \"boundaries\": " + json_int_list(s.boundaries) + ", \"values\": [";
      for (size_t i = 0; i < s.values.size(); ++i) out += (i ? ", " : "") + json_double(s.values[i]);
      out += "]";
      break;
    }
    case ScheduleKind::kCosineDecay:
      out += ", \"decay_steps\": " + std::to_string(s.decay_steps) + ", \"alpha\": " + json_double(s.alpha);
      break;
  }
  return out + "}";
}

// ---------------------------------------------------------------- parsing

// Typed access to a parsed JSON tree; every error is DataLoss naming the
// source and the field.
class Fields {
 public:
  explicit Fields(std::string what) : what_(std::move(what)) {}

  Status error(const std::string& field, const std::string& why) const {
    return Status::DataLoss(what_ + ": " + field + ": " + why);
  }

  // Checks that `node` is an object whose keys are all in `known` (each
  // appears once: parse_json refuses duplicates).
  Status object(const Json& node, const std::string& field,
                std::initializer_list<std::string_view> known) const {
    if (!node.is_object()) return error(field, "expected an object");
    for (const auto& [key, value] : node.items()) {
      bool is_known = false;
      for (std::string_view k : known) is_known = is_known || k == key;
      if (!is_known) return error(join(field, key), "unknown field");
    }
    return Status::Ok();
  }

  // The member `key` of an object, which must be there.
  Result<const Json*> member(const Json& node, const std::string& field, const std::string& key) const {
    auto it = node.find(key);
    if (it == node.end()) return error(join(field, key), "missing");
    return &*it;
  }

  Result<std::string> string(const Json* node, const std::string& field) const {
    if (!node->is_string()) return error(field, "expected a string");
    return node->get<std::string>();
  }

  Result<int64_t> int64(const Json* node, const std::string& field) const {
    if (!node->is_number_integer() || (node->is_number_unsigned() && node->get<uint64_t>() > INT64_MAX)) {
      return error(field, "expected an integer");
    }
    return node->get<int64_t>();
  }

  Result<uint64_t> uint64(const Json* node, const std::string& field) const {
    if (!node->is_number_unsigned()) return error(field, "expected a non-negative integer");
    return node->get<uint64_t>();
  }

  // A number; the strings "NaN", "Infinity" and "-Infinity" for the values
  // JSON cannot write.
  Result<double> number(const Json* node, const std::string& field) const {
    if (node->is_number()) return node->get<double>();
    if (node->is_string()) {
      const std::string& s = node->get_ref<const std::string&>();
      if (s == "NaN") return std::nan("");
      if (s == "Infinity") return HUGE_VAL;
      if (s == "-Infinity") return -HUGE_VAL;
    }
    return error(field, "expected a number");
  }

  Result<bool> boolean(const Json* node, const std::string& field) const {
    if (!node->is_boolean()) return error(field, "expected true or false");
    return node->get<bool>();
  }

  Result<std::vector<int64_t>> int_list(const Json* node, const std::string& field) const {
    if (!node->is_array()) return error(field, "expected a list of integers");
    std::vector<int64_t> out;
    for (size_t i = 0; i < node->size(); ++i) {
      CAPSTAN_ASSIGN_OR_RETURN(int64_t v, int64(&(*node)[i], field + "[" + std::to_string(i) + "]"));
      out.push_back(v);
    }
    return out;
  }

  Result<std::vector<double>> number_list(const Json* node, const std::string& field) const {
    if (!node->is_array()) return error(field, "expected a list of numbers");
    std::vector<double> out;
    for (size_t i = 0; i < node->size(); ++i) {
      CAPSTAN_ASSIGN_OR_RETURN(double v, number(&(*node)[i], field + "[" + std::to_string(i) + "]"));
      out.push_back(v);
    }
    return out;
  }

  Result<std::vector<std::string>> string_list(const Json* node, const std::string& field) const {
    if (!node->is_array()) return error(field, "expected a list of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < node->size(); ++i) {
      CAPSTAN_ASSIGN_OR_RETURN(std::string v, string(&(*node)[i], field + "[" + std::to_string(i) + "]"));
      out.push_back(std::move(v));
    }
    return out;
  }

  Result<const Json*> list(const Json* node, const std::string& field) const {
    if (!node->is_array()) return error(field, "expected a list");
    return node;
  }

  static std::string join(const std::string& field, const std::string& key) {
    return field.empty() ? key : field + "." + key;
  }

 private:
  std::string what_;
};

// Parses `json` strictly (a duplicate key is an error naming its field).
Result<Json> load_json(const std::string& json, const Fields& fields) {
  JsonDuplicateKey duplicate;
  auto parsed = parse_json(json, &duplicate);
  if (parsed.ok()) return parsed;
  if (!duplicate.key.empty()) {
    duplicate.path.push_back(duplicate.key);
    return fields.error(json_field(duplicate.path), "appears twice");
  }
  return fields.error("(document)", "not valid JSON: " + parsed.status().message());
}

Result<ManifestTable> parse_table(const Json& node, const std::string& at, const Fields& f) {
  CAPSTAN_RETURN_IF_ERROR(f.object(node, at,
                                   {"dim", "initializer", "min_count", "admit_probability", "ttl_steps",
                                    "ttl_seconds", "max_rows", "max_bytes", "eviction", "default_value",
                                    "generation"}));
  ManifestTable t;
  auto integer = [&](const Json& in, const std::string& field_at, const char* key, int64_t* out) -> Status {
    CAPSTAN_ASSIGN_OR_RETURN(auto n, f.member(in, field_at, key));
    CAPSTAN_ASSIGN_OR_RETURN(*out, f.int64(n, field_at + "." + key));
    return Status::Ok();
  };
  auto real = [&](const Json& in, const std::string& field_at, const char* key, double* out) -> Status {
    CAPSTAN_ASSIGN_OR_RETURN(auto n, f.member(in, field_at, key));
    CAPSTAN_ASSIGN_OR_RETURN(*out, f.number(n, field_at + "." + key));
    return Status::Ok();
  };
  auto text = [&](const Json& in, const std::string& field_at, const char* key, std::string* out) -> Status {
    CAPSTAN_ASSIGN_OR_RETURN(auto n, f.member(in, field_at, key));
    CAPSTAN_ASSIGN_OR_RETURN(*out, f.string(n, field_at + "." + key));
    return Status::Ok();
  };
  CAPSTAN_RETURN_IF_ERROR(integer(node, at, "dim", &t.dim));
  const std::string iat = at + ".initializer";
  CAPSTAN_ASSIGN_OR_RETURN(auto init, f.member(node, at, "initializer"));
  CAPSTAN_RETURN_IF_ERROR(f.object(*init, iat, {"kind", "value", "mean", "stddev", "seed"}));
  CAPSTAN_RETURN_IF_ERROR(text(*init, iat, "kind", &t.initializer.kind));
  CAPSTAN_RETURN_IF_ERROR(real(*init, iat, "value", &t.initializer.value));
  CAPSTAN_RETURN_IF_ERROR(real(*init, iat, "mean", &t.initializer.mean));
  CAPSTAN_RETURN_IF_ERROR(real(*init, iat, "stddev", &t.initializer.stddev));
  CAPSTAN_ASSIGN_OR_RETURN(auto seed, f.member(*init, iat, "seed"));
  CAPSTAN_ASSIGN_OR_RETURN(t.initializer.seed, f.uint64(seed, iat + ".seed"));
  EmbeddingTableOptions& o = t.options;
  CAPSTAN_RETURN_IF_ERROR(integer(node, at, "min_count", &o.min_count));
  CAPSTAN_RETURN_IF_ERROR(real(node, at, "admit_probability", &o.admit_probability));
  CAPSTAN_RETURN_IF_ERROR(integer(node, at, "ttl_steps", &o.ttl_steps));
  CAPSTAN_RETURN_IF_ERROR(integer(node, at, "ttl_seconds", &o.ttl_seconds));
  CAPSTAN_RETURN_IF_ERROR(integer(node, at, "max_rows", &o.max_rows));
  CAPSTAN_RETURN_IF_ERROR(integer(node, at, "max_bytes", &o.max_bytes));
  CAPSTAN_RETURN_IF_ERROR(text(node, at, "eviction", &o.eviction));
  CAPSTAN_RETURN_IF_ERROR(real(node, at, "default_value", &o.default_value));
  CAPSTAN_RETURN_IF_ERROR(integer(node, at, "generation", &t.generation));
  return t;
}

// The optimizer's "schedule": the fields its kind uses, all of them, and no
// other.
Result<LearningRateSchedule> parse_schedule(const Json& node, const std::string& at, const Fields& f) {
  using ScheduleKind = LearningRateSchedule::Kind;
  if (!node.is_object()) return f.error(at, "expected an object");
  CAPSTAN_ASSIGN_OR_RETURN(auto kind_node, f.member(node, at, "kind"));
  CAPSTAN_ASSIGN_OR_RETURN(std::string kind_name, f.string(kind_node, at + ".kind"));
  auto kind = learning_rate_schedule_kind_from_name(kind_name);
  if (!kind) return f.error(at + ".kind", "unknown learning rate schedule " + in_quotes(kind_name));
  LearningRateSchedule s;
  s.kind = *kind;
  auto get = [&](const char* key) { return f.member(node, at, key); };
  const std::string dot = at + ".";
  switch (s.kind) {
    case ScheduleKind::kConstant:
      CAPSTAN_RETURN_IF_ERROR(f.object(node, at, {"kind"}));
      break;
    case ScheduleKind::kExponentialDecay: {
      CAPSTAN_RETURN_IF_ERROR(f.object(node, at, {"kind", "decay_steps", "decay_rate", "staircase"}));
      CAPSTAN_ASSIGN_OR_RETURN(auto steps, get("decay_steps"));
      CAPSTAN_ASSIGN_OR_RETURN(s.decay_steps, f.int64(steps, dot + "decay_steps"));
      CAPSTAN_ASSIGN_OR_RETURN(auto rate, get("decay_rate"));
      CAPSTAN_ASSIGN_OR_RETURN(s.decay_rate, f.number(rate, dot + "decay_rate"));
      CAPSTAN_ASSIGN_OR_RETURN(auto staircase, get("staircase"));
      CAPSTAN_ASSIGN_OR_RETURN(s.staircase, f.boolean(staircase, dot + "staircase"));
      break;
    }
    case ScheduleKind::kPiecewiseConstantDecay: {
      CAPSTAN_RETURN_IF_ERROR(f.object(node, at, {"kind", "boundaries", "values"}));
      CAPSTAN_ASSIGN_OR_RETURN(auto boundaries, get("boundaries"));
      CAPSTAN_ASSIGN_OR_RETURN(s.boundaries, f.int_list(boundaries, dot + "boundaries"));
      CAPSTAN_ASSIGN_OR_RETURN(auto values, get("values"));
      CAPSTAN_ASSIGN_OR_RETURN(s.values, f.number_list(values, dot + "values"));
      break;
    }
    case ScheduleKind::kCosineDecay: {
      CAPSTAN_RETURN_IF_ERROR(f.object(node, at, {"kind", "decay_steps", "alpha"}));
      CAPSTAN_ASSIGN_OR_RETURN(auto steps, get("decay_steps"));
      CAPSTAN_ASSIGN_OR_RETURN(s.decay_steps, f.int64(steps, dot + "decay_steps"));
      CAPSTAN_ASSIGN_OR_RETURN(auto alpha, get("alpha"));
      CAPSTAN_ASSIGN_OR_RETURN(s.alpha, f.number(alpha, dot + "alpha"));
      break;
    }
  }
  return s;
}

Result<ManifestVariable> parse_variable(const Json& node, const std::string& at,
                                        const Fields& f) {
  CAPSTAN_RETURN_IF_ERROR(f.object(node, at,
                                   {"name", "dtype", "shape", "partitioning", "shards", "optimizer",
                                    "slots", "optimizer_step", "table"}));
  ManifestVariable var;
  CAPSTAN_ASSIGN_OR_RETURN(auto name, f.member(node, at, "name"));
  CAPSTAN_ASSIGN_OR_RETURN(var.name, f.string(name, at + ".name"));
  CAPSTAN_ASSIGN_OR_RETURN(auto dtype, f.member(node, at, "dtype"));
  CAPSTAN_ASSIGN_OR_RETURN(std::string dtype_text, f.string(dtype, at + ".dtype"));
  auto parsed_dtype = dtype_from_name(dtype_text);
  if (!parsed_dtype || *parsed_dtype == DType::kInvalid) {
    return f.error(at + ".dtype", "unknown dtype " + in_quotes(dtype_text));
  }
  var.dtype = *parsed_dtype;
  CAPSTAN_ASSIGN_OR_RETURN(auto shape, f.member(node, at, "shape"));
  CAPSTAN_ASSIGN_OR_RETURN(var.shape, f.int_list(shape, at + ".shape"));
  CAPSTAN_ASSIGN_OR_RETURN(auto partitioning, f.member(node, at, "partitioning"));
  CAPSTAN_ASSIGN_OR_RETURN(var.partitioning, f.int_list(partitioning, at + ".partitioning"));

  CAPSTAN_ASSIGN_OR_RETURN(auto shards_node, f.member(node, at, "shards"));
  CAPSTAN_ASSIGN_OR_RETURN(auto shards, f.list(shards_node, at + ".shards"));
  for (size_t s = 0; s < shards->size(); ++s) {
    const std::string sat = at + ".shards[" + std::to_string(s) + "]";
    const Json& shard_node = (*shards)[s];
    CAPSTAN_RETURN_IF_ERROR(f.object(shard_node, sat, {"name", "file", "first_row", "rows"}));
    ManifestShard shard;
    CAPSTAN_ASSIGN_OR_RETURN(auto shard_name_node, f.member(shard_node, sat, "name"));
    CAPSTAN_ASSIGN_OR_RETURN(shard.name, f.string(shard_name_node, sat + ".name"));
    CAPSTAN_ASSIGN_OR_RETURN(auto file, f.member(shard_node, sat, "file"));
    CAPSTAN_ASSIGN_OR_RETURN(shard.file, f.string(file, sat + ".file"));
    CAPSTAN_ASSIGN_OR_RETURN(auto first_row, f.member(shard_node, sat, "first_row"));
    CAPSTAN_ASSIGN_OR_RETURN(shard.first_row, f.int64(first_row, sat + ".first_row"));
    CAPSTAN_ASSIGN_OR_RETURN(auto rows, f.member(shard_node, sat, "rows"));
    CAPSTAN_ASSIGN_OR_RETURN(shard.rows, f.int64(rows, sat + ".rows"));
    var.shards.push_back(std::move(shard));
  }

  const std::string oat = at + ".optimizer";
  CAPSTAN_ASSIGN_OR_RETURN(auto optimizer, f.member(node, at, "optimizer"));
  CAPSTAN_RETURN_IF_ERROR(f.object(*optimizer, oat, {"kind", "hyperparameters", "nesterov", "schedule"}));
  CAPSTAN_ASSIGN_OR_RETURN(auto kind, f.member(*optimizer, oat, "kind"));
  CAPSTAN_ASSIGN_OR_RETURN(std::string kind_name, f.string(kind, oat + ".kind"));
  auto parsed_kind = kind_name.empty() ? Optimizer::Kind::kNone : optimizer_kind_from_name(kind_name);
  if (!parsed_kind) return f.error(oat + ".kind", "unknown optimizer " + in_quotes(kind_name));
  var.optimizer.kind = *parsed_kind;
  CAPSTAN_ASSIGN_OR_RETURN(auto hyper, f.member(*optimizer, oat, "hyperparameters"));
  if (!hyper->is_object()) return f.error(oat + ".hyperparameters", "expected an object");
  const auto fields = rpc::optimizer_fields();
  for (const auto& entry : hyper->items()) {
    const std::string& key = entry.key();
    const Json& item = entry.value();
    const std::string field = oat + ".hyperparameters." + key;
    auto known = std::find_if(fields.begin(), fields.end(), [&key](const auto& f) { return f.name == key; });
    if (known == fields.end()) return f.error(field, "unknown hyperparameter");
    CAPSTAN_ASSIGN_OR_RETURN(var.optimizer.*known->value, f.number(&item, field));
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto nesterov, f.member(*optimizer, oat, "nesterov"));
  CAPSTAN_ASSIGN_OR_RETURN(var.optimizer.nesterov, f.boolean(nesterov, oat + ".nesterov"));
  if (auto schedule = optimizer->find("schedule"); schedule != optimizer->end()) {  // absent: constant
    CAPSTAN_ASSIGN_OR_RETURN(var.optimizer.schedule, parse_schedule(*schedule, oat + ".schedule", f));
  }

  CAPSTAN_ASSIGN_OR_RETURN(auto slots, f.member(node, at, "slots"));
  CAPSTAN_ASSIGN_OR_RETURN(var.slots, f.string_list(slots, at + ".slots"));
  CAPSTAN_ASSIGN_OR_RETURN(auto step, f.member(node, at, "optimizer_step"));
  CAPSTAN_ASSIGN_OR_RETURN(var.optimizer_step, f.int64(step, at + ".optimizer_step"));
  if (node.contains("table")) {
    CAPSTAN_ASSIGN_OR_RETURN(var.table, parse_table(node.at("table"), at + ".table", f));
  }
  return var;
}

}  // namespace

std::string table_keys_tensor_name(std::string_view shard) { return std::string(shard) + "/keys"; }
std::string table_meta_tensor_name(std::string_view shard) { return std::string(shard) + "/meta"; }

std::string shard_name(std::string_view variable, size_t part) {
  return std::string(variable) + "/part_" + std::to_string(part);
}

std::string slot_tensor_name(std::string_view shard, std::string_view slot) {
  return std::string(shard) + "/slot/" + std::string(slot);
}

const ManifestVariable* Manifest::find_variable(std::string_view name) const {
  for (const auto& var : variables) {
    if (var.name == name) return &var;
  }
  return nullptr;
}

Status validate_manifest(const Manifest& manifest) {
  if (auto p = find_problem(manifest)) {
    return Status::InvalidArgument("invalid manifest: " + p->field + ": " + p->why);
  }
  return Status::Ok();
}

std::string to_json(const Manifest& m) {
  std::string out = "{\n";
  out += "  \"format_version\": " + std::to_string(m.format_version) + ",\n";
  out += "  \"step\": " + std::to_string(m.step) + ",\n";
  out += "  \"variables\": [";
  for (size_t v = 0; v < m.variables.size(); ++v) {
    const ManifestVariable& var = m.variables[v];
    out += v == 0 ? "\n" : ",\n";
    out += "    {\n";
    out += "      \"name\": " + json_quote(var.name) + ",\n";
    out += "      \"dtype\": " + json_quote(dtype_name(var.dtype)) + ",\n";
    out += "      \"shape\": " + json_int_list(var.shape) + ",\n";
    out += "      \"partitioning\": " + json_int_list(var.partitioning) + ",\n";
    out += "      \"shards\": [";
    for (size_t s = 0; s < var.shards.size(); ++s) {
      const ManifestShard& shard = var.shards[s];
      out += s == 0 ? "\n" : ",\n";
      out += "        {\"name\": " + json_quote(shard.name) +
             ", \"file\": " + json_quote(shard.file) +
             ", \"first_row\": " + std::to_string(shard.first_row) +
             ", \"rows\": " + std::to_string(shard.rows) + "}";
    }
    out += var.shards.empty() ? "],\n" : "\n      ],\n";
    const bool none = var.optimizer.kind == Optimizer::Kind::kNone;
    out += "      \"optimizer\": {\"kind\": " + json_quote(none ? "" : optimizer_name(var.optimizer.kind)) +
           ", \"hyperparameters\": {";
    bool first = true;
    for (const auto& field : rpc::optimizer_fields(var.optimizer.kind)) {
      out += first ? "" : ", ";
      first = false;
      out += json_quote(field.name) + ": " + json_double(var.optimizer.*field.value);
    }
    out += std::string("}, \"nesterov\": ") + (var.optimizer.nesterov ? "true" : "false");
    // Only a schedule other than constant: a manifest without one reads
    // in versions older than schedules.
    if (var.optimizer.schedule.kind != LearningRateSchedule::Kind::kConstant) {
      out += ", \"schedule\": " + schedule_json(var.optimizer.schedule);
    }
    out += "},\n";
    out += "      \"slots\": " + json_string_list(var.slots) + ",\n";
    out += "      \"optimizer_step\": " + std::to_string(var.optimizer_step);
    if (var.table) {
      const ManifestTable& t = *var.table;
      const EmbeddingTableOptions& o = t.options;
      out += ",\n      \"table\": {\"dim\": " + std::to_string(t.dim) +
             ", \"initializer\": {\"kind\": " + json_quote(t.initializer.kind) +
             ", \"value\": " + json_double(t.initializer.value) + ", \"mean\": " + json_double(t.initializer.mean) +
             ", \"stddev\": " + json_double(t.initializer.stddev) +
             ", \"seed\": " + std::to_string(t.initializer.seed) + "}" +
             ", \"min_count\": " + std::to_string(o.min_count) +
             ", \"admit_probability\": " + json_double(o.admit_probability) +
             ", \"ttl_steps\": " + std::to_string(o.ttl_steps) + ", \"ttl_seconds\": " + std::to_string(o.ttl_seconds) +
             ", \"max_rows\": " + std::to_string(o.max_rows) + ", \"max_bytes\": " + std::to_string(o.max_bytes) +
             ", \"eviction\": " + json_quote(o.eviction) + ", \"default_value\": " + json_double(o.default_value) +
             ", \"generation\": " + std::to_string(t.generation) + "}";
    }
    out += "\n    }";
  }
  out += m.variables.empty() ? "],\n" : "\n  ],\n";
  out += "  \"files\": [";
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& file = m.files[i];
    out += i == 0 ? "\n" : ",\n";
    out += "    {\"name\": " + json_quote(file.name) + ", \"size\": " + std::to_string(file.size) +
           ", \"crc32c\": " + std::to_string(file.crc32c) + "}";
  }
  out += m.files.empty() ? "]\n" : "\n  ]\n";
  out += "}\n";
  return out;
}

std::string to_json_with_checksum(const Manifest& manifest) {
  const std::string body = to_json(manifest);  // "{\n  \"format_version\": ..."
  const uint32_t crc = io::crc32c(body.data(), body.size());
  return "{\n  \"manifest_crc32c\": " + std::to_string(crc) + "," + body.substr(1);
}

Result<Manifest> parse_manifest(const std::string& json, const std::string& source_name) {
  Fields f("bad manifest '" + source_name + "'");
  CAPSTAN_ASSIGN_OR_RETURN(Json root, load_json(json, f));
  Manifest m;
  // The version first: a newer format may differ in anything else.
  if (!root.is_object()) return f.error("(document)", "expected an object");
  CAPSTAN_ASSIGN_OR_RETURN(auto version, f.member(root, "", "format_version"));
  CAPSTAN_ASSIGN_OR_RETURN(m.format_version, f.int64(version, "format_version"));
  if (m.format_version != kManifestFormatVersion) {
    return Status::InvalidArgument(
        "manifest '" + source_name + "' has format_version " + std::to_string(m.format_version) +
        "; this version of Capstan reads format " + std::to_string(kManifestFormatVersion));
  }
  CAPSTAN_RETURN_IF_ERROR(f.object(root, "", {"manifest_crc32c", "format_version", "step", "variables", "files"}));
  CAPSTAN_ASSIGN_OR_RETURN(auto step, f.member(root, "", "step"));
  CAPSTAN_ASSIGN_OR_RETURN(m.step, f.int64(step, "step"));

  CAPSTAN_ASSIGN_OR_RETURN(auto variables_node, f.member(root, "", "variables"));
  CAPSTAN_ASSIGN_OR_RETURN(auto variables, f.list(variables_node, "variables"));
  for (size_t v = 0; v < variables->size(); ++v) {
    CAPSTAN_ASSIGN_OR_RETURN(
        auto var, parse_variable((*variables)[v], "variables[" + std::to_string(v) + "]", f));
    m.variables.push_back(std::move(var));
  }

  CAPSTAN_ASSIGN_OR_RETURN(auto files_node, f.member(root, "", "files"));
  CAPSTAN_ASSIGN_OR_RETURN(auto files, f.list(files_node, "files"));
  for (size_t i = 0; i < files->size(); ++i) {
    const std::string at = "files[" + std::to_string(i) + "]";
    const Json& node = (*files)[i];
    CAPSTAN_RETURN_IF_ERROR(f.object(node, at, {"name", "size", "crc32c"}));
    ManifestFile file;
    CAPSTAN_ASSIGN_OR_RETURN(auto name, f.member(node, at, "name"));
    CAPSTAN_ASSIGN_OR_RETURN(file.name, f.string(name, at + ".name"));
    CAPSTAN_ASSIGN_OR_RETURN(auto size, f.member(node, at, "size"));
    CAPSTAN_ASSIGN_OR_RETURN(file.size, f.uint64(size, at + ".size"));
    CAPSTAN_ASSIGN_OR_RETURN(auto crc_node, f.member(node, at, "crc32c"));
    CAPSTAN_ASSIGN_OR_RETURN(uint64_t crc, f.uint64(crc_node, at + ".crc32c"));
    if (crc > UINT32_MAX) return f.error(at + ".crc32c", "does not fit 32 bits");
    file.crc32c = static_cast<uint32_t>(crc);
    m.files.push_back(std::move(file));
  }

  if (auto p = find_problem(m)) return f.error(p->field, p->why);
  if (root.contains("manifest_crc32c")) {
    CAPSTAN_ASSIGN_OR_RETURN(auto stored_node, f.member(root, "", "manifest_crc32c"));
    CAPSTAN_ASSIGN_OR_RETURN(uint64_t stored, f.uint64(stored_node, "manifest_crc32c"));
    const std::string canonical = to_json(m);
    const uint32_t computed = io::crc32c(canonical.data(), canonical.size());
    if (stored != computed) {
      return Status::DataLoss("manifest '" + source_name + "' fails its checksum (manifest_crc32c " +
                              std::to_string(stored) + ", computed " + std::to_string(computed) +
                              "): the file was changed or damaged; restore another checkpoint");
    }
  }
  return m;
}

std::string to_json(const CheckpointIndex& index) {
  return "{\"latest\": " + json_quote(index.latest) +
         ", \"kept\": " + json_string_list(index.kept) + "}\n";
}

Result<CheckpointIndex> parse_checkpoint_index(const std::string& json,
                                               const std::string& source_name) {
  Fields f("bad checkpoint index '" + source_name + "'");
  CAPSTAN_ASSIGN_OR_RETURN(Json root, load_json(json, f));
  CAPSTAN_RETURN_IF_ERROR(f.object(root, "", {"latest", "kept"}));
  CheckpointIndex index;
  CAPSTAN_ASSIGN_OR_RETURN(auto latest, f.member(root, "", "latest"));
  CAPSTAN_ASSIGN_OR_RETURN(index.latest, f.string(latest, "latest"));
  CAPSTAN_ASSIGN_OR_RETURN(auto kept, f.member(root, "", "kept"));
  CAPSTAN_ASSIGN_OR_RETURN(index.kept, f.string_list(kept, "kept"));
  if (index.kept.empty() || index.kept.back() != index.latest) {
    return f.error("latest", in_quotes(index.latest) + " is not the last of the kept checkpoints");
  }
  return index;
}

}  // namespace capstan::checkpoint
