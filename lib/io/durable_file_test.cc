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

#include "data/test_util.h"

namespace capstan::io {
namespace {

namespace fs = std::filesystem;

using data::testing::TempDir;

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
  CHECK(parent_dir("/c") == "/");
  CHECK(parent_dir("c") == ".");
}

}  // namespace
}  // namespace capstan::io
