#include "data/io/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/test_util.h"

namespace capstan::data::io {
namespace {

namespace fs = std::filesystem;
using testing::gunzip_file;
using testing::gzip;
using testing::message_contains;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

// Compressible but not trivial: words drawn at random.
std::string random_text(size_t n, uint64_t seed) {
  static const char* kWords[] = {"alpha ", "beta ", "gamma\n", "delta ", "epsilon ", "zeta\r\n"};
  std::mt19937_64 rng(seed);
  std::string out;
  while (out.size() < n) out += kWords[rng() % 6];
  out.resize(n);
  return out;
}

// Reads the whole stream with reads of `chunk` bytes.
std::string read_all(InputStream& stream, size_t chunk) {
  std::string out;
  std::string buf(chunk, '\0');
  while (true) {
    auto got = stream.read(buf.data(), chunk);
    REQUIRE(got.ok());
    if (*got == 0) break;
    REQUIRE(*got <= chunk);
    out.append(buf, 0, *got);
  }
  return out;
}

std::string read_path(const std::string& path, Compression compression, size_t chunk = 4096) {
  auto stream = open_input(path, compression);
  REQUIRE(stream.ok());
  return read_all(**stream, chunk);
}

void write_path(const std::string& path, Compression compression, const std::string& data,
                size_t chunk) {
  auto stream = open_output(path, compression);
  REQUIRE(stream.ok());
  for (size_t i = 0; i < data.size(); i += chunk) {
    REQUIRE((*stream)->write(data.data() + i, std::min(chunk, data.size() - i)).ok());
  }
  REQUIRE((*stream)->close().ok());
}

// A path open(2) refuses with EACCES (or EROFS) for `flags`, even as root:
// sysfs attributes without the matching permission bit. Non-root users get
// a chmod'ed file in `dir`.
std::string permission_denied_path(const TempDir& dir, bool for_write) {
  if (::geteuid() != 0) {
    std::string path = dir.file(for_write ? "read_only" : "write_only");
    write_bytes(path, "secret");
    REQUIRE(::chmod(path.c_str(), for_write ? 0444 : 0200) == 0);
    return path;
  }
  const std::vector<std::string> candidates =
      for_write ? std::vector<std::string>{"/sys/devices/system/cpu/online",
                                           "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"}
                : std::vector<std::string>{"/sys/bus/pci/drivers_probe", "/sys/bus/pci/rescan",
                                           "/sys/bus/cpu/drivers_probe"};
  for (const auto& path : candidates) {
    if (fs::exists(path)) return path;
  }
  FAIL("running as root and no sysfs file to trigger EACCES with; looked at: " +
       candidates.front());
  return "";
}

// Expects `opened` to have failed with `code`, its message naming `part`.
template <typename T>
void require_error(const Result<T>& opened, StatusCode code, const std::string& part = "") {
  REQUIRE_FALSE(opened.ok());
  CHECK(opened.status().code() == code);
  CHECK(message_contains(opened.status(), part));
}

TEST_CASE("compression_from_name accepts TensorFlow's names in any case") {
  CHECK(compression_from_name("") == Compression::kNone);
  CHECK(compression_from_name("NONE") == Compression::kNone);
  CHECK(compression_from_name("none") == Compression::kNone);
  CHECK(compression_from_name("GZIP") == Compression::kGzip);
  CHECK(compression_from_name("gZip") == Compression::kGzip);
  CHECK_FALSE(compression_from_name("ZLIB").has_value());
  CHECK_FALSE(compression_from_name("gzip ").has_value());
  CHECK_FALSE(compression_from_name("bz2").has_value());
  CHECK(compression_name(Compression::kNone) == "NONE");
  CHECK(compression_name(Compression::kGzip) == "GZIP");
}

TEST_CASE("status_from_errno picks the code by what the caller should do") {
  CHECK(status_from_errno(ENOENT, "x").code() == StatusCode::kNotFound);
  CHECK(status_from_errno(ENOTDIR, "x").code() == StatusCode::kNotFound);
  CHECK(status_from_errno(EACCES, "x").code() == StatusCode::kPermissionDenied);
  CHECK(status_from_errno(EPERM, "x").code() == StatusCode::kPermissionDenied);
  CHECK(status_from_errno(EROFS, "x").code() == StatusCode::kPermissionDenied);
  CHECK(status_from_errno(EIO, "x").code() == StatusCode::kDataLoss);
  CHECK(status_from_errno(ENOSPC, "x").code() == StatusCode::kResourceExhausted);
  CHECK(status_from_errno(EMFILE, "x").code() == StatusCode::kResourceExhausted);
  CHECK(status_from_errno(EISDIR, "x").code() == StatusCode::kFailedPrecondition);
  CHECK(status_from_errno(ELOOP, "x").code() == StatusCode::kFailedPrecondition);
  CHECK(status_from_errno(ENAMETOOLONG, "x").code() == StatusCode::kInvalidArgument);
  CHECK(status_from_errno(EAGAIN, "x").code() == StatusCode::kUnavailable);
  CHECK(status_from_errno(EXDEV, "x").code() == StatusCode::kUnknown);
  Status status = status_from_errno(ENOENT, "cannot open 'f'");
  CHECK(status.message() == std::string("cannot open 'f': ") + std::strerror(ENOENT));
}

TEST_CASE("a plain file reads back exactly what was written, in any read size") {
  TempDir dir;
  std::string path = dir.file("data.bin");
  std::string data = random_bytes(3 * 1024 * 1024 + 17, 1);  // spans several 1 MiB buffers
  write_path(path, Compression::kNone, data, 1000);
  CHECK(read_bytes(path) == data);
  for (size_t chunk : {size_t{1} << 0, size_t{7}, size_t{4096}, size_t{1} << 20,
                       size_t{5} << 20}) {
    if (chunk == 1) {
      // Byte-at-a-time over the first 100 KiB only (keeps the test fast).
      auto stream = open_input(path, Compression::kNone);
      REQUIRE(stream.ok());
      std::string head;
      char c;
      while (head.size() < 100 * 1024) {
        auto got = (*stream)->read(&c, 1);
        REQUIRE(got.ok());
        REQUIRE(*got == 1);
        head += c;
      }
      CHECK(head == data.substr(0, head.size()));
      continue;
    }
    CHECK(read_path(path, Compression::kNone, chunk) == data);
  }
}

TEST_CASE("a plain input stream reports its size and position") {
  TempDir dir;
  std::string path = dir.file("data.bin");
  write_bytes(path, "0123456789");
  auto stream = open_input(path, Compression::kNone);
  REQUIRE(stream.ok());
  CHECK((*stream)->size() == std::optional<uint64_t>(10));
  CHECK((*stream)->position() == 0);
  char buf[4];
  REQUIRE((*stream)->read(buf, 4).ok());
  CHECK((*stream)->position() == 4);
  CHECK(read_all(**stream, 3) == "456789");
  CHECK((*stream)->position() == 10);
  auto end = (*stream)->read(buf, 4);
  REQUIRE(end.ok());
  CHECK(*end == 0);
  auto nothing = (*stream)->read(buf, 0);
  REQUIRE(nothing.ok());
  CHECK(*nothing == 0);
}

TEST_CASE("read_fully reads across short reads and stops at the end") {
  TempDir dir;
  std::string path = dir.file("gz");
  std::string data = random_text(200000, 2);
  write_bytes(path, gzip(data));
  auto stream = open_input(path, Compression::kGzip);
  REQUIRE(stream.ok());
  std::string buf(150000, '\0');
  auto got = read_fully(**stream, buf.data(), buf.size());
  REQUIRE(got.ok());
  CHECK(*got == 150000);
  CHECK(buf == data.substr(0, 150000));
  got = read_fully(**stream, buf.data(), buf.size());
  REQUIRE(got.ok());
  CHECK(*got == 50000);
  CHECK(buf.substr(0, 50000) == data.substr(150000));
}

TEST_CASE("an empty plain file reads as empty") {
  TempDir dir;
  std::string path = dir.file("empty");
  write_bytes(path, "");
  CHECK(read_path(path, Compression::kNone).empty());
}

TEST_CASE("opening a missing file is NotFound naming the path") {
  TempDir dir;
  std::string path = dir.file("missing.txt");
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    require_error(open_input(path, compression), StatusCode::kNotFound, "'" + path + "'");
  }
  auto under_file = open_input(dir.file("missing.txt/child"), Compression::kNone);
  CHECK(under_file.status().code() == StatusCode::kNotFound);
}

TEST_CASE("opening a directory for reading is FailedPrecondition") {
  TempDir dir;
  require_error(open_input(dir.path(), Compression::kNone), StatusCode::kFailedPrecondition, dir.path());
}

TEST_CASE("opening an unreadable file is PermissionDenied") {
  TempDir dir;
  std::string path = permission_denied_path(dir, /*for_write=*/false);
  require_error(open_input(path, Compression::kNone), StatusCode::kPermissionDenied, path);
}

TEST_CASE("an I/O error while reading is DataLoss naming the path and offset") {
  // Reading /proc/self/mem at offset 0 (never mapped) fails with EIO.
  auto stream = open_input("/proc/self/mem", Compression::kNone);
  REQUIRE(stream.ok());
  char buf[16];
  auto got = (*stream)->read(buf, sizeof(buf));
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(got.status(), "error reading '/proc/self/mem' at offset 0"));
  // Sticky.
  CHECK((*stream)->read(buf, sizeof(buf)).status() == got.status());
}

