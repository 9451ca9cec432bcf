#include "data/ops/example.h"

#include <google/protobuf/arena.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/ops/example_wire.h"
#include "data/string_builder.h"
#include "example.pb.h"

namespace capstan::data {
namespace {

namespace pb = ::capstan::tfexample;

// Messages show at most this many bytes of a serialized Example.
constexpr size_t kMaxShownBytes = 64;

// The reference parser parses each Example into an arena that starts in a
// block of this size and is reset before the next Example, so a typical
// Example costs no malloc.
constexpr size_t kArenaBlockBytes = 64 * 1024;

std::string shown(std::string_view bytes) {
  std::string out = quoted_prefix(bytes, kMaxShownBytes);
  if (bytes.size() > kMaxShownBytes) out += "...";
  return out;
}

// One spec entry, checked, with its output buffers.
struct FeaturePlan {
  const std::string* key = nullptr;
  bool fixed = false;  // FixedLenFeature, else VarLenFeature
  DType dtype = DType::kInvalid;
  Shape shape;              // fixed only
  int64_t num_elements = 0;  // fixed only: values per Example
  const Tensor* default_value = nullptr;

  // Fixed: the numeric output tensor and its bytes, or the strings.
  Tensor dense;
  std::byte* dense_data = nullptr;
  // VarLen: the values of all Examples, and each Example's count.
  std::vector<int64_t> int64_values;
  std::vector<float> float_values;
  std::vector<int64_t> lengths;
  // Fixed and VarLen string features.
  StringTensorBuilder strings;
};

std::string key_prefix(const std::string& key) { return "Key: " + key + ". "; }

std::string key_index_prefix(const std::string& key, int64_t index) {
  return "Key: " + key + ", Index: " + std::to_string(index) + ". ";
}

bool supported(DType dtype) {
  return dtype == DType::kInt64 || dtype == DType::kFloat32 || dtype == DType::kString;
}

Result<std::vector<FeaturePlan>> plan_features(const FeatureSpec& spec, bool scalar,
                                               int64_t batch) {
  std::vector<FeaturePlan> plans(spec.size());
  std::set<std::string> names;
  auto claim = [&](const std::string& key, const std::string& name) -> Status {
    if (!names.insert(name).second) {
      return Status::InvalidArgument(key_prefix(key) + "Output component name '" + name +
                                     "' is used twice in the spec");
    }
    return Status::Ok();
  };
  size_t d = 0;
  for (const auto& [key, feature] : spec) {
    FeaturePlan& plan = plans[d++];
    plan.key = &key;
    if (const auto* var = std::get_if<VarLenFeature>(&feature)) {
      plan.dtype = var->dtype;
      if (!supported(plan.dtype)) {
        return Status::InvalidArgument(key_prefix(key) +
                                       "VarLenFeature dtype must be int64, float32 or string, got " +
                                       std::string(dtype_name(plan.dtype)));
      }
      plan.lengths.resize(static_cast<size_t>(batch));
      for (const char* part : {"/indices", "/values", "/dense_shape"}) {
        CAPSTAN_RETURN_IF_ERROR(claim(key, key + part));
      }
      continue;
    }
    const auto& fixed = std::get<FixedLenFeature>(feature);
    plan.fixed = true;
    plan.dtype = fixed.dtype;
    plan.shape = fixed.shape;
    plan.num_elements = shape_num_elements(fixed.shape);
    CAPSTAN_RETURN_IF_ERROR(claim(key, key));
    if (!supported(plan.dtype)) {
      return Status::InvalidArgument(key_prefix(key) +
                                     "FixedLenFeature dtype must be int64, float32 or string, got " +
                                     std::string(dtype_name(plan.dtype)));
    }
    if (plan.num_elements < 0) {
      return Status::InvalidArgument(key_prefix(key) + "FixedLenFeature shape " +
                                     shape_string(fixed.shape) +
                                     " has a negative dimension or is too large");
    }
    if (fixed.default_value.has_value()) {
      const Tensor& def = *fixed.default_value;
      if (def.dtype() != plan.dtype || def.num_elements() != plan.num_elements) {
        return Status::InvalidArgument(
            key_prefix(key) + "default_value is " + std::string(dtype_name(def.dtype())) +
            shape_string(def.shape()) + " but the feature is " +
            std::string(dtype_name(plan.dtype)) + shape_string(fixed.shape) +
            "; it needs that dtype and " + std::to_string(plan.num_elements) + " elements");
      }
      plan.default_value = &def;
    }
    if (plan.dtype != DType::kString) {
      Shape out_shape;
      if (!scalar) out_shape.push_back(batch);
      out_shape.insert(out_shape.end(), fixed.shape.begin(), fixed.shape.end());
      auto dense = Tensor::uninitialized(plan.dtype, std::move(out_shape));
      if (!dense.ok()) return dense.status().with_context(key_prefix(key) + "output");
      plan.dense = std::move(*dense);
      plan.dense_data = plan.dense.mutable_data();
    }
  }
  return plans;
}

// Copies a present FixedLen feature of Example `index` into its output.
Status parse_fixed(FeaturePlan& plan, const FeatureValues& feature, int64_t index) {
  int64_t count = feature.count;
  if (count != plan.num_elements) {
    return Status::InvalidArgument(
        key_index_prefix(*plan.key, index) + "Can't parse serialized Example: expected " +
        std::to_string(plan.num_elements) + " " + std::string(dtype_name(plan.dtype)) +
        " values for shape " + shape_string(plan.shape) + ", got " + std::to_string(count));
  }
  if (feature.in_row()) return Status::Ok();  // the values are in place
  size_t n = static_cast<size_t>(count);
  switch (plan.dtype) {
    case DType::kInt64:
      if (n > 0) {
        std::memcpy(plan.dense_data + static_cast<size_t>(index) * n * sizeof(int64_t), feature.int64s.data(),
                    n * sizeof(int64_t));
      }
      break;
    case DType::kFloat32:
      if (n > 0) {
        std::memcpy(plan.dense_data + static_cast<size_t>(index) * n * sizeof(float), feature.floats.data(),
                    n * sizeof(float));
      }
      break;
    default:
      for (std::string_view s : feature.bytes) plan.strings.append(s);
      break;
  }
  return Status::Ok();
}

// Fills a FixedLen feature that Example `index` lacks from its default.
Status fill_default(FeaturePlan& plan, int64_t index) {
  if (plan.default_value == nullptr) {
    return Status::InvalidArgument(key_index_prefix(*plan.key, index) + "Feature (data type: " +
                                   std::string(dtype_name(plan.dtype)) + ", shape " +
                                   shape_string(plan.shape) +
                                   ") is required but could not be found");
  }
  const Tensor& def = *plan.default_value;
  if (plan.dtype == DType::kString) {
    for (int64_t k = 0; k < def.num_elements(); ++k) plan.strings.append(def.string_at(k));
  } else if (def.byte_size() > 0) {
    std::memcpy(plan.dense_data + static_cast<size_t>(index) * def.byte_size(), def.data(),
                def.byte_size());
  }
  return Status::Ok();
}

// Appends a present VarLen feature's values.
void parse_var(FeaturePlan& plan, const FeatureValues& feature, int64_t index) {
  switch (plan.dtype) {
    case DType::kInt64:
      plan.int64_values.insert(plan.int64_values.end(), feature.int64s.begin(), feature.int64s.end());
      break;
    case DType::kFloat32:
      plan.float_values.insert(plan.float_values.end(), feature.floats.begin(), feature.floats.end());
      break;
    default:
      for (std::string_view s : feature.bytes) plan.strings.append(s);
      break;
  }
  plan.lengths[static_cast<size_t>(index)] = feature.count;
}

template <typename T>
Result<Tensor> vector_tensor(const std::vector<T>& values) {
  CAPSTAN_ASSIGN_OR_RETURN(Tensor t, Tensor::uninitialized(DTypeOf<T>::value,
                                                           Shape{static_cast<int64_t>(values.size())}));
  if (!values.empty()) std::memcpy(t.mutable_data(), values.data(), values.size() * sizeof(T));
  return t;
}

// Appends the three components of a VarLen feature's SparseTensor.
Status finish_var(FeaturePlan& plan, bool scalar, Element* element) {
  int64_t total = 0;
  int64_t max_length = 0;
  for (int64_t length : plan.lengths) {
    total += length;
    max_length = std::max(max_length, length);
  }
  const int64_t rank = scalar ? 1 : 2;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor indices, Tensor::uninitialized(DType::kInt64, Shape{total, rank}));
  auto ix = indices.mutable_flat<int64_t>();
  size_t k = 0;
  for (size_t b = 0; b < plan.lengths.size(); ++b) {
    for (int64_t i = 0; i < plan.lengths[b]; ++i) {
      if (!scalar) ix[k++] = static_cast<int64_t>(b);
      ix[k++] = i;
    }
  }
  Tensor values;
  switch (plan.dtype) {
    case DType::kInt64: {
      CAPSTAN_ASSIGN_OR_RETURN(values, vector_tensor(plan.int64_values));
      break;
    }
    case DType::kFloat32: {
      CAPSTAN_ASSIGN_OR_RETURN(values, vector_tensor(plan.float_values));
      break;
    }
    default: {
      CAPSTAN_ASSIGN_OR_RETURN(values, plan.strings.finish(Shape{total}));
      break;
    }
  }
  std::vector<int64_t> shape;
  if (!scalar) shape.push_back(static_cast<int64_t>(plan.lengths.size()));
  shape.push_back(max_length);
  CAPSTAN_ASSIGN_OR_RETURN(Tensor dense_shape, Tensor::from_vector(shape, Shape{rank}));

