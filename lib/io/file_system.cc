#include "io/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "io/durable_file.h"

namespace capstan::io {
namespace {

std::string quoted(const std::string& path) { return "'" + path + "'"; }

// Closes `fd` once: later calls find -1 and do nothing.
Status close_fd(int& fd, const std::string& path) {
  if (fd < 0) return Status::Ok();
  const int closing = fd;
  fd = -1;
  if (::close(closing) != 0) return errno_to_status(errno, "cannot close " + quoted(path));
  return Status::Ok();
}

Status fsync_fd(int fd, const std::string& what) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    return errno_to_status(errno, "cannot fsync " + what);
  }
  return Status::Ok();
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status append(std::string_view data) override {
    if (fd_ < 0) return Status::FailedPrecondition(quoted(path_) + " is closed");
    while (!data.empty()) {
      ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno_to_status(errno, "cannot write " + quoted(path_));
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return Status::Ok();
  }

  Status sync() override {
    if (fd_ < 0) return Status::FailedPrecondition(quoted(path_) + " is closed");
    return fsync_fd(fd_, quoted(path_));
  }

  Status close() override { return close_fd(fd_, path_); }

 private:
  const std::string path_;
  int fd_;
};

// A file opened with O_DIRECT: appends gather in an aligned staging buffer
// and go to the disk in whole blocks, straight from it (no page cache, no
// writeback). The tail that is not a whole block stays in the buffer until
// sync(), which writes it as one zero-padded block and cuts the file to its
// length; a later append writes that block again, whole. Where the file
// system refuses an uncached write (EINVAL), the file drops O_DIRECT and
// goes on through the page cache.
class PosixDirectWritableFile final : public WritableFile {
 public:
  static constexpr size_t kBlock = 4096;       // alignment of addresses, offsets and sizes
  static constexpr size_t kStaging = 8 << 20;  // bytes per write

  PosixDirectWritableFile(std::string path, int fd)
      : path_(std::move(path)),
        fd_(fd),
        staging_(static_cast<char*>(::operator new(kStaging, std::align_val_t(kBlock)))) {}
  ~PosixDirectWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
    ::operator delete(staging_, std::align_val_t(kBlock));
  }

  Status append(std::string_view data) override {
    if (fd_ < 0) return Status::FailedPrecondition(quoted(path_) + " is closed");
    while (!data.empty()) {
      const size_t n = std::min(data.size(), kStaging - used_);
      std::memcpy(staging_ + used_, data.data(), n);
      used_ += n;
      data.remove_prefix(n);
      if (used_ == kStaging) CAPSTAN_RETURN_IF_ERROR(write_whole_blocks());
    }
    return Status::Ok();
  }

  Status sync() override {
    if (fd_ < 0) return Status::FailedPrecondition(quoted(path_) + " is closed");
    CAPSTAN_RETURN_IF_ERROR(write_whole_blocks());
    if (used_ > 0) {
      std::memset(staging_ + used_, 0, kBlock - used_);
      CAPSTAN_RETURN_IF_ERROR(write_at(written_, staging_, kBlock));
      if (::ftruncate(fd_, static_cast<off_t>(written_ + used_)) != 0) {
        return errno_to_status(errno, "cannot truncate " + quoted(path_));
      }
    }
    return fsync_fd(fd_, quoted(path_));
  }

  Status close() override { return close_fd(fd_, path_); }

 private:
  // Writes the buffer's whole blocks after written_; the rest moves to the front.
  Status write_whole_blocks() {
    const size_t whole = used_ / kBlock * kBlock;
    if (whole == 0) return Status::Ok();
    CAPSTAN_RETURN_IF_ERROR(write_at(written_, staging_, whole));
    written_ += whole;
    std::memmove(staging_, staging_ + whole, used_ - whole);
    used_ -= whole;
    return Status::Ok();
  }

