#include "journal/journal.h"

#include <algorithm>
#include <utility>

#include "io/crc32c.h"
#include "journal/journal_format.h"

namespace capstan::journal {
namespace {

using io::crc32c;
using io::crc32c_extend;
using io::crc32c_mask;
using io::join_path;

Status corrupted(const std::string& path, uint64_t offset, const std::string& why) {
  return Status::DataLoss("journal corrupted at " + path + ":" + std::to_string(offset) + ": " + why);
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

// Whether bytes [from, size) of the file are all zero.
Result<bool> rest_is_zero(const io::RandomAccessFile& file, uint64_t from, uint64_t size) {
  char buf[64 << 10];
  while (from < size) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof buf, size - from));
    CAPSTAN_RETURN_IF_ERROR(file.read(from, n, buf));
    if (std::any_of(buf, buf + n, [](char c) { return c != 0; })) return false;
    from += n;
  }
  return true;
}

// The segment numbers in `dir`, ascending. kDataLoss when the numbering does
// not run 1, 2, ... without a gap; a missing directory has none.
Result<std::vector<uint64_t>> list_segments(io::FileSystem& fs, const std::string& dir) {
  if (Result<io::FileInfo> info = fs.stat(dir); info.status().code() == StatusCode::kNotFound) {
    return std::vector<uint64_t>{};
  }
  Result<std::vector<std::string>> names = fs.list_dir(dir);
  if (!names.ok()) return names.status().with_context("cannot list journal directory " + dir);
  std::vector<uint64_t> numbers;
  for (std::string_view name : *names) {
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
Result<Outcome> read_record(const io::RandomAccessFile& file, const std::string& path, uint64_t size,
                            uint64_t offset, bool last, std::string* payload) {
  if (offset == size) return Outcome::kEnd;
  const uint64_t remaining = size - offset;
  if (remaining < kHeaderBytes) {
    if (last) return Outcome::kTornTail;
    return corrupted(path, offset,
                     "truncated header: " + std::to_string(remaining) + " bytes left, need " +
                         std::to_string(kHeaderBytes));
  }
  char header[kHeaderBytes];
  CAPSTAN_RETURN_IF_ERROR(file.read(offset, kHeaderBytes, header));
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
  CAPSTAN_RETURN_IF_ERROR(file.read(offset + kHeaderBytes, length, payload->data()));
  if (record_crc(header + kCrcBytes, *payload) != stored_crc) {
    if (last) {
      if (kHeaderBytes + uint64_t{length} == remaining) return Outcome::kTornTail;
      CAPSTAN_ASSIGN_OR_RETURN(bool zeros, rest_is_zero(file, offset, size));
      if (zeros) return Outcome::kTornTail;
    }
    return corrupted(path, offset, "checksum mismatch");
  }
  return Outcome::kRecord;
}

}  // namespace

// --- JournalWriter ---------------------------------------------------------

JournalWriter::JournalWriter(io::FileSystem& fs, std::string dir, bool sync, uint64_t max_segment_bytes,
                             std::unique_ptr<io::DirectoryLock> dir_lock)
    : fs_(fs), dir_(std::move(dir)), sync_(sync), max_segment_bytes_(max_segment_bytes), dir_lock_(std::move(dir_lock)) {}

JournalWriter::~JournalWriter() = default;

Result<std::unique_ptr<JournalWriter>> JournalWriter::open(const std::string& dir, bool sync,
                                                           uint64_t max_segment_bytes, io::FileSystem& fs) {
  if (dir.empty()) return Status::InvalidArgument("journal directory must not be empty");
  CAPSTAN_RETURN_IF_ERROR(io::create_dirs(fs, dir, sync));
  Result<std::unique_ptr<io::DirectoryLock>> lock = fs.lock_dir(dir);
  if (lock.status().code() == StatusCode::kFailedPrecondition) {
    return Status::FailedPrecondition("journal " + dir + " is already open in another JournalWriter");
  }
  if (!lock.ok()) return lock.status().with_context("cannot lock journal directory " + dir);
  std::unique_ptr<JournalWriter> writer(new JournalWriter(fs, dir, sync, max_segment_bytes, std::move(*lock)));

  CAPSTAN_ASSIGN_OR_RETURN(std::vector<uint64_t> segments, list_segments(fs, dir));
  if (segments.empty()) {
    CAPSTAN_RETURN_IF_ERROR(writer->start_segment(kFirstSegmentNumber));
    return writer;
  }

  // Find the end of the last good record in the last segment.
  const uint64_t number = segments.back();
  const std::string path = join_path(dir, segment_file_name(number));
  uint64_t offset = 0;
  bool torn = false;
  {
    Result<std::unique_ptr<io::RandomAccessFile>> file = fs.open_readable(path);
    if (!file.ok()) return file.status().with_context("cannot open journal segment " + path);
    const uint64_t size = (*file)->size();
    std::string payload;
    while (true) {
      CAPSTAN_ASSIGN_OR_RETURN(Outcome outcome,
                               read_record(**file, path, size, offset, /*last=*/true, &payload));
      if (outcome == Outcome::kEnd) break;
      if (outcome == Outcome::kTornTail) {
        torn = true;
        break;
      }
      offset += kHeaderBytes + payload.size();
    }
  }
  if (torn) {
    Status truncated = fs.truncate(path, offset);
    if (!truncated.ok()) return truncated.with_context("cannot truncate the torn tail of " + path);
  }
  Result<std::unique_ptr<io::WritableFile>> segment = fs.open_writable(path, io::WriteMode::kAppend);
  if (!segment.ok()) return segment.status().with_context("cannot open journal segment " + path);
  writer->segment_ = std::move(*segment);
  writer->segment_number_ = number;
  writer->segment_path_ = path;
  writer->segment_bytes_ = offset;
  if (torn && sync) CAPSTAN_RETURN_IF_ERROR(writer->segment_->sync());
  return writer;
}

Status JournalWriter::start_segment(uint64_t number) {
  if (segment_ != nullptr) {
    // Records of a batch written to it are not fsynced yet.
    if (sync_) CAPSTAN_RETURN_IF_ERROR(segment_->sync());
    std::unique_ptr<io::WritableFile> old = std::move(segment_);
    CAPSTAN_RETURN_IF_ERROR(old->close());
  }
  std::string path = join_path(dir_, segment_file_name(number));
  Result<std::unique_ptr<io::WritableFile>> segment = fs_.open_writable(path, io::WriteMode::kCreateNew);
  if (!segment.ok()) return segment.status().with_context("cannot create journal segment " + path);
  segment_ = std::move(*segment);
  segment_number_ = number;
  segment_path_ = std::move(path);
  segment_bytes_ = 0;
  // Make the new name durable before any record in it is acknowledged.
  if (sync_) return fs_.sync_dir(dir_);
  return Status::Ok();
}

Status JournalWriter::fail(Status failure) {
  broken_ = failure;
  return failure;
}

Status JournalWriter::append(std::string_view record) {
  CAPSTAN_RETURN_IF_ERROR(write_record(record));
  if (sync_) {
    Status status = segment_->sync();
    if (!status.ok()) return fail(std::move(status));
  }
  ++records_written_;
  return Status::Ok();
}

Status JournalWriter::append_batch(const std::vector<std::string>& records) {
  for (const auto& record : records) CAPSTAN_RETURN_IF_ERROR(write_record(record));
  if (sync_ && !records.empty()) {
    // A segment started within the batch fsynced the records before it.
    Status status = segment_->sync();
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
  if (segment_ == nullptr ||
      (segment_bytes_ > 0 && segment_bytes_ + record_bytes > max_segment_bytes_)) {
    Status status = start_segment(segment_number_ + 1);
    if (!status.ok()) return fail(std::move(status));
  }

  std::string buf(kHeaderBytes, '\0');
  encode_le32(static_cast<uint32_t>(record.size()), buf.data() + kCrcBytes);
  encode_le32(record_crc(buf.data() + kCrcBytes, record), buf.data());
  buf.append(record);
  // One write per record: a crash leaves at most this record incomplete.
  Status status = segment_->append(buf);
  if (!status.ok()) return fail(std::move(status));
  segment_bytes_ += record_bytes;
  return Status::Ok();
}

// --- JournalReader ---------------------------------------------------------

JournalReader::JournalReader(io::FileSystem& fs, std::string dir, std::vector<uint64_t> segments)
    : fs_(fs), dir_(std::move(dir)), segments_(std::move(segments)) {}

JournalReader::~JournalReader() = default;

Result<std::unique_ptr<JournalReader>> JournalReader::open(const std::string& dir, io::FileSystem& fs) {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<uint64_t> segments, list_segments(fs, dir));
  return std::unique_ptr<JournalReader>(new JournalReader(fs, dir, std::move(segments)));
}

Status JournalReader::open_next_segment() {
  std::string path = join_path(dir_, segment_file_name(segments_[next_segment_]));
  ++next_segment_;
  Result<std::unique_ptr<io::RandomAccessFile>> file = fs_.open_readable(path);
  if (!file.ok()) return file.status().with_context("cannot open journal segment " + path);
  segment_ = std::move(*file);
  segment_path_ = std::move(path);
  offset_ = 0;
  segment_size_ = segment_->size();
  return Status::Ok();
}

Result<bool> JournalReader::read(std::string* record) {
  if (!error_.ok()) return error_;
  while (!done_) {
    if (segment_ == nullptr) {
      if (next_segment_ == segments_.size()) {
        done_ = true;
        break;
      }
      Status status = open_next_segment();
      if (!status.ok()) return error_ = std::move(status);
    }
    const bool last = next_segment_ == segments_.size();
    Result<Outcome> outcome = read_record(*segment_, segment_path_, segment_size_, offset_, last, record);
    if (!outcome.ok()) return error_ = outcome.status();
    switch (*outcome) {
      case Outcome::kRecord:
        offset_ += kHeaderBytes + record->size();
        return true;
      case Outcome::kEnd:
        segment_.reset();
        break;
      case Outcome::kTornTail:
        dropped_tail_bytes_ = segment_size_ - offset_;
        segment_.reset();
        done_ = true;
        break;
    }
  }
  return false;
}

Result<std::vector<std::string>> read_all(const std::string& dir, io::FileSystem& fs) {
  CAPSTAN_ASSIGN_OR_RETURN(std::unique_ptr<JournalReader> reader, JournalReader::open(dir, fs));
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
