#include "journal/journal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "data/io/crc32c.h"
#include "io/durable_file.h"
#include "journal/journal_format.h"

namespace capstan::journal {
namespace {

using data::io::crc32c;
using data::io::crc32c_extend;
using data::io::crc32c_mask;
using data::io::crc32c_unmask;

std::string join_path(const std::string& dir, std::string_view name) {
  std::string path = dir;
  if (!path.empty() && path.back() != '/') path += '/';
  path += name;
  return path;
}

Status corrupted(const std::string& path, uint64_t offset, const std::string& why) {
  return Status::DataLoss("journal corrupted at " + path + ":" + std::to_string(offset) + ": " + why);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void encode_le32(uint32_t value, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint32_t decode_le32(const char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

// The masked checksum stored in a record's header.
uint32_t record_crc(const char* length_bytes, std::string_view payload) {
  uint32_t crc = crc32c(length_bytes, kLengthBytes);
  return crc32c_mask(crc32c_extend(crc, payload.data(), payload.size()));
}

// Reads exactly n bytes at `offset`; the caller has checked they lie inside
// the file, so a short read means the file shrank under us.
Status pread_exact(int fd, const std::string& path, char* buf, size_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t got = ::pread(fd, buf, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return io::errno_to_status(errno, "error reading " + path + " at offset " + std::to_string(offset));
    }
    if (got == 0) {
      return Status::Internal(path + " shrank while being read (end of file at offset " +
                              std::to_string(offset) + ")");
    }
    buf += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

Status write_all(int fd, const std::string& path, const char* buf, size_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t put = ::pwrite(fd, buf, n, static_cast<off_t>(offset));
    if (put < 0) {
      if (errno == EINTR) continue;
      return io::errno_to_status(errno, "error writing " + path + " at offset " + std::to_string(offset));
    }
    buf += put;
    n -= static_cast<size_t>(put);
    offset += static_cast<uint64_t>(put);
  }
  return Status::Ok();
}

Status fsync_fd(int fd, const std::string& path) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    return io::errno_to_status(errno, "error syncing " + path);
  }
  return Status::Ok();
}

Result<uint64_t> file_size(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return io::errno_to_status(errno, "cannot stat " + path);
  if (!S_ISREG(st.st_mode)) return Status::FailedPrecondition(path + " is not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

// Whether bytes [from, size) of the file are all zero.
Result<bool> rest_is_zero(int fd, const std::string& path, uint64_t from, uint64_t size) {
  char buf[64 << 10];
  while (from < size) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof buf, size - from));
    CAPSTAN_RETURN_IF_ERROR(pread_exact(fd, path, buf, n, from));
    if (std::any_of(buf, buf + n, [](char c) { return c != 0; })) return false;
    from += n;
  }
  return true;
}

// The segment numbers in `dir`, ascending. kDataLoss when the numbering does
// not run 1, 2, ... without a gap; a missing directory has none.
Result<std::vector<uint64_t>> list_segments(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return std::vector<uint64_t>{};
    return io::errno_to_status(errno, "cannot list journal directory " + dir);
  }
  std::vector<uint64_t> numbers;
  errno = 0;
  while (struct dirent* entry = ::readdir(d)) {
    std::string_view name = entry->d_name;
    if (name.size() <= kSegmentPrefix.size() + kSegmentSuffix.size() ||
        name.substr(0, kSegmentPrefix.size()) != kSegmentPrefix ||
        name.substr(name.size() - kSegmentSuffix.size()) != kSegmentSuffix) {
      continue;
    }
    std::string_view digits = name.substr(
        kSegmentPrefix.size(), name.size() - kSegmentPrefix.size() - kSegmentSuffix.size());
    if (digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    uint64_t number = 0;
    for (char c : digits) number = number * 10 + static_cast<uint64_t>(c - '0');
    // Only the canonical spelling counts ("journal-1.log" is someone else's).
    if (segment_file_name(number) != name) continue;
    numbers.push_back(number);
  }
  int read_error = errno;
  ::closedir(d);
  if (read_error != 0) return io::errno_to_status(read_error, "cannot list journal directory " + dir);

  std::sort(numbers.begin(), numbers.end());
  uint64_t expected = kFirstSegmentNumber;
  for (uint64_t number : numbers) {
    if (number != expected) {
      return Status::DataLoss("journal missing segment " + join_path(dir, segment_file_name(expected)) +
                              " (next present: " + segment_file_name(number) + ")");
    }
    ++expected;
  }
  return numbers;
}

enum class Outcome { kRecord, kEnd, kTornTail };

// Reads the record at `offset` of the segment `path` (`size` bytes; `last`
// when it is the journal's last segment) into *payload, classifying damage as
// journal_format.h describes. kTornTail drops bytes [offset, size).
Result<Outcome> read_record(int fd, const std::string& path, uint64_t size, uint64_t offset,
                            bool last, std::string* payload) {
  if (offset == size) return Outcome::kEnd;
  const uint64_t remaining = size - offset;
  if (remaining < kHeaderBytes) {
    if (last) return Outcome::kTornTail;
    return corrupted(path, offset,
                     "truncated header: " + std::to_string(remaining) + " bytes left, need " +
                         std::to_string(kHeaderBytes));
  }
  char header[kHeaderBytes];
  CAPSTAN_RETURN_IF_ERROR(pread_exact(fd, path, header, kHeaderBytes, offset));
  const uint32_t stored_crc = decode_le32(header);
  const uint32_t length = decode_le32(header + kCrcBytes);

  if (length > kMaxRecordBytes) {
    if (last && remaining == kHeaderBytes) return Outcome::kTornTail;
    return corrupted(path, offset,
                     "length " + std::to_string(length) + " exceeds the limit of " +
                         std::to_string(kMaxRecordBytes) + " bytes");
  }
  if (kHeaderBytes + uint64_t{length} > remaining) {
    if (last) return Outcome::kTornTail;
    return corrupted(path, offset,
                     "truncated record: length " + std::to_string(length) + " but only " +
                         std::to_string(remaining - kHeaderBytes) + " bytes follow the header");
  }
  // length <= remaining: the allocation is bounded by the file's size.
  payload->resize(length);
  CAPSTAN_RETURN_IF_ERROR(pread_exact(fd, path, payload->data(), length, offset + kHeaderBytes));
  if (record_crc(header + kCrcBytes, *payload) != stored_crc) {
    if (last) {
      if (kHeaderBytes + uint64_t{length} == remaining) return Outcome::kTornTail;
      CAPSTAN_ASSIGN_OR_RETURN(bool zeros, rest_is_zero(fd, path, offset, size));
      if (zeros) return Outcome::kTornTail;
    }
    return corrupted(path, offset, "checksum mismatch");
  }
  return Outcome::kRecord;
}

// The parent directory of `path` ("." for a bare name).
std::string parent_of(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io::errno_to_status(errno, "cannot open directory " + dir);
  Status status = fsync_fd(fd, dir);
  ::close(fd);
  return status;
}

// mkdir -p, fsyncing the parent of each directory it creates when `sync`.
Status make_dirs(const std::string& dir, bool sync) {
  if (::mkdir(dir.c_str(), 0755) != 0) {
    int error = errno;
    if (error == ENOENT) {
      std::string parent = parent_of(dir);
      if (parent == dir) return io::errno_to_status(error, "cannot create directory " + dir);
      CAPSTAN_RETURN_IF_ERROR(make_dirs(parent, sync));
      return make_dirs(dir, sync);
    }
    if (error != EEXIST) return io::errno_to_status(error, "cannot create directory " + dir);
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return io::errno_to_status(errno, "cannot stat " + dir);
    if (!S_ISDIR(st.st_mode)) return Status::FailedPrecondition(dir + " exists and is not a directory");
    return Status::Ok();
  }
  return sync ? fsync_dir(parent_of(dir)) : Status::Ok();
}

}  // namespace

// --- JournalWriter ---------------------------------------------------------

JournalWriter::JournalWriter(std::string dir, bool sync, uint64_t max_segment_bytes, int dir_fd)
    : dir_(std::move(dir)), sync_(sync), max_segment_bytes_(max_segment_bytes), dir_fd_(dir_fd) {}

JournalWriter::~JournalWriter() {
  close_fd(segment_fd_);
  if (dir_fd_ >= 0) ::close(dir_fd_);  // Releases the flock.
}

Result<std::unique_ptr<JournalWriter>> JournalWriter::open(const std::string& dir, bool sync,
                                                           uint64_t max_segment_bytes) {
  if (dir.empty()) return Status::InvalidArgument("journal directory must not be empty");
  CAPSTAN_RETURN_IF_ERROR(make_dirs(dir, sync));
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return io::errno_to_status(errno, "cannot open journal directory " + dir);
  if (::flock(dir_fd, LOCK_EX | LOCK_NB) != 0) {
    int error = errno;
    ::close(dir_fd);
    if (error == EWOULDBLOCK) {
      return Status::FailedPrecondition("journal " + dir + " is already open in another JournalWriter");
    }
    return io::errno_to_status(error, "cannot lock journal directory " + dir);
  }
  // From here the writer owns dir_fd.
  std::unique_ptr<JournalWriter> writer(new JournalWriter(dir, sync, max_segment_bytes, dir_fd));

  CAPSTAN_ASSIGN_OR_RETURN(std::vector<uint64_t> segments, list_segments(dir));
  if (segments.empty()) {
    CAPSTAN_RETURN_IF_ERROR(writer->start_segment(kFirstSegmentNumber));
    return writer;
  }

  // Find the end of the last good record in the last segment.
  const uint64_t number = segments.back();
  const std::string path = join_path(dir, segment_file_name(number));
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return io::errno_to_status(errno, "cannot open journal segment " + path);
  writer->segment_fd_ = fd;  // Closed by the writer from here on.
  writer->segment_number_ = number;
  writer->segment_path_ = path;
  CAPSTAN_ASSIGN_OR_RETURN(uint64_t size, file_size(fd, path));
  uint64_t offset = 0;
  std::string payload;
  while (true) {
    CAPSTAN_ASSIGN_OR_RETURN(Outcome outcome, read_record(fd, path, size, offset, /*last=*/true, &payload));
    if (outcome == Outcome::kEnd) break;
    if (outcome == Outcome::kTornTail) {
      if (::ftruncate(fd, static_cast<off_t>(offset)) != 0) {
        return io::errno_to_status(errno, "cannot truncate the torn tail of " + path + " at offset " +
                                       std::to_string(offset));
      }
      if (sync) CAPSTAN_RETURN_IF_ERROR(fsync_fd(fd, path));
      break;
    }
    offset += kHeaderBytes + payload.size();
  }
  writer->segment_bytes_ = offset;
  return writer;
}

Status JournalWriter::start_segment(uint64_t number) {
  if (segment_fd_ >= 0) {
    // Records of a batch written to it are not fsynced yet.
    if (sync_) CAPSTAN_RETURN_IF_ERROR(fsync_fd(segment_fd_, segment_path_));
    int fd = segment_fd_;
    segment_fd_ = -1;
    if (::close(fd) != 0) return io::errno_to_status(errno, "error closing " + segment_path_);
  }
  std::string path = join_path(dir_, segment_file_name(number));
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return io::errno_to_status(errno, "cannot create journal segment " + path);
  segment_fd_ = fd;
  segment_number_ = number;
  segment_path_ = std::move(path);
  segment_bytes_ = 0;
  // Make the new name durable before any record in it is acknowledged.
  if (sync_) return fsync_fd(dir_fd_, dir_);
  return Status::Ok();
}

Status JournalWriter::fail(Status failure) {
  broken_ = failure;
  return failure;
}

Status JournalWriter::append(std::string_view record) {
  CAPSTAN_RETURN_IF_ERROR(write_record(record));
  if (!injected_failure_.ok()) return fail(std::exchange(injected_failure_, Status::Ok()));
  if (sync_) {
    Status status = fsync_fd(segment_fd_, segment_path_);
    if (!status.ok()) return fail(std::move(status));
  }
  ++records_written_;
  return Status::Ok();
}

Status JournalWriter::append_batch(const std::vector<std::string>& records) {
  for (const auto& record : records) CAPSTAN_RETURN_IF_ERROR(write_record(record));
  if (!injected_failure_.ok()) return fail(std::exchange(injected_failure_, Status::Ok()));
  if (sync_ && !records.empty()) {
    // A segment started within the batch fsynced the records before it.
    Status status = fsync_fd(segment_fd_, segment_path_);
    if (!status.ok()) return fail(std::move(status));
  }
  records_written_ += records.size();
  return Status::Ok();
}

Status JournalWriter::write_record(std::string_view record) {
  if (!broken_.ok()) {
    return Status::FailedPrecondition("journal writer for " + dir_ +
                                      " is broken by an earlier failure: " + broken_.to_string());
  }
  if (record.size() > kMaxRecordBytes) {
    return Status::InvalidArgument("journal record of " + std::to_string(record.size()) +
                                   " bytes exceeds the limit of " + std::to_string(kMaxRecordBytes));
  }
  const uint64_t record_bytes = kHeaderBytes + record.size();
  if (segment_fd_ < 0 ||
      (segment_bytes_ > 0 && segment_bytes_ + record_bytes > max_segment_bytes_)) {
    Status status = start_segment(segment_number_ + 1);
    if (!status.ok()) return fail(std::move(status));
  }

  std::string buf(kHeaderBytes, '\0');
  encode_le32(static_cast<uint32_t>(record.size()), buf.data() + kCrcBytes);
  encode_le32(record_crc(buf.data() + kCrcBytes, record), buf.data());
  buf.append(record);
  // One write per record: a crash leaves at most this record incomplete.
  Status status = write_all(segment_fd_, segment_path_, buf.data(), buf.size(), segment_bytes_);
  if (!status.ok()) return fail(std::move(status));
  segment_bytes_ += record_bytes;
  return Status::Ok();
}

// --- JournalReader ---------------------------------------------------------

JournalReader::JournalReader(std::string dir, std::vector<uint64_t> segments)
    : dir_(std::move(dir)), segments_(std::move(segments)) {}

JournalReader::~JournalReader() { close_fd(segment_fd_); }

Result<std::unique_ptr<JournalReader>> JournalReader::open(const std::string& dir) {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<uint64_t> segments, list_segments(dir));
  return std::unique_ptr<JournalReader>(new JournalReader(dir, std::move(segments)));
}