  Status write_at(uint64_t offset, const char* data, size_t n) {
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, data, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EINVAL && direct_) {
        // The file system takes no uncached write of this shape: cached, then.
        direct_ = false;
        int flags = ::fcntl(fd_, F_GETFL);
        if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) {
          return errno_to_status(errno, "cannot write " + quoted(path_));
        }
        continue;
      }
      if (w < 0) return errno_to_status(errno, "cannot write " + quoted(path_));
      if (w == 0) return Status::Internal("writing " + quoted(path_) + " made no progress");
      data += w;
      offset += static_cast<uint64_t>(w);
      n -= static_cast<size_t>(w);
    }
    return Status::Ok();
  }

  const std::string path_;
  int fd_;
  char* const staging_;
  size_t used_ = 0;       // bytes in staging_, which go at written_
  uint64_t written_ = 0;  // whole blocks on disk
  bool direct_ = true;
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Status read(uint64_t offset, size_t n, char* out) const override {
    while (n > 0) {
      ssize_t got = ::pread(fd_, out, n, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        return errno_to_status(errno, "cannot read " + quoted(path_) + " at offset " + std::to_string(offset));
      }
      if (got == 0) {
        return Status::Internal(quoted(path_) + " shrank while being read (end of file at offset " +
                                std::to_string(offset) + ")");
      }
      out += got;
      n -= static_cast<size_t>(got);
      offset += static_cast<uint64_t>(got);
    }
    return Status::Ok();
  }

  uint64_t size() const override { return size_; }

 private:
  const std::string path_;
  const int fd_;
  const uint64_t size_;
};

class PosixDirectoryLock final : public DirectoryLock {
 public:
  explicit PosixDirectoryLock(int fd) : fd_(fd) {}
  ~PosixDirectoryLock() override { ::close(fd_); }  // Releases the flock.

 private:
  const int fd_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> open_writable(const std::string& path, WriteMode mode) override {
    int flags = O_WRONLY | O_CLOEXEC;
    switch (mode) {
      case WriteMode::kTruncate: flags |= O_CREAT | O_TRUNC; break;
      case WriteMode::kCreateNew: flags |= O_CREAT | O_EXCL; break;
      case WriteMode::kAppend: flags |= O_APPEND; break;
    }
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) {
      return errno_to_status(errno, std::string(mode == WriteMode::kAppend ? "cannot open " : "cannot create ") +
                                        quoted(path));
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  Result<std::unique_ptr<WritableFile>> open_bulk_writable(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd >= 0) return std::unique_ptr<WritableFile>(new PosixDirectWritableFile(path, fd));
    // A file system without O_DIRECT (tmpfs before Linux 6.6, some FUSE ones).
    if (errno == EINVAL) return open_writable(path, WriteMode::kTruncate);
    return errno_to_status(errno, "cannot create " + quoted(path));
  }

