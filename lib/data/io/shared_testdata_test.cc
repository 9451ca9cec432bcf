// Reads the real files of the shared test data (files written by TensorFlow
// and TFX, see testdata/README.md) to prove Capstan reads what users have.
//
// The directory comes from CAPSTAN_SHARED_TESTDATA, else from this source
// file's location (<repo>/../shared/testdata). These cases are tagged
// [shared]; the build registers them only when the directory exists, and
// they FAIL, naming the directory, when it is missing.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <zlib.h>

#include "capstan/data/tfrecord.h"
#include "data/io/file.h"
#include "data/io/text_line.h"
#include "data/io/tfrecord.h"
#include "data/test_util.h"

namespace capstan::data::io {
namespace {

namespace fs = std::filesystem;
using testing::read_records;

std::string testdata_dir() {
  const char* from_env = std::getenv("CAPSTAN_SHARED_TESTDATA");
  fs::path dir = from_env != nullptr && *from_env != '\0'
                     ? fs::path(from_env)
                     : (fs::path(__FILE__).parent_path() / "../../../../shared/testdata")
                           .lexically_normal();
  if (!fs::is_directory(dir)) {
    FAIL("shared test data directory '" << dir.string()
                                        << "' does not exist; set CAPSTAN_SHARED_TESTDATA to "
                                           "the testdata directory");
  }
  return dir.string();
}

// Every record of a TFRecord file (each CRC checked by the reader).
std::vector<std::string> all_records(const std::string& path, Compression compression) {
  auto reader = TFRecordReader::open(path, compression);
  REQUIRE(reader.ok());
  INFO(path);
  return read_records(**reader);
}

std::vector<std::string> all_lines(const std::string& path) {
  auto reader = TextLineReader::open(path, Compression::kNone);
  REQUIRE(reader.ok());
  return read_records(**reader);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_CASE("reads TensorFlow's tf_rust_expected.tfrecord: one record", "[shared]") {
  auto records = all_records(testdata_dir() + "/tfrecord/tf_rust_expected.tfrecord",
                             Compression::kNone);
  CHECK(records == std::vector<std::string>{"The Quick Brown Fox"});
}

TEST_CASE("reads example.tfrecord: 4 tf.train.Example records", "[shared]") {
  auto records = all_records(testdata_dir() + "/tfrecord/example.tfrecord", Compression::kNone);
  REQUIRE(records.size() == 4);
  for (const auto& record : records) {
    CHECK(contains(record, "x_float"));
    CHECK(contains(record, "x_int"));
    CHECK(contains(record, "test str"));
  }
}

TEST_CASE("reads sequence_example.tfrecord: 4 records", "[shared]") {
  auto records =
      all_records(testdata_dir() + "/tfrecord/sequence_example.tfrecord", Compression::kNone);
  CHECK(records.size() == 4);
}

TEST_CASE("reads the GZIP TFRecord files TFX wrote, with their record counts", "[shared]") {
  const std::string dir = testdata_dir() + "/tfrecord_gzip/";
  const std::vector<std::pair<std::string, size_t>> files = {
      {"tfx_penguin_Split-train_data_tfrecord-00000-of-00001.gz", 234},
      {"tfx_penguin_Split-eval_data_tfrecord-00000-of-00001.gz", 100},
      {"tfx_csv_example_gen_Split-train_data_tfrecord-00000-of-00012.gz", 826},
      {"tfx_external_taxi_data_tfrecord-00000-of-00002.gz", 9988},
      {"tfx_external_taxi_data_tfrecord-00001-of-00002.gz", 5012},
  };
  for (const auto& [name, count] : files) {
    INFO(name);
    auto records = all_records(dir + name, Compression::kGzip);
    CHECK(records.size() == count);
    for (const auto& record : records) REQUIRE_FALSE(record.empty());
  }
}

TEST_CASE("match_files lists the shared GZIP TFRecord shards in order", "[shared]") {
  const std::string dir = testdata_dir() + "/tfrecord_gzip/";
  auto matched = match_files(dir + "tfx_external_taxi_data_tfrecord-*-of-00002.gz");
  REQUIRE(matched.ok());
  CHECK(*matched == std::vector<std::string>{
                        dir + "tfx_external_taxi_data_tfrecord-00000-of-00002.gz",
                        dir + "tfx_external_taxi_data_tfrecord-00001-of-00002.gz"});
  auto all = match_files(dir + "*.gz");
  REQUIRE(all.ok());
  CHECK(all->size() == 5);
}

// adult.data ends with "\n\n": like TextLineDataset, the reader yields the
// empty line before the end.
TEST_CASE("reads UCI Adult as text lines, as TextLineDataset does", "[shared]") {
  auto train = all_lines(testdata_dir() + "/adult/adult.data");
  REQUIRE(train.size() == 32561 + 1);
  CHECK(train.back().empty());
  for (size_t i = 0; i + 1 < train.size(); ++i) {
    size_t separators = 0;
    for (size_t at = train[i].find(", "); at != std::string::npos;
         at = train[i].find(", ", at + 2)) {
      ++separators;
    }
    INFO("line " << i << ": " << train[i]);
    REQUIRE(separators == 14);
  }
  auto test = all_lines(testdata_dir() + "/adult/adult.test");
  REQUIRE(test.size() == 1 + 16281 + 1);
  CHECK(test.front() == "|1x3 Cross validator");
  CHECK(test[1].back() == '.');
  CHECK(test.back().empty());
}

// The bytes of a GZIP file, decompressed.
std::string gunzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  REQUIRE(file != nullptr);
  std::string out;
  char buffer[1 << 16];
  int n;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
  gzclose(file);
  return out;
}

// Writes `records` with the public tf.io.TFRecordWriter counterpart.
void write_all(const std::string& path, const std::vector<std::string>& records, data::Compression compression) {
  auto writer = data::TFRecordWriter::open(path, compression);
  REQUIRE(writer.ok());
  for (const auto& record : records) REQUIRE((*writer)->write(record).ok());
  REQUIRE((*writer)->close().ok());
}

TEST_CASE("the public TFRecordWriter rewrites TensorFlow's files byte for byte", "[shared]") {
  testing::TempDir dir;
  for (const char* name : {"tf_rust_expected.tfrecord", "example.tfrecord", "sequence_example.tfrecord"}) {
    INFO(name);
    const std::string original = testdata_dir() + "/tfrecord/" + name;
    const std::string copy = dir.file(name);
    write_all(copy, all_records(original, Compression::kNone), data::Compression::kNone);
    CHECK(testing::read_bytes(copy) == testing::read_bytes(original));
  }
}

TEST_CASE("the public TFRecordWriter's GZIP files hold TFX's records byte for byte", "[shared]") {
  testing::TempDir dir;
  for (const auto& entry : fs::directory_iterator(testdata_dir() + "/tfrecord_gzip")) {
    const std::string original = entry.path().string();
    INFO(original);
    const std::string copy = dir.file(entry.path().filename().string());
    auto records = all_records(original, Compression::kGzip);
    REQUIRE_FALSE(records.empty());
    write_all(copy, records, data::Compression::kGzip);
    // GZIP encoders differ in their compressed bytes; the TFRecord stream
    // inside must not.
    CHECK(gunzip(copy) == gunzip(original));
    CHECK(all_records(copy, Compression::kGzip) == records);
  }
}

}  // namespace
}  // namespace capstan::data::io

