#include "data/io/file.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "io/durable_file.h"

namespace capstan::data::io {
namespace {

// Plain files are read in large blocks: fewer system calls, and the kernel's
// readahead (advised sequential) keeps the disk busy.
constexpr size_t kReadBufferBytes = size_t{1} << 20;
// GZIP streams read compressed input and write compressed output in blocks
// of this size; the underlying plain stream passes them straight through.
constexpr size_t kGzipChunkBytes = size_t{256} << 10;
constexpr size_t kWriteBufferBytes = size_t{256} << 10;
// windowBits for zlib: 15 (the maximum window) + 16 = gzip wrapper only.
constexpr int kGzipWindowBits = 16 + MAX_WBITS;

std::string quoted(const std::string& path) { return "'" + path + "'"; }

// Owns a file descriptor.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and returns close()'s errno, or 0.
  int close() {
    int fd = std::exchange(fd_, -1);
    if (fd < 0 || ::close(fd) == 0) return 0;
    return errno;
  }

 private:
  int fd_;
};

class PlainInputStream final : public InputStream {
 public:
  PlainInputStream(UniqueFd fd, std::string path, std::optional<uint64_t> size,
                   size_t buffer_bytes)
      : fd_(std::move(fd)), path_(std::move(path)), size_(size), buffer_bytes_(buffer_bytes) {}

  Result<size_t> read(void* buf, size_t n) override {
    if (!status_.ok()) return status_;
    if (n == 0) return size_t{0};
    if (begin_ == end_) {
      // A request at least as large as the buffer bypasses it.
      if (n >= buffer_bytes_) {
        CAPSTAN_ASSIGN_OR_RETURN(size_t got, read_file(buf, n));
        position_ += got;
        return got;
      }
      if (!buffer_) buffer_.reset(new char[buffer_bytes_]);
      CAPSTAN_ASSIGN_OR_RETURN(size_t got, read_file(buffer_.get(), buffer_bytes_));
      begin_ = 0;
      end_ = got;
      if (got == 0) return size_t{0};
    }
    size_t count = std::min(n, end_ - begin_);
    std::memcpy(buf, buffer_.get() + begin_, count);
    begin_ += count;
    position_ += count;
    return count;
  }

  uint64_t position() const override { return position_; }
  std::optional<uint64_t> size() const override { return size_; }

 private:
  // One read(2), retried on EINTR; the error is sticky.
  Result<size_t> read_file(void* buf, size_t n) {
    n = std::min<size_t>(n, SSIZE_MAX);
    while (true) {
      ssize_t got = ::read(fd_.get(), buf, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno == EINTR) continue;
      status_ = status_from_errno(
          errno, "error reading " + quoted(path_) + " at offset " +
                     std::to_string(position_ + (end_ - begin_)));
      return status_;
    }
  }