TEST_CASE("gzip output is standard gzip that zlib reads back") {
  TempDir dir;
  std::string path = dir.file("out.gz");
  std::string data = random_text(2 * 1024 * 1024 + 3, 3);
  write_path(path, Compression::kGzip, data, 100000);
  std::string compressed = read_bytes(path);
  REQUIRE(compressed.size() > 2);
  CHECK(static_cast<uint8_t>(compressed[0]) == 0x1f);
  CHECK(static_cast<uint8_t>(compressed[1]) == 0x8b);
  CHECK(compressed.size() < data.size() / 2);
  CHECK(gunzip_file(path) == data);
}

TEST_CASE("gzip input reads data compressed by zlib, in any read size") {
  TempDir dir;
  std::string path = dir.file("in.gz");
  std::string data = random_text(3 * 1024 * 1024, 4) + random_bytes(500000, 5);
  write_bytes(path, gzip(data));
  for (size_t chunk : {size_t{1000}, size_t{65536}, size_t{4} << 20}) {
    CHECK(read_path(path, Compression::kGzip, chunk) == data);
  }
  auto stream = open_input(path, Compression::kGzip);
  REQUIRE(stream.ok());
  CHECK_FALSE((*stream)->size().has_value());
  CHECK(read_all(**stream, 12345).size() == data.size());
  CHECK((*stream)->position() == data.size());
}