  element->components.push_back(std::move(indices));
  element->names.push_back(*plan.key + "/indices");
  element->components.push_back(std::move(values));
  element->names.push_back(*plan.key + "/values");
  element->components.push_back(std::move(dense_shape));
  element->names.push_back(*plan.key + "/dense_shape");
  return Status::Ok();
}

// The reference source of features: protobuf's generated parser into an
// arena, then the features copied out of its map.
class ProtobufExamples {
 public:
  explicit ProtobufExamples(const std::vector<std::string_view>& keys)
      : keys_(keys), values_(keys.size()), block_(kArenaBlockBytes), arena_(arena_options(block_)) {}

  bool parse(std::string_view bytes) {
    arena_.Reset();  // frees the last Example; the initial block is kept
    auto* example = google::protobuf::Arena::CreateMessage<pb::Example>(&arena_);
    if (bytes.size() > static_cast<size_t>(INT_MAX) ||
        !example->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return false;
    }
    const auto& features = example->features().feature();
    for (size_t i = 0; i < keys_.size(); ++i) {
      FeatureValues& out = values_[i];
      out.clear();
      auto it = features.find(std::string(keys_[i]));
      if (it == features.end()) continue;
      const pb::Feature& feature = it->second;
      switch (feature.kind_case()) {
        case pb::Feature::kBytesList:
          out.dtype = DType::kString;
          for (const std::string& v : feature.bytes_list().value()) out.bytes.push_back(v);
          out.count = static_cast<int64_t>(out.bytes.size());
          break;
        case pb::Feature::kFloatList:
          out.dtype = DType::kFloat32;
          out.floats.assign(feature.float_list().value().begin(), feature.float_list().value().end());
          out.count = static_cast<int64_t>(out.floats.size());
          break;
        case pb::Feature::kInt64List:
          out.dtype = DType::kInt64;
          out.int64s.assign(feature.int64_list().value().begin(), feature.int64_list().value().end());
          out.count = static_cast<int64_t>(out.int64s.size());
          break;
        default: break;
      }
    }
    return true;
  }
  const FeatureValues& values(size_t i) const { return values_[i]; }
  void set_row(size_t, DType, std::byte*, int64_t) {}  // copies from the message instead