  UniqueFd fd_;
  const std::string path_;
  const std::optional<uint64_t> size_;
  const size_t buffer_bytes_;
  std::unique_ptr<char[]> buffer_;  // allocated on first use
  size_t begin_ = 0;                // unread bytes are buffer_[begin_, end_)
  size_t end_ = 0;
  uint64_t position_ = 0;
  Status status_;
};

Result<std::unique_ptr<PlainInputStream>> open_plain_input(const std::string& path,
                                                           size_t buffer_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return status_from_errno(errno, "cannot open " + quoted(path));
  UniqueFd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return status_from_errno(errno, "cannot stat " + quoted(path));
  if (S_ISDIR(st.st_mode)) return status_from_errno(EISDIR, "cannot read " + quoted(path));
  std::optional<uint64_t> size;
  if (S_ISREG(st.st_mode)) {
    size = static_cast<uint64_t>(st.st_size);
    // Advisory only: a failure changes nothing but speed.
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  return std::make_unique<PlainInputStream>(std::move(owned), path, size, buffer_bytes);
}

// Inflates a gzip file of one or more concatenated members.
class GzipInputStream final : public InputStream {
 public:
  GzipInputStream(std::unique_ptr<PlainInputStream> file, std::string path)
      : file_(std::move(file)), path_(std::move(path)), input_(new Bytef[kGzipChunkBytes]) {}

  ~GzipInputStream() override {
    if (zlib_ready_) inflateEnd(&zs_);
  }

  Status init() {
    int rc = inflateInit2(&zs_, kGzipWindowBits);
    if (rc != Z_OK) return zlib_error(rc, "cannot start inflating");
    zlib_ready_ = true;
    return Status::Ok();
  }

  Result<size_t> read(void* buf, size_t n) override {
    if (!status_.ok()) return status_;
    if (n == 0 || at_end_) return size_t{0};
    const auto want = static_cast<uInt>(std::min<size_t>(n, UINT_MAX));
    zs_.next_out = static_cast<Bytef*>(buf);
    zs_.avail_out = want;
    // Loop until some output is produced or the input is exhausted.
    while (zs_.avail_out == want) {
      if (zs_.avail_in == 0) {
        auto got = file_->read(input_.get(), kGzipChunkBytes);
        if (!got.ok()) return status_ = got.status();
        if (*got == 0) {
          if (in_member_) {
            return status_ = Status::DataLoss(
                       "truncated gzip data in " + quoted(path_) +
                       ": the file ends at compressed offset " +
                       std::to_string(file_->position()) + " inside a gzip member");
          }
          at_end_ = true;  // between members (or a zero-byte file): a clean end
          break;
        }
        zs_.next_in = input_.get();
        zs_.avail_in = static_cast<uInt>(*got);
      }
      if (!in_member_) {
        // Another member follows the previous one (concatenated gzip).
        if (members_ > 0) {
          // What follows a complete member must be another member (its
          // first byte is gzip's magic 0x1f).
          if (*zs_.next_in != 0x1f) {
            return status_ = Status::DataLoss(
                       "data that is not gzip follows the gzip stream in " + quoted(path_) +
                       " at compressed offset " + std::to_string(compressed_offset()));
          }
          if (inflateReset(&zs_) != Z_OK) {
            return status_ = zlib_error(Z_STREAM_ERROR, "cannot restart inflating");
          }
        }
        in_member_ = true;
        ++members_;
      }
      int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        in_member_ = false;
      } else if (rc == Z_BUF_ERROR && zs_.avail_in == 0) {
        // No progress possible without more input; fetch it.
      } else if (rc != Z_OK) {
        return status_ = zlib_error(rc, "corrupt gzip data");
      }
    }
    size_t produced = want - zs_.avail_out;
    position_ += produced;
    return produced;
  }

  uint64_t position() const override { return position_; }

 private:
  uint64_t compressed_offset() const { return file_->position() - zs_.avail_in; }

  Status zlib_error(int rc, std::string_view what) {
    std::string message = std::string(what) + " in " + quoted(path_) +
                          " at compressed offset " + std::to_string(compressed_offset());
    if (zs_.msg != nullptr) {
      message += ": ";
      message += zs_.msg;
    }
    if (rc == Z_MEM_ERROR) return Status::ResourceExhausted(std::move(message));
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_BUF_ERROR) {
      return Status::DataLoss(std::move(message));
    }
    return Status::Internal(std::move(message));
  }

  std::unique_ptr<PlainInputStream> file_;
  const std::string path_;
  std::unique_ptr<Bytef[]> input_;  // compressed bytes zs_.next_in points into
  z_stream zs_{};
  bool zlib_ready_ = false;
  bool in_member_ = false;  // inside a gzip member: its end is still to come
  uint64_t members_ = 0;  // members started so far
  bool at_end_ = false;
  uint64_t position_ = 0;
  Status status_;
};

class PlainOutputStream final : public OutputStream {
 public:
  PlainOutputStream(UniqueFd fd, std::string path, size_t buffer_bytes)
      : fd_(std::move(fd)), path_(std::move(path)), buffer_bytes_(buffer_bytes) {}

  ~PlainOutputStream() override { (void)close(); }

  Status write(const void* data, size_t n) override {
    if (!status_.ok()) return status_;
    if (closed_) return Status::FailedPrecondition("write to closed file " + quoted(path_));
    const auto* p = static_cast<const char*>(data);
    if (buffer_.size() + n > buffer_bytes_) {
      CAPSTAN_RETURN_IF_ERROR(flush());
      // A write at least as large as the buffer goes straight to the file.
      if (n >= buffer_bytes_) return write_file(p, n);
    }
    if (buffer_.capacity() < buffer_bytes_) buffer_.reserve(buffer_bytes_);
    buffer_.append(p, n);
    return Status::Ok();
  }

  Status close() override {
    if (closed_) return status_;
    closed_ = true;
    if (status_.ok()) status_ = flush();
    int error = fd_.close();
    if (error != 0 && status_.ok()) {
      status_ = status_from_errno(error, "error closing " + quoted(path_));
    }
    return status_;
  }