TEST_CASE("gzip round trip through open_output and open_input") {
  TempDir dir;
  std::string path = dir.file("round.gz");
  std::string data = random_bytes(700000, 6) + random_text(700000, 7);
  write_path(path, Compression::kGzip, data, 333333);
  CHECK(read_path(path, Compression::kGzip) == data);
}

TEST_CASE("concatenated gzip members read as one stream") {
  TempDir dir;
  std::string path = dir.file("multi.gz");
  std::string a = random_text(100000, 8), b = "", c = random_text(300000, 9);
  write_bytes(path, gzip(a) + gzip(b) + gzip(c));
  CHECK(read_path(path, Compression::kGzip) == a + b + c);
  CHECK(read_path(path, Compression::kGzip, 1 << 20) == a + b + c);
}

TEST_CASE("a zero-byte gzip file and a gzip of nothing both read as empty") {
  TempDir dir;
  write_bytes(dir.file("zero.gz"), "");
  CHECK(read_path(dir.file("zero.gz"), Compression::kGzip).empty());
  write_bytes(dir.file("nothing.gz"), gzip(""));
  CHECK(read_path(dir.file("nothing.gz"), Compression::kGzip).empty());
  write_path(dir.file("written.gz"), Compression::kGzip, "", 1);
  CHECK(read_path(dir.file("written.gz"), Compression::kGzip).empty());
}

Status read_gzip_error(const std::string& path) {
  auto stream = open_input(path, Compression::kGzip);
  REQUIRE(stream.ok());
  std::string buf(1 << 16, '\0');
  while (true) {
    auto got = (*stream)->read(buf.data(), buf.size());
    if (!got.ok()) {
      // Sticky.
      CHECK((*stream)->read(buf.data(), buf.size()).status() == got.status());
      return got.status();
    }
    if (*got == 0) return Status::Ok();
  }
}

