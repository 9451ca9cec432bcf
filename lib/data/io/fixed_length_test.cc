#include "data/io/fixed_length.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "data/test_util.h"

namespace capstan::data::io {
namespace {

namespace fs = std::filesystem;
using testing::gzip;
using testing::TempDir;
using testing::write_bytes;

using Records = std::vector<std::string>;

struct Layout {
  int64_t record_bytes;
  int64_t header_bytes;
  int64_t footer_bytes;
};

// Writes `content` (gzip-compressed for kGzip) and reads its records; the
// error that stopped the reader, if any, goes to *error.
Records read_fixed(const TempDir& dir, const std::string& content, Layout layout,
                   Compression compression, Status* error = nullptr) {
  std::string path = dir.file("records.bin");
  write_bytes(path, compression == Compression::kGzip ? gzip(content) : content);
  auto reader = FixedLengthRecordReader::open(path, layout.record_bytes, layout.header_bytes,
                                              layout.footer_bytes, compression);
  Records records;
  if (!reader.ok()) {
    REQUIRE(error != nullptr);
    *error = reader.status();
    return records;
  }
  std::string record;
  while (true) {
    auto more = (*reader)->read(&record);
    if (!more.ok()) {
      REQUIRE(error != nullptr);
      *error = more.status();
      CHECK((*reader)->read(&record).status() == *error);  // sticky
      return records;
    }
    if (!*more) break;
    CHECK(record.size() == static_cast<size_t>(layout.record_bytes));
    records.push_back(record);
  }
  auto again = (*reader)->read(&record);
  REQUIRE(again.ok());
  CHECK_FALSE(*again);
  if (error != nullptr) *error = Status::Ok();
  return records;
}

// TF's message for "HH0123456789F" read as records of 4 bytes between a
// 2-byte header and a 1-byte footer.
std::string not_whole_records(const TempDir& dir) {
  return "Excluding the header (2 bytes) and footer (1 bytes), input file '" + dir.file("records.bin") +
         "' has body length 10 bytes, which is not an exact multiple of the record length (4 bytes)";
}

// TensorFlow's documentation example for FixedLengthRecordDataset.
TEST_CASE("fixed-length records skip the header and stop before the footer") {
  TempDir dir;
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    CHECK(read_fixed(dir, "HEADER012345FOOTER", {2, 6, 6}, compression) ==
          Records{"01", "23", "45"});
  }
}

TEST_CASE("fixed-length records without header or footer cover the whole file") {
  TempDir dir;
  std::string content;
  Records expected;
  for (int i = 0; i < 100000; ++i) {  // 1.2 MB: spans the read buffer
    std::string record = "rec" + std::string(5 - std::to_string(i).size(), '0') +
                         std::to_string(i) + "!!!!";
    expected.push_back(record);
    content += record;
  }
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    CHECK(read_fixed(dir, content, {12, 0, 0}, compression) == expected);
  }
}

TEST_CASE("a body of zero records gives no records") {
  TempDir dir;
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    CHECK(read_fixed(dir, "", {4, 0, 0}, compression).empty());
    CHECK(read_fixed(dir, "HHFF", {4, 2, 2}, compression).empty());
  }
}

TEST_CASE("a footer longer than a record is still held back") {
  TempDir dir;
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    CHECK(read_fixed(dir, "Habcdef0123456789", {3, 1, 10}, compression) ==
          Records{"abc", "def"});
  }
}

