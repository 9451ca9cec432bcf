#include "data/io/text_line.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "data/test_util.h"

namespace capstan::data::io {
namespace {

using testing::gzip;
using testing::read_records;
using testing::TempDir;
using testing::write_bytes;

// The lines of `content`, read back through a file (plain and gzip must agree).
std::vector<std::string> lines_of(const std::string& content) {
  TempDir dir;
  std::vector<std::string> results[2];
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    std::string path = dir.file("lines");
    write_bytes(path, compression == Compression::kGzip ? gzip(content) : content);
    auto reader = TextLineReader::open(path, compression);
    REQUIRE(reader.ok());
    results[compression == Compression::kGzip ? 1 : 0] = read_records(**reader);
    // The end stays the end.
    std::string line;
    auto again = (*reader)->read(&line);
    REQUIRE(again.ok());
    CHECK_FALSE(*again);
  }
  CHECK(results[0] == results[1]);
  return results[0];
}

using Lines = std::vector<std::string>;

TEST_CASE("text lines split on newline") {
  CHECK(lines_of("a\nbb\nccc\n") == Lines{"a", "bb", "ccc"});
}

TEST_CASE("a last line without a newline is returned") {
  CHECK(lines_of("a\nlast") == Lines{"a", "last"});
  CHECK(lines_of("only") == Lines{"only"});
}

TEST_CASE("an empty file gives no lines") { CHECK(lines_of("").empty()); }

TEST_CASE("empty lines in the middle give empty strings") {
  CHECK(lines_of("a\n\nb\n") == Lines{"a", "", "b"});
  CHECK(lines_of("\n") == Lines{""});
  CHECK(lines_of("\n\n") == Lines{"", ""});
  CHECK(lines_of("\na") == Lines{"", "a"});
}

TEST_CASE("CRLF line endings lose the carriage return") {
  CHECK(lines_of("a\r\nb\r\n") == Lines{"a", "b"});
  CHECK(lines_of("a\r\n\r\nb") == Lines{"a", "", "b"});
  CHECK(lines_of("a\r\nlast\r") == Lines{"a", "last"});
}

TEST_CASE("every carriage return is dropped, as TensorFlow's ReadLine does") {
  CHECK(lines_of("a\rb\n") == Lines{"ab"});
  CHECK(lines_of("\r\ra\r\r\n") == Lines{"a"});
  // A last line that is empty once '\r' is dropped is no line at all.
  CHECK(lines_of("a\n\r") == Lines{"a"});
  CHECK(lines_of("\r") == Lines{});
}

TEST_CASE("lines longer than the read block come back whole") {
  std::string long_line(1500 * 1024, 'x');
  long_line[12345] = 'y';
  CHECK(lines_of("short\n" + long_line + "\n" + long_line) == Lines{"short", long_line, long_line});
}

TEST_CASE("many lines across read blocks match a plain split") {
  std::mt19937_64 rng(7);
  std::string content;
  Lines expected;
  for (int i = 0; i < 40000; ++i) {
    std::string line(rng() % 40, 'a' + static_cast<char>(i % 26));
    expected.push_back(line);
    content += line + (i % 3 == 0 ? "\r\n" : "\n");
  }
  CHECK(lines_of(content) == expected);
}

TEST_CASE("opening a missing text file is NotFound") {
  auto reader = TextLineReader::open("/nonexistent/capstan/lines.txt", Compression::kNone);
  CHECK(reader.status().code() == StatusCode::kNotFound);
}

TEST_CASE("a corrupt gzip text file is DataLoss, and stays so") {
  TempDir dir;
  std::string path = dir.file("bad.gz");
  std::string content;
  for (int i = 0; i < 20000; ++i) content += "line " + std::to_string(i) + "\n";
  std::string compressed = gzip(content);
  compressed.resize(compressed.size() / 2);  // cut short
  write_bytes(path, compressed);
  auto reader = TextLineReader::open(path, Compression::kGzip);
  REQUIRE(reader.ok());
  std::string line;
  Status status;
  int lines = 0;
  while (true) {
    auto more = (*reader)->read(&line);
    if (!more.ok()) {
      status = more.status();
      break;
    }
    REQUIRE(*more);  // must not end cleanly
    ++lines;
  }
  CHECK(lines > 0);
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("truncated gzip data in '" + path + "'") == 0);
  CHECK((*reader)->read(&line).status() == status);
}

}  // namespace
}  // namespace capstan::data::io