TEST_CASE("corrupt gzip data is DataLoss naming the path and compressed offset") {
  TempDir dir;
  std::string path = dir.file("bad.gz");
  std::string compressed = gzip(random_text(200000, 10));
  SECTION("damaged header") {
    compressed[0] = 'X';
    write_bytes(path, compressed);
    Status status = read_gzip_error(path);
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(message_contains(status, "corrupt gzip data in '" + path + "' at compressed offset "));
  }
  SECTION("damaged deflate data or CRC trailer") {
    for (size_t at : {compressed.size() / 2, compressed.size() - 6}) {
      std::string damaged = compressed;
      damaged[at] = static_cast<char>(damaged[at] ^ 0x55);
      write_bytes(path, damaged);
      Status status = read_gzip_error(path);
      CHECK(status.code() == StatusCode::kDataLoss);
      CHECK(message_contains(status, "corrupt gzip data in '" + path + "'"));
    }
  }
  SECTION("a plain file read as gzip") {
    write_bytes(path, "just some text, not gzip\n");
    Status status = read_gzip_error(path);
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(message_contains(status, "at compressed offset"));
  }
  SECTION("garbage after the last member") {
    write_bytes(path, compressed + "trailing junk");
    Status status = read_gzip_error(path);
    INFO(status.to_string());
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(message_contains(status, "data that is not gzip follows the gzip stream in '" + path +
                               "' at compressed offset " + std::to_string(compressed.size())));
  }
}

TEST_CASE("a gzip file cut short is DataLoss, at every cut point of a member") {
  TempDir dir;
  std::string path = dir.file("cut.gz");
  std::string compressed = gzip(random_text(2000, 11));
  for (size_t cut = 1; cut < compressed.size(); ++cut) {
    write_bytes(path, compressed.substr(0, cut));
    Status status = read_gzip_error(path);
    INFO("cut at " << cut);
    REQUIRE(status.code() == StatusCode::kDataLoss);
    CHECK(message_contains(status, "truncated gzip data in '" + path + "'"));
  }
}

TEST_CASE("creating a file in a missing directory is NotFound") {
  TempDir dir;
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    const std::string path = dir.file("no/such/dir/f");
    require_error(open_output(path, compression), StatusCode::kNotFound, "cannot create '" + path + "'");
  }
}

TEST_CASE("creating an unwritable file is PermissionDenied") {
  TempDir dir;
  std::string path = permission_denied_path(dir, /*for_write=*/true);
  require_error(open_output(path, Compression::kNone), StatusCode::kPermissionDenied);
}

TEST_CASE("creating a file over a directory is FailedPrecondition") {
  TempDir dir;
  require_error(open_output(dir.path(), Compression::kNone), StatusCode::kFailedPrecondition);
}

TEST_CASE("open_output truncates an existing file") {
  TempDir dir;
  std::string path = dir.file("f");
  write_bytes(path, "a long previous content");
  write_path(path, Compression::kNone, "new", 3);
  CHECK(read_bytes(path) == "new");
}

TEST_CASE("a full disk is ResourceExhausted, reported by write or close, and sticky") {
  // /dev/full accepts open and fails every write with ENOSPC.
  SECTION("buffered writes fail at close") {
    auto stream = open_output("/dev/full", Compression::kNone);
    REQUIRE(stream.ok());
    REQUIRE((*stream)->write("abc", 3).ok());
    Status closed = (*stream)->close();
    CHECK(closed.code() == StatusCode::kResourceExhausted);
    CHECK(message_contains(closed, "error writing '/dev/full'"));
    CHECK((*stream)->close() == closed);
  }
  SECTION("a large write fails at once, and later writes repeat the error") {
    auto stream = open_output("/dev/full", Compression::kNone);
    REQUIRE(stream.ok());
    std::string big(1 << 20, 'x');
    Status first = (*stream)->write(big.data(), big.size());
    CHECK(first.code() == StatusCode::kResourceExhausted);
    CHECK((*stream)->write("a", 1) == first);
    CHECK((*stream)->close() == first);
  }
  SECTION("gzip") {
    auto stream = open_output("/dev/full", Compression::kGzip);
    REQUIRE(stream.ok());
    std::string data = random_bytes(1 << 20, 12);  // incompressible: fills blocks
    Status status = (*stream)->write(data.data(), data.size());
    if (status.ok()) status = (*stream)->close();
    CHECK(status.code() == StatusCode::kResourceExhausted);
    CHECK((*stream)->write("a", 1).code() == StatusCode::kResourceExhausted);
  }
}