 private:
  Status flush() {
    Status status = write_file(buffer_.data(), buffer_.size());
    buffer_.clear();
    return status;
  }

  // write(2) until done, retried on EINTR; the error is sticky.
  Status write_file(const char* p, size_t n) {
    while (n > 0) {
      ssize_t done = ::write(fd_.get(), p, std::min<size_t>(n, SSIZE_MAX));
      if (done < 0) {
        if (errno == EINTR) continue;
        return status_ = status_from_errno(errno, "error writing " + quoted(path_));
      }
      p += done;
      n -= static_cast<size_t>(done);
    }
    return Status::Ok();
  }

  UniqueFd fd_;
  const std::string path_;
  const size_t buffer_bytes_;
  std::string buffer_;
  bool closed_ = false;
  Status status_;
};

Result<std::unique_ptr<PlainOutputStream>> open_plain_output(const std::string& path,
                                                             size_t buffer_bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return status_from_errno(errno, "cannot create " + quoted(path));
  return std::make_unique<PlainOutputStream>(UniqueFd(fd), path, buffer_bytes);
}

// Deflates into one gzip member.
class GzipOutputStream final : public OutputStream {
 public:
  GzipOutputStream(std::unique_ptr<PlainOutputStream> file, std::string path)
      : file_(std::move(file)), path_(std::move(path)), output_(new Bytef[kGzipChunkBytes]) {}

  ~GzipOutputStream() override {
    (void)close();
  }

  Status init() {
    int rc = deflateInit2(&zs_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, kGzipWindowBits,
                          /*memLevel=*/8, Z_DEFAULT_STRATEGY);
    if (rc != Z_OK) return zlib_error(rc, "cannot start deflating");
    zlib_ready_ = true;
    return Status::Ok();
  }

  Status write(const void* data, size_t n) override {
    if (!status_.ok()) return status_;
    if (closed_) return Status::FailedPrecondition("write to closed file " + quoted(path_));
    const auto* p = static_cast<const Bytef*>(data);
    while (n > 0) {
      auto chunk = static_cast<uInt>(std::min<size_t>(n, UINT_MAX));
      zs_.next_in = const_cast<Bytef*>(p);  // zlib's API is not const-correct
      zs_.avail_in = chunk;
      CAPSTAN_RETURN_IF_ERROR(deflate_some(Z_NO_FLUSH));
      p += chunk;
      n -= chunk;
    }
    return Status::Ok();
  }

  Status close() override {
    if (closed_) return status_;
    closed_ = true;
    if (status_.ok()) status_ = deflate_some(Z_FINISH);
    if (zlib_ready_) {
      deflateEnd(&zs_);
      zlib_ready_ = false;
    }
    Status closed = file_->close();
    if (status_.ok()) status_ = closed;
    return status_;
  }

 private:
  // Runs deflate until it has taken all of zs_.avail_in (Z_NO_FLUSH) or
  // finished the stream (Z_FINISH), writing each full output block.
  Status deflate_some(int flush) {
    while (true) {
      zs_.next_out = output_.get();
      zs_.avail_out = kGzipChunkBytes;
      int rc = deflate(&zs_, flush);
      if (rc == Z_STREAM_ERROR) return status_ = zlib_error(rc, "deflate failed");
      size_t produced = kGzipChunkBytes - zs_.avail_out;
      if (produced > 0) {
        Status written = file_->write(output_.get(), produced);
        if (!written.ok()) return status_ = written;
      }
      if (flush == Z_FINISH ? rc == Z_STREAM_END : (zs_.avail_in == 0 && zs_.avail_out != 0)) {
        return Status::Ok();
      }
    }
  }

  Status zlib_error(int rc, std::string_view what) {
    std::string message = std::string(what) + " for " + quoted(path_);
    if (zs_.msg != nullptr) {
      message += ": ";
      message += zs_.msg;
    }
    if (rc == Z_MEM_ERROR) return Status::ResourceExhausted(std::move(message));
    return Status::Internal(std::move(message));
  }

  std::unique_ptr<PlainOutputStream> file_;
  const std::string path_;
  std::unique_ptr<Bytef[]> output_;
  z_stream zs_{};
  bool zlib_ready_ = false;
  bool closed_ = false;
  Status status_;
};

// glob(3) reports unreadable directories through a callback without a user
// pointer; the failure is recorded here, per thread, for match_files().
struct GlobFailure {
  std::string path;
  int error_number = 0;
};
thread_local GlobFailure* glob_failure = nullptr;

