#include "data/io/fixed_length.h"

#include <algorithm>
#include <utility>

namespace capstan::data::io {

Result<std::unique_ptr<FixedLengthRecordReader>> FixedLengthRecordReader::open(
    const std::string& path, int64_t record_bytes, int64_t header_bytes, int64_t footer_bytes,
    Compression compression) {
  if (record_bytes <= 0) {
    return Status::InvalidArgument("record_bytes must be > 0, got " +
                                   std::to_string(record_bytes));
  }
  if (header_bytes < 0) {
    return Status::InvalidArgument("header_bytes must be >= 0, got " +
                                   std::to_string(header_bytes));
  }
  if (footer_bytes < 0) {
    return Status::InvalidArgument("footer_bytes must be >= 0, got " +
                                   std::to_string(footer_bytes));
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto stream, open_input(path, compression));
  std::unique_ptr<FixedLengthRecordReader> reader(new FixedLengthRecordReader(
      std::move(stream), path, static_cast<uint64_t>(record_bytes),
      static_cast<uint64_t>(header_bytes), static_cast<uint64_t>(footer_bytes)));
  CAPSTAN_RETURN_IF_ERROR(reader->start());
  return reader;
}

FixedLengthRecordReader::FixedLengthRecordReader(std::unique_ptr<InputStream> stream,
                                                 std::string path, uint64_t record_bytes,
                                                 uint64_t header_bytes, uint64_t footer_bytes)
    : stream_(std::move(stream)),
      path_(std::move(path)),
      record_bytes_(record_bytes),
      header_bytes_(header_bytes),
      footer_bytes_(footer_bytes) {}

std::string FixedLengthRecordReader::remainder_message(uint64_t body_bytes) const {
  return "Excluding the header (" + std::to_string(header_bytes_) + " bytes) and footer (" +
         std::to_string(footer_bytes_) + " bytes), input file '" + path_ + "' has body length " +
         std::to_string(body_bytes) +
         " bytes, which is not an exact multiple of the record length (" +
         std::to_string(record_bytes_) + " bytes)";
}

Status FixedLengthRecordReader::start() {
  if (std::optional<uint64_t> size = stream_->size()) {
    // Uncompressed: check the whole layout up front, as TensorFlow does.
    if (*size < header_bytes_ || *size - header_bytes_ < footer_bytes_) {
      return Status::InvalidArgument("input file '" + path_ + "' has " + std::to_string(*size) +
                                     " bytes, fewer than its header (" +
                                     std::to_string(header_bytes_) + " bytes) and footer (" +
                                     std::to_string(footer_bytes_) + " bytes)");
    }
    uint64_t body = *size - header_bytes_ - footer_bytes_;
    if (body % record_bytes_ != 0) return Status::InvalidArgument(remainder_message(body));
    records_left_ = body / record_bytes_;
  }
  // Skip the header (and, for GZIP, read the footer-sized lookahead).
  uint64_t prefix = header_bytes_ + (records_left_ ? 0 : footer_bytes_);
  std::string scratch;
  uint64_t done = 0;
  while (done < prefix) {
    size_t step = static_cast<size_t>(std::min<uint64_t>(prefix - done, 1 << 20));
    scratch.resize(step);
    CAPSTAN_ASSIGN_OR_RETURN(size_t got, read_fully(*stream_, scratch.data(), step));
    if (done + got > header_bytes_) {
      size_t from = done >= header_bytes_ ? 0 : static_cast<size_t>(header_bytes_ - done);
      lookahead_.append(scratch, from, got - from);
    }
    done += got;
    if (got < step) {
      // Only GZIP gets here: a plain file's size was checked above.
      return Status::DataLoss("input file '" + path_ + "' has " + std::to_string(done) +
                              " bytes, fewer than its header (" + std::to_string(header_bytes_) +
                              " bytes) and footer (" + std::to_string(footer_bytes_) +
                              " bytes)");
    }
  }
  return Status::Ok();
}

Status FixedLengthRecordReader::fail(Status status) {
  status_ = std::move(status);
  return status_;
}

Result<bool> FixedLengthRecordReader::read(std::string* record) {
  if (!status_.ok()) return status_;
  if (records_left_) {
    if (*records_left_ == 0) return false;
    record->resize(record_bytes_);
    auto got = read_fully(*stream_, record->data(), record_bytes_);
    if (!got.ok()) return fail(got.status());
    if (*got < record_bytes_) {
      // The file shrank after open().
      return fail(Status::DataLoss("input file '" + path_ + "' ends at offset " +
                                   std::to_string(stream_->position()) +
                                   ", inside a record; it was truncated while being read"));
    }
    --*records_left_;
    return true;
  }
  // GZIP: read one record's worth; the record is the oldest record_bytes_ of
  // lookahead + block, and the newest footer_bytes_ stay as the lookahead.
  uint64_t position_before = stream_->position();
  block_.resize(record_bytes_);
  auto got = read_fully(*stream_, block_.data(), record_bytes_);
  if (!got.ok()) return fail(got.status());
  if (*got == 0) return false;
  if (*got < record_bytes_) {
    uint64_t body = position_before + *got - header_bytes_ - footer_bytes_;
    return fail(Status::DataLoss(remainder_message(body)));
  }
  lookahead_.append(block_);
  record->assign(lookahead_, 0, record_bytes_);
  lookahead_.erase(0, record_bytes_);
  return true;
}

}  // namespace capstan::data::io