TEST_CASE("record_bytes <= 0 or a negative header or footer is InvalidArgument") {
  TempDir dir;
  write_bytes(dir.file("f"), "abcd");
  for (Layout layout : {Layout{0, 0, 0}, Layout{-4, 0, 0}, Layout{4, -1, 0}, Layout{4, 0, -1}}) {
    auto reader = FixedLengthRecordReader::open(dir.file("f"), layout.record_bytes,
                                                layout.header_bytes, layout.footer_bytes,
                                                Compression::kNone);
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("an uncompressed body that is not whole records fails at open, as in TF") {
  TempDir dir;
  Status error;
  Records records = read_fixed(dir, "HH0123456789F", {4, 2, 1}, Compression::kNone, &error);
  CHECK(records.empty());
  CHECK(error.code() == StatusCode::kInvalidArgument);
  CHECK(error.message() == not_whole_records(dir));
}

TEST_CASE("a gzip body that is not whole records gives the records, then DataLoss, as in TF") {
  TempDir dir;
  Status error;
  Records records = read_fixed(dir, "HH0123456789F", {4, 2, 1}, Compression::kGzip, &error);
  CHECK(records == Records{"0123", "4567"});
  CHECK(error.code() == StatusCode::kDataLoss);
  CHECK(error.message() == not_whole_records(dir));
}

TEST_CASE("a file shorter than its header and footer is an error") {
  TempDir dir;
  Status error;
  read_fixed(dir, "HHHF", {4, 3, 2}, Compression::kNone, &error);
  CHECK(error.code() == StatusCode::kInvalidArgument);
  CHECK(error.message() == "input file '" + dir.file("records.bin") +
                               "' has 4 bytes, fewer than its header (3 bytes) and footer "
                               "(2 bytes)");
  read_fixed(dir, "HHHF", {4, 3, 2}, Compression::kGzip, &error);
  CHECK(error.code() == StatusCode::kDataLoss);
  CHECK(error.message() == "input file '" + dir.file("records.bin") +
                               "' has 4 bytes, fewer than its header (3 bytes) and footer "
                               "(2 bytes)");
  read_fixed(dir, "HH", {4, 3, 0}, Compression::kGzip, &error);
  CHECK(error.code() == StatusCode::kDataLoss);
}

TEST_CASE("a header larger than the read step is skipped") {
  TempDir dir;
  std::string header(3 * 1024 * 1024 + 1, 'H');
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    CHECK(read_fixed(dir, header + "abcdFF", {2, static_cast<int64_t>(header.size()), 2},
                     compression) == Records{"ab", "cd"});
  }
}

TEST_CASE("a file that shrinks while being read is DataLoss") {
  TempDir dir;
  std::string path = dir.file("shrinking");
  write_bytes(path, "0123456789ab");
  auto reader = FixedLengthRecordReader::open(path, 4, 0, 0, Compression::kNone);
  REQUIRE(reader.ok());
  fs::resize_file(path, 6);
  std::string record;
  auto first = (*reader)->read(&record);
  REQUIRE(first.ok());
  CHECK(record == "0123");
  auto second = (*reader)->read(&record);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == StatusCode::kDataLoss);
  CHECK(second.status().message().find("'" + path + "'") != std::string::npos);
}

TEST_CASE("opening a missing fixed-length file is NotFound") {
  auto reader =
      FixedLengthRecordReader::open("/nonexistent/capstan/f.bin", 4, 0, 0, Compression::kNone);
  CHECK(reader.status().code() == StatusCode::kNotFound);
}

TEST_CASE("corrupt gzip under fixed-length records is DataLoss") {
  TempDir dir;
  std::string path = dir.file("bad.gz");
  std::string content;
  for (int i = 0; i < 100000; ++i) content += std::to_string(1000000 + i);  // 7-byte records
  std::string compressed = gzip(content);
  SECTION("in the header: open() fails") {
    compressed[0] = 'X';
    write_bytes(path, compressed);
    auto reader = FixedLengthRecordReader::open(path, 7, 4, 0, Compression::kGzip);
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().code() == StatusCode::kDataLoss);
    CHECK(reader.status().message().find("corrupt gzip data in '" + path + "'") == 0);
  }
  SECTION("after some records: read() fails, and stays failed") {
    compressed.resize(compressed.size() / 2);
    write_bytes(path, compressed);
    auto reader = FixedLengthRecordReader::open(path, 7, 0, 0, Compression::kGzip);
    REQUIRE(reader.ok());
    std::string record;
    int records = 0;
    while (true) {
      auto more = (*reader)->read(&record);
      if (!more.ok()) {
        CHECK(more.status().code() == StatusCode::kDataLoss);
        CHECK(more.status().message().find("truncated gzip data in '" + path + "'") == 0);
        CHECK((*reader)->read(&record).status() == more.status());
        break;
      }
      REQUIRE(*more);
      CHECK(record == std::to_string(1000000 + records));
      ++records;
    }
    CHECK(records > 0);
  }
}

}  // namespace
}  // namespace capstan::data::io
