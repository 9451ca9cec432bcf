#include "io/durable_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "io/memory_file_system.h"
#include "io/testing.h"

namespace capstan::io {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_CASE("errno_to_status picks the code by what the caller should do") {
  CHECK(errno_to_status(ENOENT, "x").code() == StatusCode::kNotFound);
  CHECK(errno_to_status(ENOTDIR, "x").code() == StatusCode::kNotFound);
  CHECK(errno_to_status(EACCES, "x").code() == StatusCode::kPermissionDenied);
  CHECK(errno_to_status(EPERM, "x").code() == StatusCode::kPermissionDenied);
  CHECK(errno_to_status(EROFS, "x").code() == StatusCode::kPermissionDenied);
  for (int e : {ENOSPC, EDQUOT, EFBIG, EMFILE, ENFILE, ENOMEM}) {
    CHECK(errno_to_status(e, "x").code() == StatusCode::kResourceExhausted);
  }
  CHECK(errno_to_status(EEXIST, "x").code() == StatusCode::kAlreadyExists);
  CHECK(errno_to_status(ENOTEMPTY, "x").code() == StatusCode::kAlreadyExists);
  CHECK(errno_to_status(EIO, "x").code() == StatusCode::kDataLoss);
  CHECK(errno_to_status(EISDIR, "x").code() == StatusCode::kFailedPrecondition);
  CHECK(errno_to_status(EINVAL, "x").code() == StatusCode::kInvalidArgument);
  CHECK(errno_to_status(EAGAIN, "x").code() == StatusCode::kUnavailable);
  CHECK(errno_to_status(EXDEV, "x").code() == StatusCode::kUnknown);
}

TEST_CASE("errno_to_status names the context and strerror") {
  Status status = errno_to_status(ENOENT, "cannot open '/a/b'");
  CHECK(status.message() == std::string("cannot open '/a/b': ") + std::strerror(ENOENT));
}

TEST_CASE("write_file_durably writes the bytes and leaves no temporary file") {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  REQUIRE(write_file_durably(path, std::string_view("hello\0world", 11)).ok());
  CHECK(slurp(path) == std::string("hello\0world", 11));
  CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("write_file_durably replaces an existing file whole") {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  REQUIRE(write_file_durably(path, "a much longer first version").ok());
  REQUIRE(write_file_durably(path, {std::string_view("se"), std::string_view("cond")}).ok());
  CHECK(slurp(path) == "second");
}

TEST_CASE("write_file_durably into a missing directory is NotFound and names the path") {
  TempDir dir;
  const std::string path = dir.path() + "/missing/f";
  Status status = write_file_durably(path, "x");
  CHECK(status.code() == StatusCode::kNotFound);
  CHECK(status.message().find(path + ".tmp") != std::string::npos);
}

TEST_CASE("write_file_durably over a directory fails, removes its temporary file, keeps the directory") {
  TempDir dir;
  const std::string path = dir.path() + "/d";
  fs::create_directory(path);
  fs::create_directory(path + "/child");
  Status status = write_file_durably(path, "x");
  CHECK_FALSE(status.ok());
  CHECK(fs::is_directory(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("commit_file_durably gives a complete file its name") {
  TempDir dir;
  const std::string tmp = dir.path() + "/f.part";
  { std::ofstream(tmp) << "content"; }
  REQUIRE(commit_file_durably(tmp, dir.path() + "/f").ok());
  CHECK(slurp(dir.path() + "/f") == "content");
  CHECK_FALSE(fs::exists(tmp));
  CHECK(commit_file_durably(tmp, dir.path() + "/g").code() == StatusCode::kNotFound);
}

TEST_CASE("fsync_dir syncs a directory and reports a missing one") {
  TempDir dir;
  CHECK(fsync_dir(dir.path()).ok());
  CHECK(fsync_dir(dir.path() + "/nope").code() == StatusCode::kNotFound);
}

TEST_CASE("parent_dir") {
  CHECK(parent_dir("/a/b/c") == "/a/b");
  CHECK(parent_dir("/a/b/") == "/a");
  CHECK(parent_dir("/c") == "/");
  CHECK(parent_dir("c") == ".");
}

TEST_CASE("a durable write survives a crash whole, a failed one leaves the old file") {
  MemoryFileSystem mem;
  REQUIRE(mem.create_dir("/d").ok());
  REQUIRE(mem.sync_dir("/").ok());
  REQUIRE(write_file_durably(mem, "/d/f", "first").ok());
  mem.crash();
  CHECK(*mem.contents("/d/f") == "first");

  mem.fail_next_sync(Status::DataLoss("Input/output error"));
  Status failed = write_file_durably(mem, "/d/f", "second");
  CHECK(failed.code() == StatusCode::kDataLoss);
  CHECK(failed.message().find("/d/f.tmp") != std::string::npos);
  CHECK(*mem.contents("/d/f") == "first");
  CHECK(mem.stat("/d/f.tmp").status().code() == StatusCode::kNotFound);
}

TEST_CASE("a durable write syncs the file and then its directory") {
  MemoryFileSystem mem;
  const int64_t files = mem.file_syncs();
  const int64_t dirs = mem.dir_syncs();
  REQUIRE(write_file_durably(mem, "/f", {std::string_view("a"), std::string_view("b")}).ok());
  CHECK(mem.file_syncs() == files + 1);
  CHECK(mem.dir_syncs() == dirs + 1);
  CHECK(*mem.contents("/f") == "ab");
}

TEST_CASE("commit_file_durably through a file system: the name survives a crash") {
  MemoryFileSystem mem;
  {
    auto file = mem.open_writable("/part", WriteMode::kCreateNew);
    REQUIRE(file.ok());
    REQUIRE((*file)->append("content").ok());
  }
  REQUIRE(commit_file_durably(mem, "/part", "/whole").ok());
  mem.crash();
  CHECK(*mem.contents("/whole") == "content");
  CHECK(mem.stat("/part").status().code() == StatusCode::kNotFound);
}

TEST_CASE("create_dirs makes the missing parents and refuses a file on the way") {
  TempDir dir;
  REQUIRE(create_dirs(local_file_system(), dir.path() + "/a/b/c", /*sync=*/true).ok());
  CHECK(fs::is_directory(dir.path() + "/a/b/c"));
  REQUIRE(create_dirs(local_file_system(), dir.path() + "/a/b/c", /*sync=*/true).ok());
  { std::ofstream(dir.path() + "/file") << "x"; }
  CHECK(create_dirs(local_file_system(), dir.path() + "/file", true).code() == StatusCode::kFailedPrecondition);
  CHECK_FALSE(create_dirs(local_file_system(), dir.path() + "/file/sub", true).ok());
}

}  // namespace
}  // namespace capstan::io
