#include "data/ops/csv.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "data/string_builder.h"

namespace capstan::data {
namespace {

// Messages show at most this much of a field or record.
constexpr size_t kMaxShownBytes = 80;

// `text` as an error message shows it: in single quotes, bytes outside
// printable ASCII escaped, long text cut short.
std::string shown(std::string_view text) {
  std::string out = quoted_prefix(text, kMaxShownBytes);
  if (text.size() > kMaxShownBytes) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// What to do with one output field, from CsvSpec.
struct FieldPlan {
  DType dtype = DType::kInvalid;
  int64_t column = 0;   // its column in the record
  bool required = false;
  // The default, in the member that matches dtype.
  int32_t default_int32 = 0;
  int64_t default_int64 = 0;
  float default_float = 0;
  double default_double = 0;
  std::string default_string;
};

Result<std::vector<FieldPlan>> plan_fields(const CsvSpec& spec) {
  if (spec.record_defaults.empty()) {
    return Status::InvalidArgument("decode_csv: record_defaults must have one entry per field");
  }
  if (spec.field_delim.size() != 1) {
    return Status::InvalidArgument("decode_csv: field_delim should be exactly 1 char, got " +
                                   shown(spec.field_delim));
  }
  if (spec.use_quote_delim && spec.field_delim[0] == '"') {
    return Status::InvalidArgument(
        "decode_csv: field_delim cannot be '\"' when use_quote_delim is true");
  }
  const auto& select = spec.select_cols;
  if (!select.empty() && select.size() != spec.record_defaults.size()) {
    return Status::InvalidArgument("decode_csv: select_cols has " +
                                   std::to_string(select.size()) + " columns but record_defaults " +
                                   std::to_string(spec.record_defaults.size()) +
                                   " fields; they should match");
  }
  if (!select.empty() && select.front() < 0) {
    return Status::InvalidArgument("decode_csv: select_cols should be non-negative indices, got " +
                                   std::to_string(select.front()));
  }
  for (size_t i = 1; i < select.size(); ++i) {
    if (select[i - 1] >= select[i]) {
      return Status::InvalidArgument(
          "decode_csv: select_cols should be strictly increasing indices, got " +
          std::to_string(select[i - 1]) + " before " + std::to_string(select[i]));
    }
  }

  std::vector<FieldPlan> plans(spec.record_defaults.size());
  for (size_t f = 0; f < plans.size(); ++f) {
    const Tensor& def = spec.record_defaults[f];
    FieldPlan& plan = plans[f];
    plan.dtype = def.dtype();
    plan.column = select.empty() ? static_cast<int64_t>(f) : select[f];
    std::string where = "decode_csv: record_defaults[" + std::to_string(f) + "]";
    switch (def.dtype()) {
      case DType::kInt32:
      case DType::kInt64:
      case DType::kFloat32:
      case DType::kFloat64:
      case DType::kString:
        break;
      default:
        return Status::InvalidArgument(where + " has dtype " + std::string(dtype_name(def.dtype())) +
                                       "; CSV fields may be int32, int64, float32, float64 or "
                                       "string");
    }
    // TF accepts a scalar, [1] (a default) or [0] (required).
    if (def.rank() > 1 || def.num_elements() > 1) {
      return Status::InvalidArgument(where + " should be a scalar default or an empty tensor, got "
                                     "shape " + shape_string(def.shape()));
    }
    plan.required = def.num_elements() == 0;
    if (plan.required) continue;
    switch (def.dtype()) {
      case DType::kInt32: plan.default_int32 = def.flat<int32_t>()[0]; break;
      case DType::kInt64: plan.default_int64 = def.flat<int64_t>()[0]; break;
      case DType::kFloat32: plan.default_float = def.flat<float>()[0]; break;
      case DType::kFloat64: plan.default_double = def.flat<double>()[0]; break;
      default: plan.default_string = std::string(def.string_at(0)); break;
    }
  }
  return plans;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// The part of a numeric field that must parse: TF allows spaces around a
// number, and a leading '+'.
std::string_view number_text(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  if (s.size() > 1 && s[0] == '+' && s[1] != '+' && s[1] != '-') s.remove_prefix(1);
  return s;
}

template <typename Int>
bool parse_int(std::string_view text, Int* value) {
  std::string_view s = number_text(text);
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, *value);
  return !s.empty() && ec == std::errc() && ptr == end;
}

// Accepts decimal and exponent notation, "inf", "infinity" and "nan" in any
// case. Out-of-range values become +-inf or 0 (a denormal where it can), as
// with strtod and TF.
template <typename Float>
bool parse_float(std::string_view text, Float* value) {
  std::string_view s = number_text(text);
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  Float parsed;
  auto [ptr, ec] = std::from_chars(s.data(), end, parsed);
  if (ptr != end) return false;
  if (ec == std::errc()) {
    *value = parsed;
    return true;
  }
  if (ec != std::errc::result_out_of_range) return false;
  std::string copy(s);  // rare: strtod needs a terminated string
  if constexpr (std::is_same_v<Float, float>) {
    *value = std::strtof(copy.c_str(), nullptr);
  } else {
    *value = std::strtod(copy.c_str(), nullptr);
  }
  return true;
}

// Splits records into the selected fields. Reuses its scratch space from
// record to record; one per decode_csv call (not thread-safe).
class FieldSplitter {
 public:
  FieldSplitter(const CsvSpec& spec, size_t num_fields)
      : delim_(spec.field_delim[0]),
        quotes_(spec.use_quote_delim),
        trim_(spec.trim_whitespace),
        select_(spec.select_cols),
        fields_(num_fields),
        unescaped_(num_fields) {}

  // Splits `record`; sets `*count` to the number of selected fields found,
  // which may be more or fewer than num_fields. field(f) for f below both
  // is the f-th one, pointing into `record` or into this splitter, valid
  // until the next split().
  Status split(std::string_view record, int64_t record_index, size_t* count) {
    *count = 0;
    if (record.empty()) return Status::Ok();  // TF: an empty record has no fields
    size_t pos = 0;
    size_t next_select = 0;
    for (int64_t column = 0;; ++column) {
      bool keep = select_.empty() || select_[next_select] == column;
      bool store = keep && *count < fields_.size();
      std::string_view text;
      CAPSTAN_RETURN_IF_ERROR(next_field(record, record_index, column,
                                         store ? &unescaped_[*count] : nullptr, &pos, &text));
      if (keep) {
        if (store) fields_[*count] = text;
        ++*count;
        // TF does not look past the last selected column.
        if (!select_.empty() && ++next_select == select_.size()) return Status::Ok();
      }
      if (pos == record.size()) return Status::Ok();
      ++pos;  // the delimiter; a field follows it, if only an empty one
    }
  }

  std::string_view field(size_t f) const { return fields_[f]; }

 private:
  bool is_blank(char c) const { return (c == ' ' || c == '\t') && c != delim_; }

  static Status syntax_error(int64_t record_index, int64_t column, std::string_view what,
                             std::string_view text) {
    return Status::InvalidArgument("Record " + std::to_string(record_index) + ", column " +
                                   std::to_string(column) + ": " + std::string(what) + ": " +
                                   shown(text));
  }

  // Reads the field at `*pos`, leaving `*pos` at the delimiter after it or
  // at the end. A quoted field with escaped quotes is unescaped into
  // `*scratch` when that is given (else its text is not needed).
  Status next_field(std::string_view record, int64_t record_index, int64_t column,
                    std::string* scratch, size_t* pos, std::string_view* text) const {
    const size_t n = record.size();
    size_t p = *pos;
    if (trim_) {
      while (p < n && is_blank(record[p])) ++p;
    }
    if (!quotes_ || p == n || record[p] != '"') {
      size_t start = p;
      for (; p < n && record[p] != delim_; ++p) {
        char c = record[p];
        if ((quotes_ && c == '"') || c == '\n' || c == '\r') {
          size_t end = record.find(delim_, p);
          return syntax_error(record_index, column, "Unquoted fields cannot have quotes/CRLFs inside",
                              record.substr(start, end == std::string_view::npos ? n - start
                                                                                 : end - start));
        }
      }
      std::string_view body = record.substr(start, p - start);
      if (trim_) {
        while (!body.empty() && is_blank(body.back())) body.remove_suffix(1);
      }
      *text = body;
      *pos = p;
      return Status::Ok();
    }

    const size_t open = p++;
    const size_t start = p;
    bool escaped = false;
    if (scratch != nullptr) scratch->clear();
    for (;;) {
      size_t quote = record.find('"', p);
      if (quote == std::string_view::npos) {
        return syntax_error(record_index, column,
                            "Quoted field has to end with quote followed by delim or end",
                            record.substr(open));
      }
      if (scratch != nullptr) scratch->append(record.substr(p, quote - p));
      if (quote + 1 < n && record[quote + 1] == '"') {  // "" stands for one quote
        if (scratch != nullptr) scratch->push_back('"');
        escaped = true;
        p = quote + 2;
        continue;
      }
      p = quote + 1;
      if (trim_) {
        while (p < n && is_blank(record[p])) ++p;
      }
      if (p < n && record[p] != delim_) {
        size_t end = record.find(delim_, p);
        return syntax_error(record_index, column,
                            "Quote inside a string has to be escaped by another quote",
                            record.substr(open, end == std::string_view::npos ? n - open : end - open));
      }
      if (escaped && scratch != nullptr) {
        *text = *scratch;
      } else {
        *text = record.substr(start, quote - start);
      }
      *pos = p;
      return Status::Ok();
    }
  }

  const char delim_;
  const bool quotes_;
  const bool trim_;
  const std::vector<int64_t>& select_;
  std::vector<std::string_view> fields_;
  std::vector<std::string> unescaped_;  // per field; reused across records
};

// Output buffers, one per field: a typed pointer into a numeric tensor or a
// StringTensorBuilder.
struct FieldOutput {
  Tensor tensor;
  void* data = nullptr;
  std::unique_ptr<StringTensorBuilder> strings;
};

}  // namespace

Result<Element> decode_csv(const Tensor& records, const CsvSpec& spec) {
  if (records.dtype() != DType::kString) {
    return Status::InvalidArgument("decode_csv: records must be a string tensor, got " +
                                   std::string(dtype_name(records.dtype())));
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<FieldPlan> plans, plan_fields(spec));
  const int64_t num_records = records.num_elements();

  std::vector<FieldOutput> outputs(plans.size());
  for (size_t f = 0; f < plans.size(); ++f) {
    if (plans[f].dtype == DType::kString) {
      outputs[f].strings = std::make_unique<StringTensorBuilder>(static_cast<size_t>(num_records));
    } else {
      CAPSTAN_ASSIGN_OR_RETURN(outputs[f].tensor,
                               Tensor::uninitialized(plans[f].dtype, records.shape()));
      outputs[f].data = outputs[f].tensor.mutable_data();
    }
  }

  auto field_name = [&](size_t f) {
    std::string name = "Field " + std::to_string(f);
    if (!spec.select_cols.empty()) name += " (column " + std::to_string(plans[f].column) + ")";
    return name;
  };
  auto invalid = [&](size_t f, int64_t i, std::string_view text) {
    return Status::InvalidArgument(field_name(f) + " in record " + std::to_string(i) +
                                   " is not a valid " + std::string(dtype_name(plans[f].dtype)) +
                                   ": " + shown(text));
  };

  FieldSplitter splitter(spec, plans.size());
  for (int64_t i = 0; i < num_records; ++i) {
    std::string_view record = records.string_at(i);
    size_t count = 0;
    CAPSTAN_RETURN_IF_ERROR(splitter.split(record, i, &count));
    if (count != plans.size()) {
      return Status::InvalidArgument("Expect " + std::to_string(plans.size()) +
                                     " fields but have " + std::to_string(count) + " in record " +
                                     std::to_string(i) + ": " + shown(record));
    }
    for (size_t f = 0; f < plans.size(); ++f) {
      const FieldPlan& plan = plans[f];
      std::string_view text = splitter.field(f);
      if (text.empty() || text == spec.na_value) {
        if (plan.required) {
          return Status::InvalidArgument(field_name(f) + " is required but missing in record " +
                                         std::to_string(i) + ": " + shown(text));
        }
        switch (plan.dtype) {
          case DType::kInt32: static_cast<int32_t*>(outputs[f].data)[i] = plan.default_int32; break;
          case DType::kInt64: static_cast<int64_t*>(outputs[f].data)[i] = plan.default_int64; break;
          case DType::kFloat32: static_cast<float*>(outputs[f].data)[i] = plan.default_float; break;
          case DType::kFloat64: static_cast<double*>(outputs[f].data)[i] = plan.default_double; break;
          default: outputs[f].strings->append(plan.default_string); break;
        }
        continue;
      }
      bool ok = true;
      switch (plan.dtype) {
        case DType::kInt32: ok = parse_int(text, &static_cast<int32_t*>(outputs[f].data)[i]); break;
        case DType::kInt64: ok = parse_int(text, &static_cast<int64_t*>(outputs[f].data)[i]); break;
        case DType::kFloat32: ok = parse_float(text, &static_cast<float*>(outputs[f].data)[i]); break;
        case DType::kFloat64: ok = parse_float(text, &static_cast<double*>(outputs[f].data)[i]); break;
        default: outputs[f].strings->append(text); break;
      }
      if (!ok) return invalid(f, i, text);
    }
  }

  Element element;
  element.components.reserve(plans.size());
  for (auto& out : outputs) {
    if (out.strings != nullptr) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor t, out.strings->finish(records.shape()));
      element.components.push_back(std::move(t));
    } else {
      element.components.push_back(std::move(out.tensor));
    }
  }
  return element;
}

}  // namespace capstan::data
