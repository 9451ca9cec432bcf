#include "io/file_system.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "io/memory_file_system.h"

namespace capstan::io {
namespace {

namespace fs = std::filesystem;

// The file system under test and a fresh directory in it. The local one
// works in a temporary directory, removed afterwards.
struct Subject {
  std::unique_ptr<MemoryFileSystem> memory;
  std::string root;
  FileSystem* fs = nullptr;

  explicit Subject(bool local) {
    if (local) {
      std::string pattern = (fs::temp_directory_path() / "file_system_test.XXXXXX").string();
      REQUIRE(::mkdtemp(pattern.data()) != nullptr);
      root = pattern;
      fs = &local_file_system();
    } else {
      memory = std::make_unique<MemoryFileSystem>();
      root = "/tmp";
      REQUIRE(memory->create_dir(root).ok());
      fs = memory.get();
    }
  }
  ~Subject() {
    if (memory == nullptr) {
      std::error_code ignored;
      fs::remove_all(root, ignored);
    }
  }
  std::string path(const std::string& name) const { return root + "/" + name; }
};

std::string read_all(FileSystem& fs, const std::string& path) {
  auto file = fs.open_readable(path);
  REQUIRE(file.ok());
  std::string bytes((*file)->size(), '\0');
  REQUIRE((*file)->read(0, bytes.size(), bytes.data()).ok());
  return bytes;
}

void write(FileSystem& fs, const std::string& path, WriteMode mode, std::string_view bytes) {
  auto file = fs.open_writable(path, mode);
  REQUIRE(file.ok());
  REQUIRE((*file)->append(bytes).ok());
  REQUIRE((*file)->close().ok());
}

// Both implementations keep the same contract; each case runs on both.
TEST_CASE("file systems: write modes create, truncate and append") {
  for (bool local : {true, false}) {
    INFO((local ? "local" : "memory"));
    Subject s(local);
    FileSystem& fs = *s.fs;
    write(fs, s.path("f"), WriteMode::kCreateNew, "abc");
    CHECK(fs.open_writable(s.path("f"), WriteMode::kCreateNew).status().code() == StatusCode::kAlreadyExists);
    write(fs, s.path("f"), WriteMode::kAppend, "def");
    CHECK(read_all(fs, s.path("f")) == "abcdef");
    write(fs, s.path("f"), WriteMode::kTruncate, "x");
    CHECK(read_all(fs, s.path("f")) == "x");
    CHECK(fs.open_writable(s.path("missing"), WriteMode::kAppend).status().code() == StatusCode::kNotFound);
    CHECK(fs.open_writable(s.path("no/such/dir"), WriteMode::kTruncate).status().code() == StatusCode::kNotFound);
    CHECK(fs.stat(s.path("f"))->size == 1);
  }
}

TEST_CASE("file systems: reading past the end is an error naming the offset") {
  for (bool local : {true, false}) {
    INFO((local ? "local" : "memory"));
    Subject s(local);
    write(*s.fs, s.path("f"), WriteMode::kCreateNew, "0123456789");
    auto file = s.fs->open_readable(s.path("f"));
    REQUIRE(file.ok());
    char buf[4];
    REQUIRE((*file)->read(6, 4, buf).ok());
    CHECK(std::string(buf, 4) == "6789");
    Status past = (*file)->read(8, 4, buf);
    CHECK(past.code() == StatusCode::kInternal);
    CHECK(past.message().find("offset") != std::string::npos);
    CHECK(s.fs->open_readable(s.root).status().code() == StatusCode::kFailedPrecondition);
    CHECK(s.fs->open_readable(s.path("missing")).status().code() == StatusCode::kNotFound);
  }
}

TEST_CASE("file systems: directories are created, listed, renamed and removed") {
  for (bool local : {true, false}) {
    INFO((local ? "local" : "memory"));
    Subject s(local);
    FileSystem& fs = *s.fs;
    REQUIRE(fs.create_dir(s.path("d")).ok());
    CHECK(fs.create_dir(s.path("d")).code() == StatusCode::kAlreadyExists);
    CHECK(fs.create_dir(s.path("x/y")).code() == StatusCode::kNotFound);
    write(fs, s.path("d/a"), WriteMode::kCreateNew, "1");
    write(fs, s.path("d/b"), WriteMode::kCreateNew, "2");
    auto names = fs.list_dir(s.path("d"));
    REQUIRE(names.ok());
    std::sort(names->begin(), names->end());
    CHECK(*names == std::vector<std::string>{"a", "b"});
    CHECK(fs.stat(s.path("d"))->is_directory);

    CHECK(fs.rename_no_replace(s.path("d/a"), s.path("d/b")).code() == StatusCode::kAlreadyExists);
    REQUIRE(fs.rename(s.path("d/a"), s.path("d/b")).ok());
    CHECK(read_all(fs, s.path("d/b")) == "1");
    REQUIRE(fs.rename_no_replace(s.path("d"), s.path("e")).ok());
    CHECK(read_all(fs, s.path("e/b")) == "1");
    CHECK(fs.remove(s.path("e")).code() == StatusCode::kAlreadyExists);  // not empty
    REQUIRE(fs.remove(s.path("e/b")).ok());
    REQUIRE(fs.remove(s.path("e")).ok());
    CHECK(fs.stat(s.path("e")).status().code() == StatusCode::kNotFound);
    CHECK(fs.list_dir(s.path("e")).status().code() == StatusCode::kNotFound);
  }
}

TEST_CASE("file systems: remove_all removes a tree, a file, or nothing") {
  for (bool local : {true, false}) {
    INFO((local ? "local" : "memory"));
    Subject s(local);
    FileSystem& fs = *s.fs;
    REQUIRE(fs.create_dir(s.path("tree")).ok());
    REQUIRE(fs.create_dir(s.path("tree/sub")).ok());
    write(fs, s.path("tree/a"), WriteMode::kCreateNew, "a");
    write(fs, s.path("tree/sub/b"), WriteMode::kCreateNew, "b");
    write(fs, s.path("file"), WriteMode::kCreateNew, "f");
    CHECK(fs.stat(s.path("file"))->is_regular_file);
    CHECK_FALSE(fs.stat(s.path("tree"))->is_regular_file);

    CHECK(fs.remove_all(s.path("tree")).ok());
    CHECK(fs.stat(s.path("tree")).status().code() == StatusCode::kNotFound);
    CHECK(fs.remove_all(s.path("file")).ok());
    CHECK(fs.stat(s.path("file")).status().code() == StatusCode::kNotFound);
    CHECK(fs.remove_all(s.path("missing")).ok());
    CHECK(fs.list_dir(s.root).value().empty());
  }
}

TEST_CASE("file systems: truncate shortens a file") {
  for (bool local : {true, false}) {
    INFO((local ? "local" : "memory"));
    Subject s(local);
    write(*s.fs, s.path("f"), WriteMode::kCreateNew, "0123456789");
    REQUIRE(s.fs->truncate(s.path("f"), 4).ok());
    CHECK(read_all(*s.fs, s.path("f")) == "0123");
    CHECK(s.fs->truncate(s.path("missing"), 0).code() == StatusCode::kNotFound);
  }
}

TEST_CASE("file systems: a directory lock is exclusive until released") {
  for (bool local : {true, false}) {
    INFO((local ? "local" : "memory"));
    Subject s(local);
    auto first = s.fs->lock_dir(s.root);
    REQUIRE(first.ok());
    CHECK(s.fs->lock_dir(s.root).status().code() == StatusCode::kFailedPrecondition);
    first->reset();
    CHECK(s.fs->lock_dir(s.root).ok());
    CHECK(s.fs->lock_dir(s.path("missing")).status().code() == StatusCode::kNotFound);
  }
}

TEST_CASE("file systems: syncs of files and directories succeed and report what is missing") {
  for (bool local : {true, false}) {
    INFO((local ? "local" : "memory"));
    Subject s(local);
    write(*s.fs, s.path("f"), WriteMode::kCreateNew, "x");
    CHECK(s.fs->sync_file(s.path("f")).ok());
    CHECK(s.fs->sync_dir(s.root).ok());
    CHECK(s.fs->sync_file(s.path("missing")).code() == StatusCode::kNotFound);
    CHECK(s.fs->sync_dir(s.path("missing")).code() == StatusCode::kNotFound);
  }
}

// ---- The double's own behaviour: what tests rely on.

TEST_CASE("memory file system: a crash keeps synced bytes and names in synced directories only") {
  MemoryFileSystem mem;
  REQUIRE(mem.create_dir("/d").ok());
  REQUIRE(mem.sync_dir("/").ok());
  auto synced = mem.open_writable("/d/synced", WriteMode::kCreateNew);
  REQUIRE(synced.ok());
  REQUIRE((*synced)->append("kept").ok());
  REQUIRE((*synced)->sync().ok());
  REQUIRE((*synced)->append(" and lost").ok());
  REQUIRE(mem.sync_dir("/d").ok());
  write(mem, "/d/unnamed", WriteMode::kCreateNew, "its name was never synced");
  REQUIRE(mem.sync_file("/d/unnamed").ok());

  mem.crash();
  CHECK(*mem.contents("/d/synced") == "kept");
  CHECK(mem.stat("/d/unnamed").status().code() == StatusCode::kNotFound);
}

TEST_CASE("memory file system: a rename is durable once its directory is synced, with the directory's contents") {
  MemoryFileSystem mem;
  REQUIRE(mem.create_dir("/tmp").ok());
  write(mem, "/tmp/f", WriteMode::kCreateNew, "data");
  REQUIRE(mem.sync_file("/tmp/f").ok());
  REQUIRE(mem.sync_dir("/tmp").ok());
  REQUIRE(mem.sync_dir("/").ok());
  REQUIRE(mem.rename("/tmp", "/final").ok());

  mem.crash();  // the rename was not synced: the old name is back
  CHECK(*mem.contents("/tmp/f") == "data");
  CHECK(mem.stat("/final").status().code() == StatusCode::kNotFound);

  REQUIRE(mem.rename("/tmp", "/final").ok());
  REQUIRE(mem.sync_dir("/").ok());
  mem.crash();
  CHECK(*mem.contents("/final/f") == "data");
}

TEST_CASE("memory file system: fail_next_sync fails one sync, and nothing is synced by it") {
  MemoryFileSystem mem;
  auto file = mem.open_writable("/f", WriteMode::kCreateNew);
  REQUIRE(file.ok());
  REQUIRE((*file)->append("x").ok());
  mem.fail_next_sync(Status::DataLoss("Input/output error"));
  Status failed = (*file)->sync();
  CHECK(failed.code() == StatusCode::kDataLoss);
  CHECK(failed.message().find("'/f'") != std::string::npos);
  CHECK(mem.file_syncs() == 0);
  CHECK((*file)->sync().ok());
  CHECK(mem.file_syncs() == 1);
  mem.fail_next_sync(Status::DataLoss("Input/output error"));
  CHECK(mem.sync_dir("/").code() == StatusCode::kDataLoss);
  CHECK(mem.sync_dir("/").ok());
}

TEST_CASE("memory file system: fail_writes_after writes up to the limit, then fails until allowed") {
  MemoryFileSystem mem;
  auto file = mem.open_writable("/f", WriteMode::kCreateNew);
  REQUIRE(file.ok());
  mem.fail_writes_after(5, Status::ResourceExhausted("No space left on device"));
  REQUIRE((*file)->append("abc").ok());
  Status full = (*file)->append("defgh");
  CHECK(full.code() == StatusCode::kResourceExhausted);
  CHECK(*mem.contents("/f") == "abcde");
  CHECK((*file)->append("z").code() == StatusCode::kResourceExhausted);
  mem.allow_writes();
  REQUIRE((*file)->append("z").ok());
  CHECK(*mem.contents("/f") == "abcdez");
}

TEST_CASE("memory file system: remove_all is durable once the parent directory is synced") {
  MemoryFileSystem mem;
  REQUIRE(mem.create_dir("/d").ok());
  REQUIRE(mem.create_dir("/d/sub").ok());
  write(mem, "/d/sub/f", WriteMode::kCreateNew, "bytes");
  REQUIRE(mem.sync_file("/d/sub/f").ok());
  REQUIRE(mem.sync_dir("/d/sub").ok());
  REQUIRE(mem.sync_dir("/d").ok());
  REQUIRE(mem.sync_dir("/").ok());

  REQUIRE(mem.remove_all("/d/sub").ok());
  mem.crash();  // the removal was not synced: the tree is back
  CHECK(mem.contents("/d/sub/f").value() == "bytes");
  REQUIRE(mem.remove_all("/d/sub").ok());
  REQUIRE(mem.sync_dir("/d").ok());
  mem.crash();
  CHECK(mem.stat("/d/sub").status().code() == StatusCode::kNotFound);
  CHECK(mem.remove_all("/").code() == StatusCode::kInvalidArgument);
}

TEST_CASE("memory file system: a crash releases the crashed process's locks") {
  MemoryFileSystem mem;
  auto before = mem.lock_dir("/");
  REQUIRE(before.ok());
  mem.crash();
  auto after = mem.lock_dir("/");
  REQUIRE(after.ok());
  before->reset();  // the old holder's release leaves the new lock alone
  CHECK(mem.lock_dir("/").status().code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("memory file system: the sync hook runs before each file sync") {
  MemoryFileSystem mem;
  int calls = 0;
  mem.on_sync([&calls]() { ++calls; });
  write(mem, "/f", WriteMode::kCreateNew, "x");
  REQUIRE(mem.sync_file("/f").ok());
  REQUIRE(mem.sync_file("/f").ok());
  CHECK(calls == 2);
}

// The open flags of this process's descriptor for `path` (from /proc), or -1.
long open_flags_of(const std::string& path) {
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    if (fs::read_symlink(entry.path(), error).string() != path) continue;
    std::ifstream info("/proc/self/fdinfo/" + entry.path().filename().string());
    std::string key, value;
    while (info >> key >> value) {
      if (key == "flags:") return std::stol(value, nullptr, 8);
    }
  }
  return -1;
}

TEST_CASE("file systems: a bulk file holds exactly the bytes appended, in pieces of any size, across syncs") {
  std::string bytes(19 * 1024 * 1024 + 12345, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  // On the disk (O_DIRECT), in tmpfs (which may refuse it) and in memory.
  const std::string shm = fs::is_directory("/dev/shm") ? "/dev/shm" : fs::temp_directory_path().string();
  for (const std::string& where : {std::string("local"), shm, std::string("memory")}) {
    INFO(where);
    Subject s(where != "memory");
    std::string root = s.root;
    if (where == shm) {
      root = shm + "/file_system_test." + std::to_string(::getpid());
      fs::create_directories(root);
    }
    FileSystem& fs = *s.fs;
    const std::string path = root + "/bulk";
    write(fs, path, WriteMode::kTruncate, "an older, longer file's bytes that must go");
    auto file = fs.open_bulk_writable(path);
    REQUIRE(file.ok());
    size_t at = 0;
    int pass = 0;
    for (size_t piece : {size_t{1}, size_t{4095}, size_t{5} << 20, size_t{3}, size_t{9} << 20}) {
      REQUIRE((*file)->append(std::string_view(bytes).substr(at, piece)).ok());
      at += piece;
      if (++pass == 3) {
        // A sync in the middle leaves a partial block that later appends complete.
        REQUIRE((*file)->sync().ok());
        CHECK(read_all(fs, path) == bytes.substr(0, at));
      }
    }
    REQUIRE((*file)->append(std::string_view(bytes).substr(at)).ok());
    REQUIRE((*file)->sync().ok());
    REQUIRE((*file)->close().ok());
    CHECK(fs.stat(path)->size == bytes.size());
    CHECK(read_all(fs, path) == bytes);
    if (where == shm) fs::remove_all(root);
  }
}

TEST_CASE("file systems: on a disk a bulk file bypasses the page cache") {
  Subject s(true);
  struct statfs info;
  REQUIRE(::statfs(s.root.c_str(), &info) == 0);
  auto file = s.fs->open_bulk_writable(s.path("bulk"));
  REQUIRE(file.ok());
  const long flags = open_flags_of(s.path("bulk"));
  REQUIRE(flags >= 0);
  // tmpfs may lack O_DIRECT; then the file is an ordinary cached one.
  if (info.f_type != TMPFS_MAGIC) CHECK((flags & O_DIRECT) != 0);
  REQUIRE((*file)->close().ok());
}

}  // namespace
}  // namespace capstan::io
