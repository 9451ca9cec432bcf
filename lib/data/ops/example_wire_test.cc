// parse_example's wire parser against the protobuf reference: the same
// outputs and the same errors on generated, unusual and damaged Examples.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "data/ops/example.h"
#include "data/ops/example_testing.h"
#include "data/test_util.h"

namespace capstan::data {
namespace {

using testing::compare_results;
using testing::RandomExamples;
using testing::WireWriter;

// The specs the generated Examples are read with: one that mostly fits them
// and one that mostly does not (dtype and count errors).
std::vector<FeatureSpec> specs() {
  return {
      {{"a", VarLenFeature{DType::kInt64}},
       {"b", VarLenFeature{DType::kFloat32}},
       {"c", VarLenFeature{DType::kString}},
       {"label", FixedLenFeature{DType::kInt64, Shape{}, Tensor::scalar<int64_t>(-1)}}},
      {{"a", FixedLenFeature{DType::kInt64, Shape{2}, std::nullopt}},
       {"b", FixedLenFeature{DType::kFloat32, Shape{1}, testing::make<float>({0.5f}, Shape{1})}},
       {"c", FixedLenFeature{DType::kString, Shape{}, testing::make_strings({"none"}, Shape{})}},
       {"other", VarLenFeature{DType::kString}},
       {"\xc3\xa9t\xc3\xa9", VarLenFeature{DType::kInt64}}},
  };
}

Tensor batch_of(const std::vector<std::string>& examples) {
  return testing::make_strings(examples, Shape{static_cast<int64_t>(examples.size())});
}

TEST_CASE("the wire parser agrees with protobuf on thousands of generated Examples", "[data][example][wire]") {
  RandomExamples random(20261125);
  auto all_specs = specs();
  int ok = 0, failed = 0, damaged = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::string> examples(1 + random.pick(6));
    for (auto& e : examples) {
      e = random.example();
      if (random.pick(6) == 0) {
        e = random.damaged(std::move(e));
        ++damaged;
      }
    }
    for (const FeatureSpec& spec : all_specs) {
      Tensor batch = batch_of(examples);
      auto reference = parse_example_reference(batch, spec);
      auto fast = parse_example(batch, spec);
      std::string difference = compare_results(fast, reference);
      INFO("round " << round);
      REQUIRE(difference == "");
      (reference.ok() ? ok : failed) += 1;
      // One Example alone (parse_single_example).
      Tensor single = testing::make_strings({examples[0]}, Shape{});
      REQUIRE(compare_results(parse_example(single, spec), parse_example_reference(single, spec)) == "");
    }
  }
  // Both outcomes are well represented, or the comparison proves little.
  CHECK(ok > 400);
  CHECK(failed > 1000);
  CHECK(damaged > 1000);
}

// Each case: bytes a careful writer would not produce, and what protobuf
// makes of them; the wire parser must do the same.
TEST_CASE("unusual but valid encodings read as protobuf reads them", "[data][example][wire]") {
  FeatureSpec spec = {{"k", VarLenFeature{DType::kInt64}}, {"f", VarLenFeature{DType::kFloat32}}};
  auto entry = [](std::string_view key, std::string_view feature) {
    WireWriter e;
    e.bytes(1, key);
    e.bytes(2, feature);
    return e.str();
  };
  auto int64_list = [](std::vector<int64_t> values, bool packed) {
    WireWriter list;
    WireWriter p;
    for (int64_t v : values) {
      if (packed) {
        p.varint(static_cast<uint64_t>(v));
      } else {
        list.tag(1, 0);
        list.varint(static_cast<uint64_t>(v));
      }
    }
    if (packed) list.bytes(1, p.str());
    WireWriter feature;
    feature.bytes(3, list.str());
    return feature.str();
  };
  auto example_of = [](std::vector<std::string> entries) {
    WireWriter features;
    for (const auto& e : entries) features.bytes(1, e);
    WireWriter example;
    example.bytes(1, features.str());
    return example.str();
  };
  auto k_values = [&](const std::string& example) {
    Tensor single = testing::make_strings({example}, Shape{});
    auto fast = parse_example(single, spec);
    REQUIRE(compare_results(fast, parse_example_reference(single, spec)) == "");
    REQUIRE(fast.ok());
    REQUIRE(fast->names[4] == "k/values");
    return testing::values<int64_t>(fast->components[4]);
  };

  SECTION("a repeated key: the last entry wins") {
    CHECK(k_values(example_of({entry("k", int64_list({1, 2}, true)), entry("k", int64_list({7}, false))})) ==
          std::vector<int64_t>{7});
  }
  SECTION("packed and unpacked runs of one list append") {
    WireWriter list;
    WireWriter packed;
    packed.varint(5);
    list.bytes(1, packed.str());
    list.tag(1, 0);
    list.varint(6);
    WireWriter feature;
    feature.bytes(3, list.str());
    CHECK(k_values(example_of({entry("k", feature.str())})) == std::vector<int64_t>{5, 6});
  }
  SECTION("an entry's value given twice merges") {
    WireWriter e;
    e.bytes(2, int64_list({1}, true));
    e.bytes(1, "k");
    e.bytes(2, int64_list({2, 3}, false));
    CHECK(k_values(example_of({e.str()})) == std::vector<int64_t>{1, 2, 3});
  }
  SECTION("`features` given twice merge") {
    std::string both = example_of({entry("k", int64_list({4}, true))}) + example_of({entry("f", "")});
    CHECK(k_values(both) == std::vector<int64_t>{4});
  }
  SECTION("a list of another kind replaces the first; unknown fields and groups are skipped") {
    WireWriter float_list;
    float_list.fixed32(1, 0x3f800000);
    WireWriter feature;
    feature.bytes(2, float_list.str());
    feature.raw(int64_list({-9}, true));  // int64_list after float_list
    feature.tag(9, 3);                    // an unknown group with a varint inside
    feature.tag(1, 0);
    feature.varint(1);
    feature.tag(9, 4);
    CHECK(k_values(example_of({entry("k", feature.str())})) == std::vector<int64_t>{-9});
  }
}

TEST_CASE("damaged Examples are refused by both parsers with the same error", "[data][example][wire]") {
  FeatureSpec spec = {{"k", VarLenFeature{DType::kInt64}}};
  auto refused = [&](const std::string& bytes) {
    Tensor single = testing::make_strings({bytes}, Shape{});
    auto fast = parse_example(single, spec);
    CHECK(compare_results(fast, parse_example_reference(single, spec)) == "");
    return !fast.ok() && fast.status().message().find("Could not parse serialized Example") != std::string::npos;
  };
  WireWriter key_entry;
  key_entry.bytes(1, "k\xff");  // a key that is not UTF-8
  WireWriter bad_key;
  bad_key.bytes(1, key_entry.str());
  WireWriter example;
  example.bytes(1, bad_key.str());
  CHECK(refused(example.str()));
  // The same key replaced by a valid one later in its entry: still refused
  // (found by the differential fuzzer).
  WireWriter replaced_entry;
  replaced_entry.bytes(1, "k\xff");
  replaced_entry.bytes(1, "k");
  WireWriter replaced_features;
  replaced_features.bytes(1, replaced_entry.str());
  WireWriter replaced;
  replaced.bytes(1, replaced_features.str());
  CHECK(refused(replaced.str()));
  CHECK(refused(std::string("\x0a\x05\x0a\x03", 4)));  // a length past the end
  CHECK(refused(std::string("\x0f", 1)));              // wire type 7
  CHECK(refused(std::string("\x00", 1)));              // tag 0
  CHECK(refused(std::string("\x0c", 1)));              // an end-group tag with no group
  CHECK(refused(std::string("\x0b\x10\x01\x14", 4)));  // group 1 closed by group 2's end tag
  CHECK(refused(std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12)));  // an 11-byte varint
  // A packed float run of 5 bytes.
  WireWriter list;
  list.bytes(1, std::string(5, '\0'));
  WireWriter feature;
  feature.bytes(2, list.str());
  WireWriter e;
  e.bytes(1, "k");
  e.bytes(2, feature.str());
  WireWriter features;
  features.bytes(1, e.str());
  WireWriter packed;
  packed.bytes(1, features.str());
  CHECK(refused(packed.str()));
}

}  // namespace
}  // namespace capstan::data