int on_glob_error(const char* path, int error_number) {
  // A missing directory (or a file where a directory was expected) just
  // means no match down that path.
  if (error_number == ENOENT || error_number == ENOTDIR) return 0;
  if (glob_failure != nullptr) {
    glob_failure->path = path;
    glob_failure->error_number = error_number;
  }
  return 1;  // abort the match
}

// glob(3) treats an unterminated '[' as a literal; Capstan rejects it, since
// it is almost always a typo.
Status check_pattern(const std::string& pattern) {
  auto invalid = [&pattern](std::string_view why) {
    return Status::InvalidArgument("bad file pattern '" + pattern + "': " + std::string(why));
  };
  if (pattern.empty()) return Status::InvalidArgument("empty file pattern");
  if (pattern.find('\0') != std::string::npos) return invalid("contains a NUL byte");
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\') {
      if (i + 1 == pattern.size()) return invalid("ends with an unescaped '\\'");
      ++i;
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < pattern.size() && (pattern[j] == '!' || pattern[j] == '^')) ++j;
      if (j < pattern.size() && pattern[j] == ']') ++j;  // a leading ']' is literal
      while (j < pattern.size() && pattern[j] != ']') ++j;
      if (j == pattern.size()) return invalid("'[' at position " + std::to_string(i) +
                                              " has no closing ']'");
      i = j;
    }
  }
  return Status::Ok();
}

}  // namespace

std::optional<Compression> compression_from_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  if (upper.empty() || upper == "NONE") return Compression::kNone;
  if (upper == "GZIP") return Compression::kGzip;
  return std::nullopt;
}

std::string_view compression_name(Compression compression) {
  return compression == Compression::kGzip ? "GZIP" : "NONE";
}

Status status_from_errno(int error_number, std::string_view context) {
  return capstan::io::errno_to_status(error_number, context);
}

InputStream::~InputStream() = default;
OutputStream::~OutputStream() = default;

Result<size_t> read_fully(InputStream& stream, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    CAPSTAN_ASSIGN_OR_RETURN(size_t got, stream.read(p + done, n - done));
    if (got == 0) break;
    done += got;
  }
  return done;
}

Result<std::unique_ptr<InputStream>> open_input(const std::string& path,
                                                Compression compression) {
  if (compression == Compression::kNone) {
    CAPSTAN_ASSIGN_OR_RETURN(auto file, open_plain_input(path, kReadBufferBytes));
    return std::unique_ptr<InputStream>(std::move(file));
  }
  // The gzip stream reads whole chunks, which bypass the plain buffer.
  CAPSTAN_ASSIGN_OR_RETURN(auto file, open_plain_input(path, kGzipChunkBytes));
  auto stream = std::make_unique<GzipInputStream>(std::move(file), path);
  CAPSTAN_RETURN_IF_ERROR(stream->init());
  return std::unique_ptr<InputStream>(std::move(stream));
}

Result<std::unique_ptr<OutputStream>> open_output(const std::string& path,
                                                  Compression compression) {
  if (compression == Compression::kNone) {
    CAPSTAN_ASSIGN_OR_RETURN(auto file, open_plain_output(path, kWriteBufferBytes));
    return std::unique_ptr<OutputStream>(std::move(file));
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto file, open_plain_output(path, kGzipChunkBytes));
  auto stream = std::make_unique<GzipOutputStream>(std::move(file), path);
  CAPSTAN_RETURN_IF_ERROR(stream->init());
  return std::unique_ptr<OutputStream>(std::move(stream));
}

Result<std::vector<std::string>> match_files(const std::string& pattern) {
  CAPSTAN_RETURN_IF_ERROR(check_pattern(pattern));
  GlobFailure failure;
  glob_failure = &failure;
  glob_t matches{};
  int rc = ::glob(pattern.c_str(), GLOB_NOSORT, on_glob_error, &matches);
  glob_failure = nullptr;
  std::vector<std::string> paths;
  if (rc == 0) {
    paths.reserve(matches.gl_pathc);
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  switch (rc) {
    case 0:
    case GLOB_NOMATCH:
      break;
    case GLOB_NOSPACE:
      return Status::ResourceExhausted("out of memory matching '" + pattern + "'");
    case GLOB_ABORTED:
      return status_from_errno(failure.error_number, "cannot list directory '" + failure.path +
                                                         "' while matching '" + pattern + "'");
    default:
      return Status::Internal("glob('" + pattern + "') failed with code " + std::to_string(rc));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace capstan::data::io
