// The file system as the durable parts of Capstan see it (the journal,
// checkpoints, the dispatcher's dataset definitions): an interface they write
// through, so that tests can swap the disk for MemoryFileSystem
// (io/memory_file_system.h), which counts fsyncs, fails the calls a test asks
// it to fail, and forgets what was not fsynced when told to "crash". The idea
// of LevelDB's Env and KJ's Filesystem; production code has no test hooks.
//
//   io::FileSystem& fs = io::local_file_system();
//   CAPSTAN_ASSIGN_OR_RETURN(auto file, fs.open_writable(path, io::WriteMode::kCreateNew));
//   CAPSTAN_RETURN_IF_ERROR(file->append(bytes));
//   CAPSTAN_RETURN_IF_ERROR(file->sync());           // the bytes survive a crash
//   CAPSTAN_RETURN_IF_ERROR(fs.sync_dir(parent_dir(path)));  // and so does the name
//
// Errors are Statuses chosen by what the caller can do (errno_to_status in
// io/durable_file.h); each message names the path.
//
// Thread-safety: a FileSystem may be used from any thread. A file object is
// used by one thread at a time.
#ifndef CAPSTAN_LIB_IO_FILE_SYSTEM_H_
#define CAPSTAN_LIB_IO_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"

namespace capstan::io {

// A file being written front to back.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all of `data` after what the file holds. A failure may leave any
  // prefix of `data` written.
  [[nodiscard]] virtual Status append(std::string_view data) = 0;
  // fsync: once OK, every byte appended so far survives a machine crash.
  [[nodiscard]] virtual Status sync() = 0;
  // Later calls fail. The destructor closes a file still open, ignoring errors.
  [[nodiscard]] virtual Status close() = 0;
};

// A regular file read at any offset.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly `n` bytes at `offset` into out[0, n). Bytes that are not
  // there (the file shrank since open) are kInternal naming the offset.
  [[nodiscard]] virtual Status read(uint64_t offset, size_t n, char* out) const = 0;
  // The size when opened.
  virtual uint64_t size() const = 0;
};

// An exclusive advisory lock on a directory, held until destroyed.
class DirectoryLock {
 public:
  virtual ~DirectoryLock() = default;
};

enum class WriteMode {
  kTruncate,   // create, or empty an existing file
  kCreateNew,  // create; kAlreadyExists when the name is taken
  kAppend,     // an existing file, written after its end; kNotFound when missing
};

struct FileInfo {
  bool is_directory = false;
  bool is_regular_file = false;  // neither a directory nor a device, FIFO or socket
  uint64_t size = 0;  // regular files
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  [[nodiscard]] virtual Result<std::unique_ptr<WritableFile>> open_writable(const std::string& path,
                                                                            WriteMode mode) = 0;
  // open_writable(path, kTruncate) for a large file written once, front to
  // back (a checkpoint's shards): where the file system allows, the bytes
  // bypass the page cache (O_DIRECT through an aligned staging buffer). A
  // cached write of 1 GiB and its writeback cost the machine about a second
  // of CPU time that training would have had; uncached, a tenth of that.
  [[nodiscard]] virtual Result<std::unique_ptr<WritableFile>> open_bulk_writable(const std::string& path) {
    return open_writable(path, WriteMode::kTruncate);
  }
  // kFailedPrecondition when `path` is not a regular file.
  [[nodiscard]] virtual Result<std::unique_ptr<RandomAccessFile>> open_readable(const std::string& path) = 0;
  // fsyncs the existing file `path` (written by another process, or through
  // a stream that cannot sync).
  [[nodiscard]] virtual Status sync_file(const std::string& path) = 0;
  // fsyncs the directory `dir`: the creation, removal and renaming of its
  // entries survive a crash.
  [[nodiscard]] virtual Status sync_dir(const std::string& dir) = 0;
  // Replaces `to` if it exists (an empty directory over an empty directory).
  [[nodiscard]] virtual Status rename(const std::string& from, const std::string& to) = 0;
  // kAlreadyExists when `to` exists; never replaces it.
  [[nodiscard]] virtual Status rename_no_replace(const std::string& from, const std::string& to) = 0;
  // A file or an empty directory.
  [[nodiscard]] virtual Status remove(const std::string& path) = 0;
  // rm -r: `path` and, for a directory, everything under it (a symbolic link
  // is removed, not followed). OK when nothing is there.
  [[nodiscard]] virtual Status remove_all(const std::string& path) = 0;
  [[nodiscard]] virtual Status truncate(const std::string& path, uint64_t size) = 0;
  // One directory; its parent must exist. kAlreadyExists when the name is taken.
  [[nodiscard]] virtual Status create_dir(const std::string& dir) = 0;
  // The names in `dir` (no "." or ".."), in no particular order.
  [[nodiscard]] virtual Result<std::vector<std::string>> list_dir(const std::string& dir) = 0;
  // kNotFound when nothing is there.
  [[nodiscard]] virtual Result<FileInfo> stat(const std::string& path) = 0;
  // kFailedPrecondition when another holder has it (in this process or another).
  [[nodiscard]] virtual Result<std::unique_ptr<DirectoryLock>> lock_dir(const std::string& dir) = 0;
};

// The machine's own file system (POSIX calls). It holds no state, so the one
// instance is shared by everything that is not handed another.
FileSystem& local_file_system();

// mkdir -p: creates `dir` and its missing parents; with `sync`, fsyncs the
// parent of each directory it creates. kFailedPrecondition when a name on
// the way is a file.
[[nodiscard]] Status create_dirs(FileSystem& fs, const std::string& dir, bool sync);

// The whole of the regular file `path`.
[[nodiscard]] Result<std::string> read_file(FileSystem& fs, const std::string& path);

// The directory holding `path` ("." for a bare file name; trailing slashes
// are ignored).
std::string parent_dir(const std::string& path);
// dir + "/" + name (one slash).
std::string join_path(const std::string& dir, std::string_view name);

}  // namespace capstan::io

#endif  // CAPSTAN_LIB_IO_FILE_SYSTEM_H_