TEST_CASE("write after close is FailedPrecondition and a second close is a no-op") {
  TempDir dir;
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    auto stream = open_output(dir.file("f"), compression);
    REQUIRE(stream.ok());
    REQUIRE((*stream)->write("abc", 3).ok());
    REQUIRE((*stream)->close().ok());
    CHECK((*stream)->close().ok());
    Status late = (*stream)->write("d", 1);
    CHECK(late.code() == StatusCode::kFailedPrecondition);
    CHECK(read_path(dir.file("f"), compression) == "abc");
  }
}

TEST_CASE("an output stream destroyed without close still flushes its data") {
  TempDir dir;
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    {
      auto stream = open_output(dir.file("f"), compression);
      REQUIRE(stream.ok());
      REQUIRE((*stream)->write("kept", 4).ok());
    }
    CHECK(read_path(dir.file("f"), compression) == "kept");
  }
}

TEST_CASE("match_files returns the matching paths sorted") {
  TempDir dir;
  for (const char* name :
       {"b-2.tfrecord", "a-10.tfrecord", "a-1.tfrecord", "c.txt", "A.tfrecord"}) {
    write_bytes(dir.file(name), "");
  }
  auto matched = match_files(dir.file("*.tfrecord"));
  REQUIRE(matched.ok());
  CHECK(*matched == std::vector<std::string>{dir.file("A.tfrecord"), dir.file("a-1.tfrecord"),
                                             dir.file("a-10.tfrecord"),
                                             dir.file("b-2.tfrecord")});
  auto bracket = match_files(dir.file("[ab]-?.tfrecord"));
  REQUIRE(bracket.ok());
  CHECK(*bracket == std::vector<std::string>{dir.file("a-1.tfrecord"), dir.file("b-2.tfrecord")});
  auto literal = match_files(dir.file("c.txt"));
  REQUIRE(literal.ok());
  CHECK(*literal == std::vector<std::string>{dir.file("c.txt")});
}

TEST_CASE("match_files returns nothing, not an error, when nothing matches") {
  TempDir dir;
  auto none = match_files(dir.file("*.nothing"));
  REQUIRE(none.ok());
  CHECK(none->empty());
  auto missing_dir = match_files(dir.file("no/such/dir/*"));
  REQUIRE(missing_dir.ok());
  CHECK(missing_dir->empty());
  auto missing_file = match_files(dir.file("absent"));
  REQUIRE(missing_file.ok());
  CHECK(missing_file->empty());
}

TEST_CASE("match_files rejects a malformed pattern as InvalidArgument") {
  for (const std::string& pattern : {std::string(""), std::string("data/[ab.txt"),
                                    std::string("data/x\\"), std::string("a\0b", 3)}) {
    auto matched = match_files(pattern);
    INFO("pattern '" << pattern << "'");
    REQUIRE_FALSE(matched.ok());
    CHECK(matched.status().code() == StatusCode::kInvalidArgument);
  }
  // Escapes and a leading ']' in a bracket are fine.
  CHECK(match_files("/nonexistent/\\[x]").ok());
  CHECK(match_files("/nonexistent/[]a]").ok());
  CHECK(match_files("/nonexistent/[!]a]*").ok());
}

TEST_CASE("match_files reports a directory it cannot list instead of skipping it") {
  TempDir dir;
  fs::create_symlink("loop", dir.file("loop"));  // a symlink to itself: ELOOP
  auto matched = match_files(dir.file("loop/*"));
  REQUIRE_FALSE(matched.ok());
  CHECK(matched.status().code() == StatusCode::kFailedPrecondition);
  CHECK(message_contains(matched.status(), "cannot list directory '" + dir.file("loop") + "'"));
  CHECK(message_contains(matched.status(), "while matching '" + dir.file("loop/*") + "'"));
}

}  // namespace
}  // namespace capstan::data::io