Status JournalReader::open_next_segment() {
  std::string path = join_path(dir_, segment_file_name(segments_[next_segment_]));
  ++next_segment_;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io::errno_to_status(errno, "cannot open journal segment " + path);
  segment_fd_ = fd;
  segment_path_ = std::move(path);
  offset_ = 0;
  CAPSTAN_ASSIGN_OR_RETURN(segment_size_, file_size(fd, segment_path_));
  return Status::Ok();
}

Result<bool> JournalReader::read(std::string* record) {
  if (!error_.ok()) return error_;
  while (!done_) {
    if (segment_fd_ < 0) {
      if (next_segment_ == segments_.size()) {
        done_ = true;
        break;
      }
      Status status = open_next_segment();
      if (!status.ok()) return error_ = std::move(status);
    }
    const bool last = next_segment_ == segments_.size();
    Result<Outcome> outcome = read_record(segment_fd_, segment_path_, segment_size_, offset_, last, record);
    if (!outcome.ok()) return error_ = outcome.status();
    switch (*outcome) {
      case Outcome::kRecord:
        offset_ += kHeaderBytes + record->size();
        return true;
      case Outcome::kEnd:
        close_fd(segment_fd_);
        break;
      case Outcome::kTornTail:
        dropped_tail_bytes_ = segment_size_ - offset_;
        close_fd(segment_fd_);
        done_ = true;
        break;
    }
  }
  return false;
}

Result<std::vector<std::string>> read_all(const std::string& dir) {
  CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<JournalReader> reader, JournalReader::open(dir));
  std::vector<std::string> records;
  std::string record;
  while (true) {
    CAPSTAN_ASSIGN_OR_RETURN(bool more, reader->read(&record));
    if (!more) break;
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace capstan::journal