 private:
  static google::protobuf::ArenaOptions arena_options(std::vector<char>& block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block.data();
    options.initial_block_size = block.size();
    return options;
  }

  const std::vector<std::string_view>& keys_;
  std::vector<FeatureValues> values_;
  std::vector<char> block_;
  google::protobuf::Arena arena_;
};

// parse_example over a source of parsed Examples (ExampleWireParser or
// ProtobufExamples): the checks and the outputs are the same for both.
template <typename Examples>
Result<Element> parse_batch(const Tensor& serialized, const FeatureSpec& spec) {
  if (serialized.dtype() != DType::kString || serialized.rank() > 1) {
    return Status::InvalidArgument(
        "parse_example: serialized must be a string scalar or vector, got " +
        std::string(dtype_name(serialized.dtype())) + shape_string(serialized.shape()));
  }
  const bool scalar = serialized.rank() == 0;
  const int64_t batch = serialized.num_elements();
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<FeaturePlan> plans, plan_features(spec, scalar, batch));
  std::vector<std::string_view> keys;
  keys.reserve(plans.size());
  for (const FeaturePlan& plan : plans) keys.push_back(*plan.key);
  Examples examples(keys);

  for (int64_t index = 0; index < batch; ++index) {
    for (size_t i = 0; i < plans.size(); ++i) {
      const FeaturePlan& plan = plans[i];
      if (plan.dense_data != nullptr) {
        examples.set_row(i, plan.dtype,
                         plan.dense_data + static_cast<size_t>(index * plan.num_elements) * dtype_size(plan.dtype),
                         plan.num_elements);
      }
    }
    std::string_view bytes = serialized.string_at(index);
    if (!examples.parse(bytes)) {
      return Status::InvalidArgument("Index: " + std::to_string(index) +
                                     ". Could not parse serialized Example of " +
                                     std::to_string(bytes.size()) + " bytes: " + shown(bytes));
    }
    for (size_t i = 0; i < plans.size(); ++i) {
      FeaturePlan& plan = plans[i];
      const FeatureValues& feature = examples.values(i);
      if (feature.dtype != DType::kInvalid && feature.dtype != plan.dtype) {
        return Status::InvalidArgument(key_index_prefix(*plan.key, index) +
                                       "Data types don't match. Data type: " +
                                       std::string(dtype_name(feature.dtype)) +
                                       " Expected type: " + std::string(dtype_name(plan.dtype)));
      }
      if (plan.fixed) {
        CAPSTAN_RETURN_IF_ERROR(feature.dtype == DType::kInvalid ? fill_default(plan, index)
                                                                 : parse_fixed(plan, feature, index));
      } else if (feature.dtype != DType::kInvalid) {
        parse_var(plan, feature, index);
      }
    }
  }

  Element element;
  for (FeaturePlan& plan : plans) {
    if (!plan.fixed) {
      CAPSTAN_RETURN_IF_ERROR(finish_var(plan, scalar, &element));
      continue;
    }
    if (plan.dtype == DType::kString) {
      Shape out_shape;
      if (!scalar) out_shape.push_back(batch);
      out_shape.insert(out_shape.end(), plan.shape.begin(), plan.shape.end());
      CAPSTAN_ASSIGN_OR_RETURN(plan.dense, plan.strings.finish(std::move(out_shape)));
    }
    element.components.push_back(std::move(plan.dense));
    element.names.push_back(*plan.key);
  }
  return element;
}

}  // namespace

Result<Element> parse_example(const Tensor& serialized, const FeatureSpec& spec) {
  return parse_batch<ExampleWireParser>(serialized, spec);
}

Result<Element> parse_example_reference(const Tensor& serialized, const FeatureSpec& spec) {
  return parse_batch<ProtobufExamples>(serialized, spec);
}

}  // namespace capstan::data
