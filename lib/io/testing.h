// Helpers for tests of code that writes files; only tests include this
// header. Each fails the running test case through Catch2 when its own setup
// fails.
#ifndef CAPSTAN_LIB_IO_TESTING_H_
#define CAPSTAN_LIB_IO_TESTING_H_

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <system_error>

#include "sync/mutex.h"

namespace capstan::io::testing {

// A fresh directory under the system temp dir, <prefix>.XXXXXX, removed with
// its contents, including any whose permissions a test took away.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "capstan_test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + ".XXXXXX")).string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    namespace fs = std::filesystem;
    std::error_code ignored;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Holds file syncs "in flight" until opened, and tells when the first one
// arrived: hand pass() to MemoryFileSystem::on_sync.
class SyncGate {
 public:
  void pass() LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(mutex_);
    ++arrived_;
    changed_.notify_all();
    while (!open_) changed_.wait(mutex_);
  }
  void wait_for_arrival() LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(mutex_);
    while (arrived_ == 0) changed_.wait(mutex_);
  }
  void open() LOCKS_EXCLUDED(mutex_) {
    MutexLock lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  Mutex mutex_;
  CondVar changed_;
  int arrived_ GUARDED_BY(mutex_) = 0;
  bool open_ GUARDED_BY(mutex_) = false;
};

}  // namespace capstan::io::testing

#endif  // CAPSTAN_LIB_IO_TESTING_H_
