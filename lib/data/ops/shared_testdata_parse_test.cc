// decode_csv and parse_example on real files that other tools wrote
// (../shared/testdata, see its README.md): UCI adult.data and a TFRecord file
// of tf.train.Examples that TensorFlow wrote.
//
// The directory is $CAPSTAN_SHARED_TESTDATA, else found from this file's
// path. The build registers these [shared] cases only where it exists; run
// by hand without it, they fail and say where they looked.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/ops/csv.h"
#include "data/ops/example.h"
#include "data/ops/example_testing.h"
#include "data/test_util.h"
#include "example.pb.h"

namespace capstan::data {
namespace {

using testing::values;

std::filesystem::path shared_testdata() {
  if (const char* dir = std::getenv("CAPSTAN_SHARED_TESTDATA"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  // This file is <repo>/lib/data/ops/; the data is <repo>/../shared/testdata.
  return std::filesystem::path(__FILE__).parent_path() / "../../../../shared/testdata";
}

// The bytes of `name` under the shared testdata directory; fails the test
// case when the directory or the file is missing.
std::string read_shared(const std::string& name) {
  std::filesystem::path dir = shared_testdata();
  if (!std::filesystem::is_directory(dir)) {
    FAIL("shared testdata directory not found at " << dir.string()
                                                   << "; set CAPSTAN_SHARED_TESTDATA to it");
  }
  std::filesystem::path path = dir / name;
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot open shared testdata file " << path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The records of a TFRecord file: each is a little-endian uint64 length, a
// 4-byte CRC of the length, the data and a 4-byte CRC of the data. The CRCs
// are not checked; this stands in for the real reader in these tests only.
std::vector<std::string> read_tfrecords(const std::string& file) {
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < file.size()) {
    REQUIRE(file.size() - pos >= 12);
    uint64_t length = 0;
    std::memcpy(&length, file.data() + pos, sizeof(length));  // x86 and ARM are little-endian
    pos += 12;
    REQUIRE(file.size() - pos >= length + 4);
    records.push_back(file.substr(pos, length));
    pos += length + 4;
  }
  return records;
}

TEST_CASE("decode_csv parses every row of UCI adult.data", "[shared][csv]") {
  std::string text = read_shared("adult/adult.data");
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(text.substr(start, end - start));  // the file ends in a blank line
    start = end + 1;
  }
  REQUIRE(lines.size() == 32561);

  // age, workclass, fnlwgt, education, education-num, marital-status,
  // occupation, relationship, race, sex, capital-gain, capital-loss,
  // hours-per-week, native-country, income; every field present.
  const bool is_int[15] = {true,  false, true,  false, true, false, false, false,
                           false, false, true,  true,  true, false, false};
  CsvSpec spec;
  for (bool i : is_int) spec.record_defaults.push_back(*Tensor::zeros(i ? DType::kInt64 : DType::kString, Shape{0}));
  spec.trim_whitespace = true;
  auto records = Tensor::from_strings(lines, Shape{static_cast<int64_t>(lines.size())});
  REQUIRE(records.ok());
  auto result = decode_csv(*records, spec);
  REQUIRE(result.ok());
  const auto& c = result->components;
  REQUIRE(c.size() == 15);
  for (const auto& t : c) CHECK(t.shape() == Shape{32561});

  // Row 0: "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical,
  // Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K".
  CHECK(c[0].flat<int64_t>()[0] == 39);
  CHECK(c[1].string_at(0) == "State-gov");
  CHECK(c[2].flat<int64_t>()[0] == 77516);
  CHECK(c[3].string_at(0) == "Bachelors");
  CHECK(c[4].flat<int64_t>()[0] == 13);
  CHECK(c[8].string_at(0) == "White");
  CHECK(c[10].flat<int64_t>()[0] == 2174);
  CHECK(c[11].flat<int64_t>()[0] == 0);
  CHECK(c[12].flat<int64_t>()[0] == 40);
  CHECK(c[13].string_at(0) == "United-States");
  CHECK(c[14].string_at(0) == "<=50K");
  // The last row.
  CHECK(c[0].flat<int64_t>()[32560] == 52);
  CHECK(c[10].flat<int64_t>()[32560] == 15024);
  CHECK(c[14].string_at(32560) == ">50K");

  // Whole-column figures, counted with awk and grep.
  int64_t age_sum = 0;
  for (int64_t age : c[0].flat<int64_t>()) age_sum += age;
  CHECK(age_sum == 1256257);
  int64_t rich = 0;
  for (int64_t i = 0; i < c[14].num_elements(); ++i) rich += c[14].string_at(i) == ">50K";
  CHECK(rich == 7841);
}

TEST_CASE("parse_example parses the Examples of example.tfrecord", "[shared][example]") {
  std::vector<std::string> records = read_tfrecords(read_shared("tfrecord/example.tfrecord"));
  REQUIRE(records.size() == 4);
  FeatureSpec spec = {{"x_float", FixedLenFeature{DType::kFloat32, {10}, std::nullopt}},
                      {"x_int", FixedLenFeature{DType::kInt64, {10}, std::nullopt}},
                      {"x_byte", FixedLenFeature{DType::kString, {1}, std::nullopt}}};
  auto serialized = Tensor::from_strings(records, Shape{4});
  REQUIRE(serialized.ok());
  auto result = parse_example(*serialized, spec);
  REQUIRE(result.ok());
  REQUIRE(result->names == std::vector<std::string>{"x_byte", "x_float", "x_int"});
  const auto& c = result->components;
  REQUIRE(c[0].shape() == Shape{4, 1});
  REQUIRE(c[1].shape() == Shape{4, 10});
  REQUIRE(c[2].shape() == Shape{4, 10});
  std::vector<float> floats;
  std::vector<int64_t> ints;
  for (int i = 0; i < 4; ++i) {
    CHECK(c[0].string_at(i) == "test str");
    for (int k = 0; k < 10; ++k) {
      floats.push_back(static_cast<float>(10 * i + k));
      ints.push_back(100 * i + 10 * k);
    }
  }
  CHECK(values<float>(c[1]) == floats);
  CHECK(values<int64_t>(c[2]) == ints);

  // And one record on its own, as tf.io.parse_single_example would.
  auto single = Tensor::from_strings({records[3]}, Shape{});
  REQUIRE(single.ok());
  auto one = parse_example(*single, {{"x_int", VarLenFeature{DType::kInt64}}});
  REQUIRE(one.ok());
  CHECK(values<int64_t>(one->components[1]) ==
        std::vector<int64_t>{300, 310, 320, 330, 340, 350, 360, 370, 380, 390});
  CHECK(values<int64_t>(one->components[2]) == std::vector<int64_t>{10});
}

// Every TFRecord file in the shared testdata, plain and GZIP, read with
// specs made from its own features: the wire parser and the protobuf
// reference give the same tensors (and the same error where a spec does not
// fit a record, or a record is not an Example).
TEST_CASE("the wire parser and the protobuf reference agree on every shared TFRecord file", "[shared][example]") {
  std::vector<std::string> files = {"tfrecord/example.tfrecord", "tfrecord/sequence_example.tfrecord",
                                    "tfrecord/tf_rust_expected.tfrecord"};
  for (const auto& entry : std::filesystem::directory_iterator(shared_testdata() / "tfrecord_gzip")) {
    files.push_back("tfrecord_gzip/" + entry.path().filename().string());
  }
  int64_t compared = 0;
  for (const std::string& name : files) {
    INFO(name);
    std::string bytes = read_shared(name);  // fails the test when the file is missing
    if (name.ends_with(".gz")) bytes = testing::gunzip_file((shared_testdata() / name).string());
    std::vector<std::string> records = read_tfrecords(bytes);
    REQUIRE(!records.empty());
    if (records.size() > 2000) records.resize(2000);

    // The features of the first record, with their kinds and lengths.
    FeatureSpec var_spec, fixed_spec, wrong_spec;
    tfexample::Example first;
    if (first.ParseFromString(records[0])) {
      for (const auto& [key, feature] : first.features().feature()) {
        DType dtype = feature.has_int64_list()   ? DType::kInt64
                      : feature.has_float_list() ? DType::kFloat32
                                                 : DType::kString;
        int64_t length = dtype == DType::kInt64     ? feature.int64_list().value_size()
                         : dtype == DType::kFloat32 ? feature.float_list().value_size()
                                                    : feature.bytes_list().value_size();
        var_spec[key] = VarLenFeature{dtype};
        fixed_spec[key] = FixedLenFeature{dtype, Shape{length}, std::nullopt};
        wrong_spec[key] = VarLenFeature{dtype == DType::kString ? DType::kInt64 : DType::kString};
      }
    }
    var_spec["absent_feature"] = VarLenFeature{DType::kFloat32};
    for (const FeatureSpec* spec : {&var_spec, &fixed_spec, &wrong_spec}) {
      for (size_t start = 0; start < records.size(); start += 64) {
        std::vector<std::string> batch(records.begin() + static_cast<std::ptrdiff_t>(start),
                                       records.begin() + static_cast<std::ptrdiff_t>(std::min(records.size(), start + 64)));
        auto serialized = Tensor::from_strings(batch, Shape{static_cast<int64_t>(batch.size())});
        REQUIRE(serialized.ok());
        REQUIRE(testing::compare_results(parse_example(*serialized, *spec),
                                         parse_example_reference(*serialized, *spec)) == "");
        ++compared;
      }
    }
  }
  CHECK(compared > 100);
}

}  // namespace
}  // namespace capstan::data
