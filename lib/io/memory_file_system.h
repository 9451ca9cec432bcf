// An in-memory FileSystem for tests: no disk, a count of every fsync, the
// failures a test asks for, and crash(), which keeps only what was made
// durable (LevelDB's FaultInjectionTestEnv, in a smaller form).
//
// The durability model is POSIX's: a file's bytes survive a crash up to its
// last sync(); a name (created, renamed, removed) survives once its
// directory was synced. "/" always exists.
//
//   io::MemoryFileSystem fs;
//   fs.fail_next_sync(Status::DataLoss("disk gone"));   // the next fsync fails
//   fs.fail_writes_after(100, Status::ResourceExhausted("disk full"));
//   ... code under test, handed `fs` ...
//   fs.crash();   // what a reader would find after a power cut
//   CHECK(fs.file_syncs() == 3);
//
// Thread-safe; the fault-injection calls may be made while others use it.
#ifndef CAPSTAN_LIB_IO_MEMORY_FILE_SYSTEM_H_
#define CAPSTAN_LIB_IO_MEMORY_FILE_SYSTEM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/file_system.h"
#include "sync/mutex.h"

namespace capstan::io {

class MemoryFileSystem final : public FileSystem {
 public:
  MemoryFileSystem();
  ~MemoryFileSystem() override;

  Result<std::unique_ptr<WritableFile>> open_writable(const std::string& path, WriteMode mode) override;
  Result<std::unique_ptr<RandomAccessFile>> open_readable(const std::string& path) override;
  Status sync_file(const std::string& path) override;
  Status sync_dir(const std::string& dir) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status rename_no_replace(const std::string& from, const std::string& to) override;
  Status remove(const std::string& path) override;
  Status remove_all(const std::string& path) override;
  Status truncate(const std::string& path, uint64_t size) override;
  Status create_dir(const std::string& dir) override;
  Result<std::vector<std::string>> list_dir(const std::string& dir) override;
  Result<FileInfo> stat(const std::string& path) override;
  Result<std::unique_ptr<DirectoryLock>> lock_dir(const std::string& dir) override;

  // ---- Faults. Each applies once, to the next call of its kind.
  // The next file or directory sync fails with `failure` (syncing nothing).
  void fail_next_sync(Status failure);
  // Appends succeed for `bytes` more bytes in all; the append that crosses
  // the limit writes the bytes up to it and fails with `failure`, as does
  // every append after (until allow_writes()).
  void fail_writes_after(uint64_t bytes, Status failure);
  void allow_writes();
  // Runs at the start of every file sync, outside the file system's lock: a
  // test can hold syncs "in flight" (block here) to see what piles up.
  void on_sync(std::function<void()> hook);

  // ---- Crash. Drops every byte not synced and every name whose directory
  // was not synced since it changed, and every directory lock (they belonged
  // to the crashed process). Open files stay usable but write into the files
  // as they were: tests reopen what they test, as a restarted process would.
  void crash();

  // ---- What happened.
  int64_t file_syncs() const;  // successful WritableFile::sync and sync_file calls
  int64_t dir_syncs() const;
  // The file's current bytes (kNotFound / kFailedPrecondition for a directory).
  Result<std::string> contents(const std::string& path) const;
  // Replaces a file's bytes, synced (a test corrupting what is "on disk").
  void set_contents(const std::string& path, std::string bytes);

 private:
  struct Node;
  class File;
  class Reader;
  class Lock;

  // Normalized: absolute, no trailing or doubled slashes, no "." parts.
  static std::string normalize(const std::string& path);
  // The node at normalized `path`, or null.
  std::shared_ptr<Node> find(const std::string& path) const EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The directory that holds normalized `path`, or kNotFound.
  Result<std::shared_ptr<Node>> parent_of(const std::string& path) const EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  Status append_to(Node& node, const std::string& path, std::string_view data) LOCKS_EXCLUDED(mutex_);
  Status sync_node(const std::shared_ptr<Node>& node, const std::string& path) LOCKS_EXCLUDED(mutex_);
  void release_lock(const std::string& dir, uint64_t id) LOCKS_EXCLUDED(mutex_);

  mutable Mutex mutex_;
  // The tree: each directory node holds its entries as they are now and as
  // of its last sync (Node's fields are guarded by mutex_ too).
  const std::shared_ptr<Node> root_;
  std::map<std::string, uint64_t> locked_ GUARDED_BY(mutex_);  // directory -> the holding lock's id
  uint64_t next_lock_id_ GUARDED_BY(mutex_) = 1;
  Status next_sync_failure_ GUARDED_BY(mutex_);
  bool limit_writes_ GUARDED_BY(mutex_) = false;
  uint64_t writable_bytes_ GUARDED_BY(mutex_) = 0;
  Status write_failure_ GUARDED_BY(mutex_);
  std::function<void()> sync_hook_ GUARDED_BY(mutex_);
  int64_t file_syncs_ GUARDED_BY(mutex_) = 0;
  int64_t dir_syncs_ GUARDED_BY(mutex_) = 0;
};

}  // namespace capstan::io

#endif  // CAPSTAN_LIB_IO_MEMORY_FILE_SYSTEM_H_
