#include "data/ops/example.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/test_util.h"
#include "example.pb.h"

namespace capstan::data {
namespace {

namespace pb = ::capstan::tfexample;
using Catch::Matchers::Contains;
using testing::strings;
using testing::values;

pb::Feature int64_feature(const std::vector<int64_t>& values) {
  pb::Feature f;
  for (int64_t v : values) f.mutable_int64_list()->add_value(v);
  if (values.empty()) f.mutable_int64_list();
  return f;
}
pb::Feature float_feature(const std::vector<float>& values) {
  pb::Feature f;
  for (float v : values) f.mutable_float_list()->add_value(v);
  if (values.empty()) f.mutable_float_list();
  return f;
}
pb::Feature bytes_feature(const std::vector<std::string>& values) {
  pb::Feature f;
  for (const auto& v : values) f.mutable_bytes_list()->add_value(v);
  if (values.empty()) f.mutable_bytes_list();
  return f;
}

std::string serialize(const std::map<std::string, pb::Feature>& features) {
  pb::Example example;
  auto& map = *example.mutable_features()->mutable_feature();
  for (const auto& [key, feature] : features) map[key] = feature;
  return example.SerializeAsString();
}

Tensor one(const std::string& serialized) { return *Tensor::from_strings({serialized}, Shape{}); }
Tensor batch(const std::vector<std::string>& serialized) {
  return *Tensor::from_strings(serialized, Shape{static_cast<int64_t>(serialized.size())});
}

// The error parse_example gives; fails the test when it succeeds.
Status error_of(const Tensor& serialized, const FeatureSpec& spec) {
  auto result = parse_example(serialized, spec);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == StatusCode::kInvalidArgument);
  return result.status();
}

// The records of pytorch/data's example.tfrecord (../shared/testdata):
// record i has x_float = [10i .. 10i+9], x_int = [100i, 100i+10, .., 100i+90]
// and x_byte = ["test str"].
std::string tfrecord_example(int i) {
  std::vector<float> floats;
  std::vector<int64_t> ints;
  for (int k = 0; k < 10; ++k) {
    floats.push_back(static_cast<float>(10 * i + k));
    ints.push_back(100 * i + 10 * k);
  }
  return serialize({{"x_float", float_feature(floats)},
                    {"x_int", int64_feature(ints)},
                    {"x_byte", bytes_feature({"test str"})}});
}

FeatureSpec tfrecord_spec() {
  return {{"x_float", FixedLenFeature{DType::kFloat32, {10}, std::nullopt}},
          {"x_int", FixedLenFeature{DType::kInt64, {10}, std::nullopt}},
          {"x_byte", FixedLenFeature{DType::kString, {1}, std::nullopt}}};
}

// Record 0 of example.tfrecord as TensorFlow wrote it (its map entries are
// in the order x_int, x_float, x_byte).
const unsigned char kTfWrittenRecord0[] = {
    0x0a, 0x6a, 0x0a, 0x17, 0x0a, 0x05, 0x78, 0x5f, 0x69, 0x6e, 0x74, 0x12, 0x0e, 0x1a, 0x0c,
    0x0a, 0x0a, 0x00, 0x0a, 0x14, 0x1e, 0x28, 0x32, 0x3c, 0x46, 0x50, 0x5a, 0x0a, 0x37, 0x0a,
    0x07, 0x78, 0x5f, 0x66, 0x6c, 0x6f, 0x61, 0x74, 0x12, 0x2c, 0x12, 0x2a, 0x0a, 0x28, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x40, 0x40,
    0x00, 0x00, 0x80, 0x40, 0x00, 0x00, 0xa0, 0x40, 0x00, 0x00, 0xc0, 0x40, 0x00, 0x00, 0xe0,
    0x40, 0x00, 0x00, 0x00, 0x41, 0x00, 0x00, 0x10, 0x41, 0x0a, 0x16, 0x0a, 0x06, 0x78, 0x5f,
    0x62, 0x79, 0x74, 0x65, 0x12, 0x0c, 0x0a, 0x0a, 0x0a, 0x08, 0x74, 0x65, 0x73, 0x74, 0x20,
    0x73, 0x74, 0x72};

TEST_CASE("parse_example parses FixedLen scalars of every dtype", "[example]") {
  FeatureSpec spec = {{"i", FixedLenFeature{DType::kInt64, {}, std::nullopt}},
                      {"f", FixedLenFeature{DType::kFloat32, {}, std::nullopt}},
                      {"s", FixedLenFeature{DType::kString, {}, std::nullopt}}};
  auto result = parse_example(one(serialize({{"i", int64_feature({-5})},
                                             {"f", float_feature({2.5f})},
                                             {"s", bytes_feature({"hi"})}})),
                              spec);
  REQUIRE(result.ok());
  // Components come in the spec's key order.
  CHECK(result->names == std::vector<std::string>{"f", "i", "s"});
  for (const auto& t : result->components) CHECK(t.shape() == Shape{});
  CHECK(values<float>(result->components[0]) == std::vector<float>{2.5f});
  CHECK(values<int64_t>(result->components[1]) == std::vector<int64_t>{-5});
  CHECK(result->components[2].string_at(0) == "hi");
}

TEST_CASE("parse_example parses FixedLen vectors and matrices", "[example]") {
  FeatureSpec spec = {{"v", FixedLenFeature{DType::kFloat32, {3}, std::nullopt}},
                      {"m", FixedLenFeature{DType::kInt64, {2, 3}, std::nullopt}},
                      {"s", FixedLenFeature{DType::kString, {2, 1}, std::nullopt}}};
  auto result = parse_example(one(serialize({{"v", float_feature({1, 2, 3})},
                                             {"m", int64_feature({1, 2, 3, 4, 5, 6})},
                                             {"s", bytes_feature({"a", "b"})}})),
                              spec);
  REQUIRE(result.ok());
  REQUIRE(result->names == std::vector<std::string>{"m", "s", "v"});
  CHECK(result->components[0].shape() == Shape{2, 3});
  CHECK(values<int64_t>(result->components[0]) == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(result->components[1].shape() == Shape{2, 1});
  CHECK(strings(result->components[1]) == std::vector<std::string>{"a", "b"});
  CHECK(result->components[2].shape() == Shape{3});
  CHECK(values<float>(result->components[2]) == std::vector<float>{1, 2, 3});
}

TEST_CASE("parse_example on a batch adds a leading batch dimension", "[example]") {
  FeatureSpec spec = {{"m", FixedLenFeature{DType::kInt64, {2, 2}, std::nullopt}},
                      {"s", FixedLenFeature{DType::kString, {}, std::nullopt}}};
  auto result = parse_example(batch({serialize({{"m", int64_feature({1, 2, 3, 4})},
                                                {"s", bytes_feature({"first"})}}),
                                     serialize({{"m", int64_feature({5, 6, 7, 8})},
                                                {"s", bytes_feature({""})}}),
                                     serialize({{"m", int64_feature({9, 10, 11, 12})},
                                                {"s", bytes_feature({"third"})}})}),
                              spec);
  REQUIRE(result.ok());
  CHECK(result->components[0].shape() == Shape{3, 2, 2});
  CHECK(values<int64_t>(result->components[0]) ==
        std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  CHECK(result->components[1].shape() == Shape{3});
  CHECK(strings(result->components[1]) == std::vector<std::string>{"first", "", "third"});

  auto empty = parse_example(batch({}), spec);
  REQUIRE(empty.ok());
  CHECK(empty->components[0].shape() == Shape{0, 2, 2});
  CHECK(empty->components[1].shape() == Shape{0});
}

TEST_CASE("parse_example fills missing FixedLen features from their defaults", "[example]") {
  FeatureSpec spec = {
      {"i", FixedLenFeature{DType::kInt64, {2}, *Tensor::from_vector<int64_t>({7, 8}, Shape{2})}},
      {"f", FixedLenFeature{DType::kFloat32, {}, Tensor::scalar<float>(-1.0f)}},
      {"s", FixedLenFeature{DType::kString, {2}, *Tensor::from_strings({"x", "y"}, Shape{2})}}};
  auto result = parse_example(batch({serialize({}), serialize({{"i", int64_feature({1, 2})},
                                                               {"f", float_feature({3})},
                                                               {"s", bytes_feature({"p", "q"})}}),
                                     serialize({{"f", float_feature({4})}})}),
                              spec);
  REQUIRE(result.ok());
  REQUIRE(result->names == std::vector<std::string>{"f", "i", "s"});
  CHECK(values<float>(result->components[0]) == std::vector<float>{-1, 3, 4});
  CHECK(values<int64_t>(result->components[1]) == std::vector<int64_t>{7, 8, 1, 2, 7, 8});
  CHECK(strings(result->components[2]) == std::vector<std::string>{"x", "y", "p", "q", "x", "y"});
}

TEST_CASE("parse_example reshapes a default with the right number of elements", "[example]") {
  FeatureSpec spec = {{"m", FixedLenFeature{DType::kFloat32, {2, 2},
                                            *Tensor::from_vector<float>({1, 2, 3, 4}, Shape{4})}}};
  auto result = parse_example(one(""), spec);
  REQUIRE(result.ok());
  CHECK(result->components[0].shape() == Shape{2, 2});
  CHECK(values<float>(result->components[0]) == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("parse_example reads an empty string as an Example without features", "[example]") {
  FeatureSpec spec = {{"i", FixedLenFeature{DType::kInt64, {}, Tensor::scalar<int64_t>(3)}},
                      {"v", VarLenFeature{DType::kString}}};
  auto result = parse_example(one(""), spec);
  REQUIRE(result.ok());
  CHECK(values<int64_t>(result->components[0]) == std::vector<int64_t>{3});
  CHECK(result->components[1].shape() == Shape{0, 1});
  CHECK(result->components[2].shape() == Shape{0});
  CHECK(values<int64_t>(result->components[3]) == std::vector<int64_t>{0});
}

TEST_CASE("parse_example treats a Feature with no list set as missing", "[example]") {
  FeatureSpec spec = {{"i", FixedLenFeature{DType::kInt64, {}, Tensor::scalar<int64_t>(9)}}};
  auto result = parse_example(one(serialize({{"i", pb::Feature()}})), spec);
  REQUIRE(result.ok());
  CHECK(values<int64_t>(result->components[0]) == std::vector<int64_t>{9});
}

TEST_CASE("parse_example ignores features the spec does not name", "[example]") {
  FeatureSpec spec = {{"b", FixedLenFeature{DType::kInt64, {}, std::nullopt}}};
  auto result = parse_example(
      one(serialize({{"a", float_feature({1})}, {"b", int64_feature({2})}, {"c", bytes_feature({"z"})}})),
      spec);
  REQUIRE(result.ok());
  REQUIRE(result->size() == 1);
  CHECK(values<int64_t>(result->components[0]) == std::vector<int64_t>{2});
}

TEST_CASE("parse_example gives VarLen features as sparse components for one Example",
          "[example]") {
  FeatureSpec spec = {{"v", VarLenFeature{DType::kInt64}}};
  auto result = parse_example(one(serialize({{"v", int64_feature({4, 5, 6})}})), spec);
  REQUIRE(result.ok());
  REQUIRE(result->names == std::vector<std::string>{"v/indices", "v/values", "v/dense_shape"});
  const auto& c = result->components;
  CHECK(c[0].dtype() == DType::kInt64);
  CHECK(c[0].shape() == Shape{3, 1});
  CHECK(values<int64_t>(c[0]) == std::vector<int64_t>{0, 1, 2});
  CHECK(c[1].shape() == Shape{3});
  CHECK(values<int64_t>(c[1]) == std::vector<int64_t>{4, 5, 6});
  CHECK(c[2].shape() == Shape{1});
  CHECK(values<int64_t>(c[2]) == std::vector<int64_t>{3});
}

TEST_CASE("parse_example gives VarLen features as sparse components for a batch", "[example]") {
  FeatureSpec spec = {{"f", VarLenFeature{DType::kFloat32}}, {"s", VarLenFeature{DType::kString}}};
  auto result = parse_example(batch({serialize({{"f", float_feature({1, 2})}, {"s", bytes_feature({"a"})}}),
                                     serialize({}),
                                     serialize({{"f", float_feature({3, 4, 5})},
                                                {"s", bytes_feature({})}})}),
                              spec);
  REQUIRE(result.ok());
  REQUIRE(result->names == std::vector<std::string>{"f/indices", "f/values", "f/dense_shape",
                                                    "s/indices", "s/values", "s/dense_shape"});
  const auto& c = result->components;
  CHECK(c[0].shape() == Shape{5, 2});
  CHECK(values<int64_t>(c[0]) == std::vector<int64_t>{0, 0, 0, 1, 2, 0, 2, 1, 2, 2});
  CHECK(values<float>(c[1]) == std::vector<float>{1, 2, 3, 4, 5});
  CHECK(values<int64_t>(c[2]) == std::vector<int64_t>{3, 3});
  CHECK(c[3].shape() == Shape{1, 2});
  CHECK(values<int64_t>(c[3]) == std::vector<int64_t>{0, 0});
  CHECK(strings(c[4]) == std::vector<std::string>{"a"});
  CHECK(c[4].validate().ok());
  CHECK(values<int64_t>(c[5]) == std::vector<int64_t>{3, 1});
}

TEST_CASE("parse_example gives an empty SparseTensor when no Example has the feature",
          "[example]") {
  FeatureSpec spec = {{"v", VarLenFeature{DType::kInt64}}};
  auto result = parse_example(batch({serialize({}), serialize({})}), spec);
  REQUIRE(result.ok());
  CHECK(result->components[0].shape() == Shape{0, 2});
  CHECK(result->components[1].shape() == Shape{0});
  CHECK(values<int64_t>(result->components[2]) == std::vector<int64_t>{2, 0});
}

TEST_CASE("parse_example accepts unpacked numeric lists", "[example]") {
  // Example{features{feature{key "a" value{int64_list{value: 1 value: 2}}}}}
  // with each int64 as its own tag (field 1, varint), as old writers did.
  const std::string unpacked_ints("\x0a\x0d\x0a\x0b\x0a\x01" "a" "\x12\x06\x1a\x04\x08\x01\x08\x02", 15);
  // The same with float_list{value: 1.0 value: 2.0}, each a fixed32 tag.
  const std::string unpacked_floats(
      "\x0a\x13\x0a\x11\x0a\x01" "a" "\x12\x0c\x12\x0a\x0d\x00\x00\x80\x3f\x0d\x00\x00\x00\x40", 21);
  auto ints = parse_example(one(unpacked_ints), {{"a", VarLenFeature{DType::kInt64}}});
  REQUIRE(ints.ok());
  CHECK(values<int64_t>(ints->components[1]) == std::vector<int64_t>{1, 2});
  auto floats = parse_example(one(unpacked_floats), {{"a", FixedLenFeature{DType::kFloat32, {2}, std::nullopt}}});
  REQUIRE(floats.ok());
  CHECK(values<float>(floats->components[0]) == std::vector<float>{1, 2});
}

TEST_CASE("parse_example reads an Example as TensorFlow serialized it", "[example]") {
  std::string record(reinterpret_cast<const char*>(kTfWrittenRecord0), sizeof(kTfWrittenRecord0));
  auto result = parse_example(one(record), tfrecord_spec());
  REQUIRE(result.ok());
  REQUIRE(result->names == std::vector<std::string>{"x_byte", "x_float", "x_int"});
  CHECK(strings(result->components[0]) == std::vector<std::string>{"test str"});
  CHECK(values<float>(result->components[1]) ==
        std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(values<int64_t>(result->components[2]) ==
        std::vector<int64_t>{0, 10, 20, 30, 40, 50, 60, 70, 80, 90});
}

TEST_CASE("parse_example reproduces the records of example.tfrecord", "[example]") {
  std::vector<std::string> records;
  for (int i = 0; i < 4; ++i) records.push_back(tfrecord_example(i));
  auto result = parse_example(batch(records), tfrecord_spec());
  REQUIRE(result.ok());
  REQUIRE(result->names == std::vector<std::string>{"x_byte", "x_float", "x_int"});
  const auto& c = result->components;
  CHECK(c[0].shape() == Shape{4, 1});
  CHECK(c[1].shape() == Shape{4, 10});
  CHECK(c[2].shape() == Shape{4, 10});
  auto floats = values<float>(c[1]);
  auto ints = values<int64_t>(c[2]);
  for (int i = 0; i < 4; ++i) {
    CHECK(c[0].string_at(i) == "test str");
    for (int k = 0; k < 10; ++k) {
      CHECK(floats[static_cast<size_t>(10 * i + k)] == static_cast<float>(10 * i + k));
      CHECK(ints[static_cast<size_t>(10 * i + k)] == 100 * i + 10 * k);
    }
  }
  // One at a time, each record gives the batch's row.
  for (int i = 0; i < 4; ++i) {
    auto single = parse_example(one(records[static_cast<size_t>(i)]), tfrecord_spec());
    REQUIRE(single.ok());
    CHECK(single->components[1].shape() == Shape{10});
    CHECK(values<float>(single->components[1])[0] == static_cast<float>(10 * i));
    CHECK(values<int64_t>(single->components[2])[9] == 100 * i + 90);
  }
}

TEST_CASE("parse_example rejects a missing FixedLen feature without a default", "[example]") {
  FeatureSpec spec = {{"x", FixedLenFeature{DType::kInt64, {10}, std::nullopt}}};
  std::string with_x = serialize({{"x", int64_feature({0, 1, 2, 3, 4, 5, 6, 7, 8, 9})}});
  CHECK(error_of(batch({with_x, serialize({{"y", int64_feature({1})}})}), spec).message() ==
        "Key: x, Index: 1. Feature (data type: int64, shape [10]) is required but could not be "
        "found");
}

TEST_CASE("parse_example rejects a feature whose list has the wrong type", "[example]") {
  FeatureSpec fixed = {{"x", FixedLenFeature{DType::kInt64, {}, std::nullopt}}};
  CHECK(error_of(one(serialize({{"x", float_feature({1.5f})}})), fixed).message() ==
        "Key: x, Index: 0. Data types don't match. Data type: float32 Expected type: int64");
  FeatureSpec var = {{"v", VarLenFeature{DType::kString}}};
  CHECK(error_of(batch({serialize({}), serialize({{"v", int64_feature({1})}})}), var).message() ==
        "Key: v, Index: 1. Data types don't match. Data type: int64 Expected type: string");
}

TEST_CASE("parse_example rejects a FixedLen feature with the wrong number of values",
          "[example]") {
  FeatureSpec spec = {{"x", FixedLenFeature{DType::kFloat32, {10}, std::nullopt}}};
  CHECK(error_of(one(serialize({{"x", float_feature({1, 2, 3})}})), spec).message() ==
        "Key: x, Index: 0. Can't parse serialized Example: expected 10 float32 values for shape "
        "[10], got 3");
  // A present but empty list is not missing, so a default does not apply (TF).
  FeatureSpec with_default = {
      {"s", FixedLenFeature{DType::kString, {}, *Tensor::from_strings({"d"}, Shape{})}}};
  CHECK(error_of(one(serialize({{"s", bytes_feature({})}})), with_default).message() ==
        "Key: s, Index: 0. Can't parse serialized Example: expected 1 string values for shape "
        "[], got 0");
}

TEST_CASE("parse_example rejects bytes that are not an Example", "[example]") {
  FeatureSpec spec = {{"x", VarLenFeature{DType::kInt64}}};
  // A length-delimited field whose length runs past the end.
  CHECK(error_of(batch({serialize({}), std::string("\x0a\x10\x01", 3)}), spec).message() ==
        "Index: 1. Could not parse serialized Example of 3 bytes: '\\x0a\\x10\\x01'");
  // A truncated real Example.
  std::string cut(reinterpret_cast<const char*>(kTfWrittenRecord0), 50);
  CHECK_THAT(error_of(one(cut), spec).message(),
             Contains("Index: 0. Could not parse serialized Example of 50 bytes"));
}

TEST_CASE("parse_example rejects serialized that is not a string scalar or vector",
          "[example]") {
  FeatureSpec spec = {{"x", VarLenFeature{DType::kInt64}}};
  CHECK(error_of(Tensor::scalar<int64_t>(1), spec).message() ==
        "parse_example: serialized must be a string scalar or vector, got int64[]");
  CHECK(error_of(*Tensor::from_strings({"", "", "", ""}, Shape{2, 2}), spec).message() ==
        "parse_example: serialized must be a string scalar or vector, got string[2, 2]");
}

TEST_CASE("parse_example rejects a default of the wrong dtype or size", "[example]") {
  FeatureSpec wrong_dtype = {{"x", FixedLenFeature{DType::kInt64, {}, Tensor::scalar<float>(1)}}};
  CHECK(error_of(one(""), wrong_dtype).message() ==
        "Key: x. default_value is float32[] but the feature is int64[]; it needs that dtype and 1 "
        "elements");
  FeatureSpec wrong_size = {
      {"x", FixedLenFeature{DType::kFloat32, {3}, *Tensor::from_vector<float>({1, 2}, Shape{2})}}};
  CHECK_THAT(error_of(one(""), wrong_size).message(),
             Contains("Key: x. default_value is float32[2] but the feature is float32[3]"));
}

TEST_CASE("parse_example rejects unsupported dtypes and negative shapes", "[example]") {
  CHECK_THAT(error_of(one(""), {{"x", FixedLenFeature{DType::kInt32, {}, std::nullopt}}}).message(),
             Contains("Key: x. FixedLenFeature dtype must be int64, float32 or string, got int32"));
  CHECK_THAT(error_of(one(""), {{"v", VarLenFeature{DType::kFloat64}}}).message(),
             Contains("Key: v. VarLenFeature dtype must be int64, float32 or string, got float64"));
  CHECK_THAT(error_of(one(""), {{"x", FixedLenFeature{DType::kInt64, {-1}, std::nullopt}}}).message(),
             Contains("Key: x. FixedLenFeature shape [-1] has a negative dimension"));
}

TEST_CASE("parse_example rejects a spec whose component names collide", "[example]") {
  FeatureSpec spec = {{"v", VarLenFeature{DType::kInt64}},
                      {"v/values", FixedLenFeature{DType::kInt64, {}, std::nullopt}}};
  CHECK_THAT(error_of(one(""), spec).message(),
             Contains("Output component name 'v/values' is used twice"));
}

}  // namespace
}  // namespace capstan::data