  Result<std::unique_ptr<RandomAccessFile>> open_readable(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno_to_status(errno, "cannot open " + quoted(path));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      Status status = errno_to_status(errno, "cannot stat " + quoted(path));
      ::close(fd);
      return status;
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status::FailedPrecondition(quoted(path) + " is not a regular file");
    }
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(path, fd, static_cast<uint64_t>(st.st_size)));
  }

  Status sync_file(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno_to_status(errno, "cannot open " + quoted(path));
    Status status = fsync_fd(fd, quoted(path));
    ::close(fd);
    return status;
  }

  Status sync_dir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno_to_status(errno, "cannot open directory " + quoted(dir));
    Status status = fsync_fd(fd, "directory " + quoted(dir));
    ::close(fd);
    return status;
  }

  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return errno_to_status(errno, "cannot rename " + quoted(from) + " to " + quoted(to));
    }
    return Status::Ok();
  }

  Status rename_no_replace(const std::string& from, const std::string& to) override {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return Status::Ok();
    int error = errno;
    if (error == EINVAL || error == ENOSYS) {
      // A file system without RENAME_NOREPLACE: check, then rename (one
      // writer per directory makes the gap harmless).
      struct stat st;
      if (::lstat(to.c_str(), &st) == 0) {
        error = EEXIST;
      } else if (::rename(from.c_str(), to.c_str()) == 0) {
        return Status::Ok();
      } else {
        error = errno;
      }
    }
    if (error == ENOTEMPTY) error = EEXIST;
    return errno_to_status(error, "cannot rename " + quoted(from) + " to " + quoted(to));
  }

  Status remove(const std::string& path) override {
    if (::remove(path.c_str()) != 0) return errno_to_status(errno, "cannot remove " + quoted(path));
    return Status::Ok();
  }

  Status remove_all(const std::string& path) override {
    std::error_code error;
    std::filesystem::remove_all(path, error);
    if (error) return errno_to_status(error.value(), "cannot remove " + quoted(path));
    return Status::Ok();
  }

  Status truncate(const std::string& path, uint64_t size) override {
    if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) {
      return errno_to_status(errno, "cannot truncate " + quoted(path) + " to " + std::to_string(size) + " bytes");
    }
    return Status::Ok();
  }

  Status create_dir(const std::string& dir) override {
    if (::mkdir(dir.c_str(), 0755) != 0) return errno_to_status(errno, "cannot create directory " + quoted(dir));
    return Status::Ok();
  }

  Result<std::vector<std::string>> list_dir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return errno_to_status(errno, "cannot list directory " + quoted(dir));
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* entry = ::readdir(d)) {
      std::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    int read_error = errno;
    ::closedir(d);
    if (read_error != 0) return errno_to_status(read_error, "cannot list directory " + quoted(dir));
    return names;
  }

  Result<FileInfo> stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return errno_to_status(errno, "cannot stat " + quoted(path));
    FileInfo info;
    info.is_directory = S_ISDIR(st.st_mode);
    info.is_regular_file = S_ISREG(st.st_mode);
    info.size = static_cast<uint64_t>(st.st_size);
    return info;
  }

  Result<std::unique_ptr<DirectoryLock>> lock_dir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno_to_status(errno, "cannot open directory " + quoted(dir));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int error = errno;
      ::close(fd);
      if (error == EWOULDBLOCK) return Status::FailedPrecondition("directory " + quoted(dir) + " is locked by another holder");
      return errno_to_status(error, "cannot lock directory " + quoted(dir));
    }
    return std::unique_ptr<DirectoryLock>(new PosixDirectoryLock(fd));
  }
};

}  // namespace

FileSystem& local_file_system() {
  static PosixFileSystem* const fs = new PosixFileSystem;  // never destroyed: usable during exit
  return *fs;
}

Status create_dirs(FileSystem& fs, const std::string& dir, bool sync) {
  Status created = fs.create_dir(dir);
  if (created.ok()) return sync ? fs.sync_dir(parent_dir(dir)) : Status::Ok();
  if (created.code() == StatusCode::kNotFound) {
    std::string parent = parent_dir(dir);
    if (parent == dir) return created;
    CAPSTAN_RETURN_IF_ERROR(create_dirs(fs, parent, sync));
    return create_dirs(fs, dir, sync);
  }
  if (created.code() != StatusCode::kAlreadyExists) return created;
  CAPSTAN_ASSIGN_OR_RETURN(FileInfo info, fs.stat(dir));
  if (!info.is_directory) return Status::FailedPrecondition(dir + " exists and is not a directory");
  return Status::Ok();
}

Result<std::string> read_file(FileSystem& fs, const std::string& path) {
  CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, fs.open_readable(path));
  std::string bytes(static_cast<size_t>(file->size()), '\0');
  CAPSTAN_RETURN_IF_ERROR(file->read(0, bytes.size(), bytes.data()));
  return bytes;
}

std::string parent_dir(const std::string& path) {
  std::string_view p = path;
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  size_t slash = p.find_last_of('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(p.substr(0, slash));
}

std::string join_path(const std::string& dir, std::string_view name) {
  std::string path = dir;
  if (!path.empty() && path.back() != '/') path += '/';
  path += name;
  return path;
}

}  // namespace capstan::io
