#include "data/ops/csv.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "data/test_util.h"

namespace capstan::data {
namespace {

using Catch::Matchers::Contains;
using testing::strings;
using testing::values;

Tensor records_of(const std::vector<std::string>& lines, Shape shape) {
  return *Tensor::from_strings(lines, std::move(shape));
}
Tensor records_of(const std::vector<std::string>& lines) {
  return records_of(lines, Shape{static_cast<int64_t>(lines.size())});
}

Tensor string_scalar(const std::string& s) { return *Tensor::from_strings({s}, Shape{}); }
// An empty default: the field is required.
Tensor required(DType dtype) { return *Tensor::zeros(dtype, Shape{0}); }

CsvSpec spec_of(std::vector<Tensor> defaults) {
  CsvSpec spec;
  spec.record_defaults = std::move(defaults);
  return spec;
}

// The error decode_csv gives; fails the test when it succeeds.
Status error_of(const Tensor& records, const CsvSpec& spec) {
  auto result = decode_csv(records, spec);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == StatusCode::kInvalidArgument);
  return result.status();
}

TEST_CASE("decode_csv parses every supported dtype", "[csv]") {
  auto spec = spec_of({required(DType::kInt32), required(DType::kInt64), required(DType::kFloat32),
                       required(DType::kFloat64), required(DType::kString)});
  auto result = decode_csv(records_of({"1,-9000000000,3.5,-4.25e-3,hello", "-7,0,1e3,2,wor ld"}),
                           spec);
  REQUIRE(result.ok());
  const Element& e = *result;
  REQUIRE(e.size() == 5);
  CHECK(e.names.empty());
  CHECK(e.components[0].dtype() == DType::kInt32);
  CHECK(values<int32_t>(e.components[0]) == std::vector<int32_t>{1, -7});
  CHECK(values<int64_t>(e.components[1]) == std::vector<int64_t>{-9000000000, 0});
  CHECK(values<float>(e.components[2]) == std::vector<float>{3.5f, 1000.0f});
  CHECK(values<double>(e.components[3]) == std::vector<double>{-4.25e-3, 2.0});
  CHECK(strings(e.components[4]) == std::vector<std::string>{"hello", "wor ld"});
  for (const auto& t : e.components) {
    CHECK(t.shape() == Shape{2});
    CHECK(t.validate().ok());
  }
}

TEST_CASE("decode_csv fills empty fields with the column defaults", "[csv]") {
  auto spec = spec_of({Tensor::scalar<int32_t>(7), Tensor::scalar<int64_t>(-8),
                       Tensor::scalar<float>(0.5f), Tensor::scalar<double>(1.25),
                       string_scalar("dflt")});
  auto result = decode_csv(records_of({",,,,", "1,2,3,4,x", ",2,,4,"}), spec);
  REQUIRE(result.ok());
  CHECK(values<int32_t>(result->components[0]) == std::vector<int32_t>{7, 1, 7});
  CHECK(values<int64_t>(result->components[1]) == std::vector<int64_t>{-8, 2, 2});
  CHECK(values<float>(result->components[2]) == std::vector<float>{0.5f, 3, 0.5f});
  CHECK(values<double>(result->components[3]) == std::vector<double>{1.25, 4, 4});
  CHECK(strings(result->components[4]) == std::vector<std::string>{"dflt", "x", "dflt"});
}

TEST_CASE("decode_csv accepts TF's [1]-shaped defaults", "[csv]") {
  auto spec = spec_of({*Tensor::from_vector<int64_t>({42}, Shape{1}), required(DType::kString)});
  auto result = decode_csv(records_of({",a"}), spec);
  REQUIRE(result.ok());
  CHECK(values<int64_t>(result->components[0]) == std::vector<int64_t>{42});
}

TEST_CASE("decode_csv outputs have the shape of the records", "[csv]") {
  auto spec = spec_of({required(DType::kInt64), string_scalar("")});
  SECTION("scalar") {
    auto result = decode_csv(records_of({"5,five"}, Shape{}), spec);
    REQUIRE(result.ok());
    CHECK(result->components[0].shape() == Shape{});
    CHECK(result->components[1].shape() == Shape{});
    CHECK(values<int64_t>(result->components[0]) == std::vector<int64_t>{5});
    CHECK(result->components[1].string_at(0) == "five");
  }
  SECTION("matrix") {
    auto result = decode_csv(records_of({"1,a", "2,b", "3,c", "4,d", "5,e", "6,f"}, Shape{2, 3}), spec);
    REQUIRE(result.ok());
    CHECK(result->components[0].shape() == Shape{2, 3});
    CHECK(result->components[1].shape() == Shape{2, 3});
    CHECK(values<int64_t>(result->components[0]) == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
    CHECK(strings(result->components[1]) ==
          std::vector<std::string>{"a", "b", "c", "d", "e", "f"});
  }
  SECTION("no records") {
    auto result = decode_csv(records_of({}, Shape{0}), spec);
    REQUIRE(result.ok());
    CHECK(result->components[0].shape() == Shape{0});
    CHECK(result->components[1].shape() == Shape{0});
    CHECK(result->components[1].validate().ok());
  }
}

TEST_CASE("decode_csv reads RFC 4180 quoted fields", "[csv]") {
  auto spec = spec_of({string_scalar("dflt"), string_scalar("dflt"), string_scalar("dflt"),
                       required(DType::kInt64)});
  auto result = decode_csv(records_of({R"("a,b","say ""hi""","","42")", R"(plain,"""",z,7)"}), spec);
  REQUIRE(result.ok());
  CHECK(strings(result->components[0]) == std::vector<std::string>{"a,b", "plain"});
  CHECK(strings(result->components[1]) == std::vector<std::string>{"say \"hi\"", "\""});
  // A quoted empty field is empty, so it takes the default, as in TF.
  CHECK(strings(result->components[2]) == std::vector<std::string>{"dflt", "z"});
  CHECK(values<int64_t>(result->components[3]) == std::vector<int64_t>{42, 7});
}

TEST_CASE("decode_csv keeps delimiters and newlines inside quotes", "[csv]") {
  auto spec = spec_of({required(DType::kString), required(DType::kString)});
  auto result = decode_csv(records_of({"\"line1\nline2\r\",\",,\""}), spec);
  REQUIRE(result.ok());
  CHECK(result->components[0].string_at(0) == "line1\nline2\r");
  CHECK(result->components[1].string_at(0) == ",,");
}

TEST_CASE("decode_csv treats quotes as text when use_quote_delim is false", "[csv]") {
  auto spec = spec_of({required(DType::kString), required(DType::kString)});
  spec.use_quote_delim = false;
  auto result = decode_csv(records_of({R"("a,b")", R"(x"y,"")"}), spec);
  REQUIRE(result.ok());
  CHECK(strings(result->components[0]) == std::vector<std::string>{"\"a", "x\"y"});
  CHECK(strings(result->components[1]) == std::vector<std::string>{"b\"", "\"\""});
}

TEST_CASE("decode_csv treats na_value as a missing field", "[csv]") {
  auto spec = spec_of({Tensor::scalar<int64_t>(-1), string_scalar("unknown"),
                       Tensor::scalar<float>(0.0f)});
  spec.na_value = "NA";
  auto result = decode_csv(records_of({"NA,NA,NA", "3,x,1.5", ",,"}), spec);
  REQUIRE(result.ok());
  CHECK(values<int64_t>(result->components[0]) == std::vector<int64_t>{-1, 3, -1});
  CHECK(strings(result->components[1]) == std::vector<std::string>{"unknown", "x", "unknown"});
  CHECK(values<float>(result->components[2]) == std::vector<float>{0.0f, 1.5f, 0.0f});
}

TEST_CASE("decode_csv with select_cols decodes only the chosen columns", "[csv]") {
  auto spec = spec_of({required(DType::kString), required(DType::kInt64)});
  spec.select_cols = {1, 3};
  // Columns after the last selected one are not looked at, even malformed.
  auto result = decode_csv(records_of({"a,b,c,4,e", "zz,x,y,5,\"unterminated"}), spec);
  REQUIRE(result.ok());
  CHECK(strings(result->components[0]) == std::vector<std::string>{"b", "x"});
  CHECK(values<int64_t>(result->components[1]) == std::vector<int64_t>{4, 5});
}

TEST_CASE("decode_csv counts a trailing delimiter as one more empty field", "[csv]") {
  auto spec = spec_of({required(DType::kString), string_scalar("end")});
  auto result = decode_csv(records_of({"a,"}), spec);
  REQUIRE(result.ok());
  CHECK(result->components[1].string_at(0) == "end");

  auto both_empty = decode_csv(records_of({","}), spec_of({string_scalar("x"), string_scalar("y")}));
  REQUIRE(both_empty.ok());
  CHECK(both_empty->components[0].string_at(0) == "x");
  CHECK(both_empty->components[1].string_at(0) == "y");
}

TEST_CASE("decode_csv uses the given single-character delimiter", "[csv]") {
  auto spec = spec_of({required(DType::kInt64), required(DType::kString), required(DType::kInt64)});
  spec.field_delim = "|";
  auto result = decode_csv(records_of({"1|a,b|2"}), spec);
  REQUIRE(result.ok());
  CHECK(result->components[1].string_at(0) == "a,b");
  spec.field_delim = "\t";
  result = decode_csv(records_of({"1\t a \t2"}), spec);
  REQUIRE(result.ok());
  CHECK(result->components[1].string_at(0) == " a ");
}

TEST_CASE("decode_csv allows spaces and a plus sign around numbers, as TF does", "[csv]") {
  auto spec = spec_of({required(DType::kInt32), required(DType::kInt64), required(DType::kFloat32),
                       required(DType::kFloat64), required(DType::kString)});
  auto result = decode_csv(records_of({" 12 ,\t+34,  -1.5 ,+2e2 , keep "}), spec);
  REQUIRE(result.ok());
  CHECK(values<int32_t>(result->components[0]) == std::vector<int32_t>{12});
  CHECK(values<int64_t>(result->components[1]) == std::vector<int64_t>{34});
  CHECK(values<float>(result->components[2]) == std::vector<float>{-1.5f});
  CHECK(values<double>(result->components[3]) == std::vector<double>{200.0});
  // Strings keep their spaces unless trim_whitespace is set.
  CHECK(result->components[4].string_at(0) == " keep ");
}

TEST_CASE("decode_csv reads inf, nan and out-of-range floats", "[csv]") {
  auto spec = spec_of({required(DType::kFloat32), required(DType::kFloat32),
                       required(DType::kFloat64), required(DType::kFloat32),
                       required(DType::kFloat32)});
  auto result = decode_csv(records_of({"inf,-Infinity,nan,1e40,1e-50"}), spec);
  REQUIRE(result.ok());
  CHECK(values<float>(result->components[0])[0] == std::numeric_limits<float>::infinity());
  CHECK(values<float>(result->components[1])[0] == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(values<double>(result->components[2])[0]));
  CHECK(values<float>(result->components[3])[0] == std::numeric_limits<float>::infinity());
  CHECK(values<float>(result->components[4])[0] == 0.0f);
}

TEST_CASE("decode_csv trim_whitespace strips blanks around fields", "[csv]") {
  auto spec = spec_of({required(DType::kString), required(DType::kString), required(DType::kInt64),
                       string_scalar("missing")});
  spec.trim_whitespace = true;
  spec.na_value = "?";
  auto result = decode_csv(records_of({"  a b ,  \" q , \"  , 3 , ?", "x,y,4,  "}), spec);
  REQUIRE(result.ok());
  CHECK(strings(result->components[0]) == std::vector<std::string>{"a b", "x"});
  // Blanks inside quotes stay.
  CHECK(strings(result->components[1]) == std::vector<std::string>{" q , ", "y"});
  CHECK(values<int64_t>(result->components[2]) == std::vector<int64_t>{3, 4});
  // "?" after trimming is the na_value; blanks alone trim to an empty field.
  CHECK(strings(result->components[3]) == std::vector<std::string>{"missing", "missing"});
}

TEST_CASE("decode_csv reads UCI adult.data lines with trim_whitespace", "[csv]") {
  const std::vector<std::string> lines = {
      "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, "
      "Male, 2174, 0, 40, United-States, <=50K",
      "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, "
      "White, Male, 0, 0, 13, United-States, <=50K",
      "52, Self-emp-inc, 287927, HS-grad, 9, Married-civ-spouse, Exec-managerial, Wife, White, "
      "Female, 15024, 0, 40, United-States, >50K",
      "54, ?, 180211, Some-college, 10, Married-civ-spouse, ?, Husband, Asian-Pac-Islander, Male, "
      "0, 0, 60, South, >50K",
  };
  const bool is_int[15] = {true,  false, true,  false, true, false, false, false,
                           false, false, true,  true,  true, false, false};
  CsvSpec spec;
  for (bool i : is_int) spec.record_defaults.push_back(required(i ? DType::kInt64 : DType::kString));
  spec.trim_whitespace = true;
  auto result = decode_csv(records_of(lines), spec);
  REQUIRE(result.ok());
  const auto& c = result->components;
  REQUIRE(c.size() == 15);
  CHECK(values<int64_t>(c[0]) == std::vector<int64_t>{39, 50, 52, 54});
  CHECK(strings(c[1]) ==
        std::vector<std::string>{"State-gov", "Self-emp-not-inc", "Self-emp-inc", "?"});
  CHECK(values<int64_t>(c[2]) == std::vector<int64_t>{77516, 83311, 287927, 180211});
  CHECK(values<int64_t>(c[10]) == std::vector<int64_t>{2174, 0, 15024, 0});
  CHECK(strings(c[13]) ==
        std::vector<std::string>{"United-States", "United-States", "United-States", "South"});
  CHECK(strings(c[14]) == std::vector<std::string>{"<=50K", "<=50K", ">50K", ">50K"});

  // With "?" as na_value, the unknown workclass is missing: required fails.
  spec.na_value = "?";
  Status status = error_of(records_of(lines), spec);
  CHECK(status.message() == "Field 1 is required but missing in record 3: '?'");
}

TEST_CASE("decode_csv rejects a record with the wrong number of fields", "[csv]") {
  auto spec = spec_of({required(DType::kInt64), required(DType::kInt64), required(DType::kInt64)});
  CHECK(error_of(records_of({"1,2,3", "4,5"}), spec).message() ==
        "Expect 3 fields but have 2 in record 1: '4,5'");
  CHECK(error_of(records_of({"1,2,3,4"}), spec).message() ==
        "Expect 3 fields but have 4 in record 0: '1,2,3,4'");
  // TF: an empty record has no fields at all.
  CHECK(error_of(records_of({""}), spec_of({string_scalar("")})).message() ==
        "Expect 1 fields but have 0 in record 0: ''");
  // A selected column past the record's end.
  auto select = spec_of({required(DType::kInt64)});
  select.select_cols = {5};
  CHECK(error_of(records_of({"1,2"}), select).message() ==
        "Expect 1 fields but have 0 in record 0: '1,2'");
}

TEST_CASE("decode_csv rejects text that is not a number of the column's dtype", "[csv]") {
  auto spec = spec_of({required(DType::kInt32), required(DType::kInt64), required(DType::kFloat32),
                       required(DType::kFloat64)});
  auto with = [&](std::string record) { return error_of(records_of({"1,2,3,4", record}), spec); };
  CHECK(with("x1,2,3,4").message() == "Field 0 in record 1 is not a valid int32: 'x1'");
  CHECK(with("2147483648,2,3,4").message() ==
        "Field 0 in record 1 is not a valid int32: '2147483648'");
  CHECK(with("1,abc,3,4").message() == "Field 1 in record 1 is not a valid int64: 'abc'");
  CHECK(with("1,1.5,3,4").message() == "Field 1 in record 1 is not a valid int64: '1.5'");
  CHECK(with("1,2,3.5.5,4").message() == "Field 2 in record 1 is not a valid float32: '3.5.5'");
  CHECK(with("1,2,3,4x").message() == "Field 3 in record 1 is not a valid float64: '4x'");
  CHECK(with("1,2,3,+-4").message() == "Field 3 in record 1 is not a valid float64: '+-4'");
  // Blanks alone are not empty, so not missing either (TF).
  CHECK(with("1, ,3,4").message() == "Field 1 in record 1 is not a valid int64: ' '");
}

TEST_CASE("decode_csv error messages name the column when select_cols is set", "[csv]") {
  auto spec = spec_of({required(DType::kInt64), required(DType::kInt64)});
  spec.select_cols = {0, 3};
  CHECK(error_of(records_of({"1,b,c,dd"}), spec).message() ==
        "Field 1 (column 3) in record 0 is not a valid int64: 'dd'");
}

TEST_CASE("decode_csv rejects a missing value in a required column", "[csv]") {
  auto spec = spec_of({Tensor::scalar<int64_t>(0), required(DType::kString)});
  CHECK(error_of(records_of({"1,a", "2,"}), spec).message() ==
        "Field 1 is required but missing in record 1: ''");
  spec.na_value = "n/a";
  CHECK(error_of(records_of({"1,n/a"}), spec).message() ==
        "Field 1 is required but missing in record 0: 'n/a'");
}

TEST_CASE("decode_csv rejects quotes and line breaks inside unquoted fields", "[csv]") {
  auto spec = spec_of({required(DType::kString), required(DType::kString)});
  CHECK(error_of(records_of({"ok,ok", "a\"b,c"}), spec).message() ==
        "Record 1, column 0: Unquoted fields cannot have quotes/CRLFs inside: 'a\"b'");
  CHECK(error_of(records_of({"a,b\n"}), spec).message() ==
        "Record 0, column 1: Unquoted fields cannot have quotes/CRLFs inside: 'b\\x0a'");
  CHECK_THAT(error_of(records_of({"a\r,b"}), spec).message(),
             Contains("Record 0, column 0: Unquoted fields cannot have quotes/CRLFs inside"));
}

TEST_CASE("decode_csv rejects an unterminated quoted field", "[csv]") {
  auto spec = spec_of({required(DType::kString), required(DType::kString)});
  CHECK(error_of(records_of({"a,\"bc"}), spec).message() ==
        "Record 0, column 1: Quoted field has to end with quote followed by delim or end: '\"bc'");
}

TEST_CASE("decode_csv rejects an unescaped quote inside a quoted field", "[csv]") {
  auto spec = spec_of({required(DType::kString), required(DType::kString)});
  CHECK(error_of(records_of({"\"ab\"c,d"}), spec).message() ==
        "Record 0, column 0: Quote inside a string has to be escaped by another quote: "
        "'\"ab\"c'");
}

TEST_CASE("decode_csv rejects a field_delim that is not one character", "[csv]") {
  auto spec = spec_of({required(DType::kString)});
  spec.field_delim = "";
  CHECK_THAT(error_of(records_of({"a"}), spec).message(), Contains("field_delim should be exactly 1 char"));
  spec.field_delim = ", ";
  CHECK_THAT(error_of(records_of({"a"}), spec).message(), Contains("', '"));
  spec.field_delim = "\"";
  CHECK_THAT(error_of(records_of({"a"}), spec).message(),
             Contains("field_delim cannot be '\"' when use_quote_delim is true"));
  spec.use_quote_delim = false;
  CHECK(decode_csv(records_of({"a"}), spec).ok());
}

TEST_CASE("decode_csv rejects bad select_cols", "[csv]") {
  auto spec = spec_of({required(DType::kString), required(DType::kString)});
  auto records = records_of({"a,b,c"});
  spec.select_cols = {2, 1};
  CHECK_THAT(error_of(records, spec).message(),
             Contains("select_cols should be strictly increasing indices, got 2 before 1"));
  spec.select_cols = {1, 1};
  CHECK_THAT(error_of(records, spec).message(), Contains("strictly increasing"));
  spec.select_cols = {-1, 1};
  CHECK_THAT(error_of(records, spec).message(),
             Contains("select_cols should be non-negative indices, got -1"));
  spec.select_cols = {0, 1, 2};
  CHECK_THAT(error_of(records, spec).message(),
             Contains("select_cols has 3 columns but record_defaults 2 fields"));
}

TEST_CASE("decode_csv rejects defaults that are not a scalar or empty", "[csv]") {
  auto records = records_of({"1"});
  CHECK_THAT(error_of(records, spec_of({*Tensor::from_vector<int64_t>({1, 2}, Shape{2})})).message(),
             Contains("record_defaults[0] should be a scalar default or an empty tensor, got "
                      "shape [2]"));
  CHECK_THAT(error_of(records, spec_of({*Tensor::from_vector<int64_t>({1}, Shape{1, 1})})).message(),
             Contains("got shape [1, 1]"));
}

TEST_CASE("decode_csv rejects unsupported dtypes and an empty spec", "[csv]") {
  auto records = records_of({"1,1"});
  CHECK_THAT(error_of(records, spec_of({required(DType::kInt64), Tensor::scalar<bool>(true)})).message(),
             Contains("record_defaults[1] has dtype bool"));
  CHECK_THAT(error_of(records, spec_of({Tensor(), required(DType::kInt64)})).message(),
             Contains("record_defaults[0] has dtype invalid"));
  CHECK_THAT(error_of(records, spec_of({})).message(), Contains("record_defaults must have one entry"));
}

TEST_CASE("decode_csv rejects records that are not strings", "[csv]") {
  CHECK_THAT(error_of(Tensor::scalar<int64_t>(1), spec_of({required(DType::kInt64)})).message(),
             Contains("records must be a string tensor, got int64"));
}

}  // namespace
}  // namespace capstan::data
