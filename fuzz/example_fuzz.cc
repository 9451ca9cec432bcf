// parse_example: serialized tf.Example protos against a fixed spec.
#include "data/ops/example.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace capstan;
  using data::FixedLenFeature;
  using data::VarLenFeature;
  static const data::FeatureSpec spec = [] {
    data::FeatureSpec s;
    s["age"] = FixedLenFeature{DType::kInt64, Shape({}), Tensor::scalar<int64_t>(0)};
    s["score"] = FixedLenFeature{DType::kFloat32, Shape({2}), std::nullopt};
    s["name"] = FixedLenFeature{DType::kString, Shape({}), std::nullopt};
    s["tags"] = VarLenFeature{DType::kString};
    s["ids"] = VarLenFeature{DType::kInt64};
    return s;
  }();
  auto serialized = Tensor::from_strings({fuzz::as_string(data, size)}, {});
  if (serialized.ok()) (void)data::parse_example(*serialized, spec);
  return 0;
}
