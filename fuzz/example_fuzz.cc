// parse_example: serialized tf.Example protos against a fixed spec, through
// the wire parser and through protobuf's generated parser. The two must give
// the same tensors or the same error; a difference aborts.
#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <cstdlib>

#include "data/ops/example.h"
#include "data/ops/example_testing.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace capstan;
  using data::FixedLenFeature;
  using data::VarLenFeature;
  static const data::FeatureSpec spec = [] {
    google::protobuf::SetLogHandler(nullptr);  // protobuf logs every bad UTF-8 key
    data::FeatureSpec s;
    s["age"] = FixedLenFeature{DType::kInt64, Shape({}), Tensor::scalar<int64_t>(0)};
    s["score"] = FixedLenFeature{DType::kFloat32, Shape({2}), std::nullopt};
    s["name"] = FixedLenFeature{DType::kString, Shape({}), std::nullopt};
    s["tags"] = VarLenFeature{DType::kString};
    s["ids"] = VarLenFeature{DType::kInt64};
    return s;
  }();
  auto serialized = Tensor::from_strings({fuzz::as_string(data, size)}, {});
  if (!serialized.ok()) return 0;
  std::string difference = data::testing::compare_results(data::parse_example(*serialized, spec),
                                                          data::parse_example_reference(*serialized, spec));
  if (!difference.empty()) {
    std::fprintf(stderr, "parse_example and the protobuf reference disagree: %s\n", difference.c_str());
    std::abort();
  }
  return 0;
}
