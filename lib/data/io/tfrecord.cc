#include "data/io/tfrecord.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <utility>

#include "io/crc32c.h"
#include "data/io/record_format.h"

namespace capstan::data::io {
namespace {

using capstan::io::crc32c;
using capstan::io::crc32c_mask;
using capstan::io::crc32c_unmask;

// Record data is read into the caller's string in steps of at most this
// many bytes, so a length that passes its CRC but exceeds what a compressed
// stream holds fails at the end of the data, not at allocation.
constexpr size_t kDataStepBytes = size_t{64} << 20;

void encode_le32(uint32_t value, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(value >> (8 * i));
}
void encode_le64(uint64_t value, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
}
uint32_t decode_le32(const char* in) {
  uint32_t value;
  std::memcpy(&value, in, sizeof(value));
  if constexpr (std::endian::native == std::endian::big) value = __builtin_bswap32(value);
  return value;
}
uint64_t decode_le64(const char* in) {
  uint64_t value;
  std::memcpy(&value, in, sizeof(value));
  if constexpr (std::endian::native == std::endian::big) value = __builtin_bswap64(value);
  return value;
}

// A kString scalar of `length` bytes still to fill: its one buffer holds
// the offsets {0, length}, then the bytes (at `data`).
struct StringScalar {
  explicit StringScalar(uint64_t length)
      : size(2 * sizeof(uint64_t) + static_cast<size_t>(length)),
        buffer(std::make_shared_for_overwrite<std::byte[]>(size)),
        data(reinterpret_cast<char*>(buffer.get() + 2 * sizeof(uint64_t))) {
    const uint64_t offsets[2] = {0, length};
    std::memcpy(buffer.get(), offsets, sizeof(offsets));
  }
  Result<Tensor> tensor() && {
    std::byte* start = buffer.get();
    return Tensor::from_buffer(DType::kString, Shape{}, std::move(buffer), start, size);
  }
  size_t size;
  std::shared_ptr<std::byte[]> buffer;
  char* data;
};

}  // namespace

Result<std::unique_ptr<TFRecordReader>> TFRecordReader::open(const std::string& path,
                                                             Compression compression) {
  CAPSTAN_ASSIGN_OR_RETURN(auto stream, open_input(path, compression));
  return std::make_unique<TFRecordReader>(std::move(stream), path);
}

TFRecordReader::TFRecordReader(std::unique_ptr<InputStream> stream, std::string name)
    : stream_(std::move(stream)), name_(std::move(name)) {}

Status TFRecordReader::fail(Status status) {
  status_ = std::move(status);
  return status_;
}

Status TFRecordReader::corrupted(std::string_view why) {
  return fail(Status::DataLoss("corrupted record at offset " + std::to_string(offset_) + " in '" +
                               name_ + "': " + std::string(why)));
}

Status TFRecordReader::truncated(uint64_t missing_bytes) {
  return fail(Status::DataLoss("truncated record at offset " + std::to_string(offset_) + " in '" +
                               name_ + "' (expected " + std::to_string(missing_bytes) +
                               " more bytes)"));
}

Result<std::optional<uint64_t>> TFRecordReader::read_header() {
  using namespace tfrecord;
  if (!status_.ok()) return status_;
  char header[kHeaderBytes];
  auto got = read_bytes(header, kHeaderBytes);
  if (!got.ok()) return fail(got.status());
  if (*got == 0) return std::optional<uint64_t>();
  if (*got < kHeaderBytes) return truncated(kHeaderBytes - *got);
  const uint64_t length = decode_le64(header);
  if (crc32c_unmask(decode_le32(header + kLengthBytes)) != crc32c(header, kLengthBytes)) {
    return corrupted("length checksum mismatch");
  }
  // The length passed its CRC, so it is what the writer wrote (or the
  // file is damaged in a way no checksum can tell).
  if (length > kMaxRecordBytes) {
    return corrupted("record length " + std::to_string(length) + " exceeds the limit of " +
                     std::to_string(kMaxRecordBytes) + " bytes");
  }
  if (std::optional<uint64_t> size = stream_->size()) {
    const uint64_t needed = length + kFooterBytes;
    uint64_t remaining = *size - std::min(*size, offset_ + kHeaderBytes);
    if (needed > remaining) return truncated(needed - remaining);
  }
  return std::optional<uint64_t>(length);
}

Status TFRecordReader::read_data(char* out, uint64_t length) {
  auto got = read_bytes(out, static_cast<size_t>(length));
  if (!got.ok()) return fail(got.status());
  if (*got < length) return truncated(length - *got + tfrecord::kFooterBytes);
  return Status::Ok();
}

Status TFRecordReader::read_footer(const char* data, uint64_t length) {
  using namespace tfrecord;
  char footer[kFooterBytes];
  auto got = read_bytes(footer, kFooterBytes);
  if (!got.ok()) return fail(got.status());
  if (*got < kFooterBytes) return truncated(kFooterBytes - *got);
  if (crc32c_unmask(decode_le32(footer)) != crc32c(data, static_cast<size_t>(length))) {
    return corrupted("data checksum mismatch");
  }
  offset_ += kRecordOverheadBytes + length;
  return Status::Ok();
}

Status TFRecordReader::read_data_in_steps(std::string* record, uint64_t length) {
  // In steps, so that a length that passed its CRC but exceeds what a
  // compressed stream holds fails at the end of the data, not at
  // allocation.
  record->clear();
  size_t done = 0;
  while (done < length) {
    size_t step = static_cast<size_t>(std::min<uint64_t>(length - done, kDataStepBytes));
    record->resize(done + step);
    auto got = read_bytes(record->data() + done, step);
    if (!got.ok()) return fail(got.status());
    done += *got;
    if (*got < step) {
      record->resize(done);
      return truncated(length + tfrecord::kFooterBytes - done);
    }
  }
  return read_footer(record->data(), length);
}

Result<bool> TFRecordReader::read(std::string* record) {
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<uint64_t> length, read_header());
  if (!length) return false;
  CAPSTAN_RETURN_IF_ERROR(read_data_in_steps(record, *length));
  return true;
}

Result<size_t> TFRecordReader::read_bytes(void* out, size_t n) {
  const size_t buffered = std::min(n, end_ - pos_);
  if (buffered > 0) {
    std::memcpy(out, chunk_.get() + pos_, buffered);
    pos_ += buffered;
  }
  if (buffered == n) return n;
  CAPSTAN_ASSIGN_OR_RETURN(size_t got, read_fully(*stream_, static_cast<char*>(out) + buffered, n - buffered));
  return buffered + got;
}

Status TFRecordReader::fill_chunk(size_t n) {
  const size_t left = end_ - pos_;
  if (left >= n) return Status::Ok();
  if (!chunk_) chunk_ = std::make_unique_for_overwrite<std::byte[]>(kChunkBytes);
  if (left > 0) std::memmove(chunk_.get(), chunk_.get() + pos_, left);
  pos_ = 0;
  end_ = left;
  auto got = read_fully(*stream_, chunk_.get() + end_, kChunkBytes - end_);
  if (!got.ok()) return fail(got.status());
  end_ += *got;
  return Status::Ok();
}

Result<bool> TFRecordReader::read_tensor(Tensor* record) {
  using namespace tfrecord;
  if (!status_.ok()) return status_;
  if (stream_->size().has_value()) {
    // Plain file: parse the record in place when it fits a chunk.
    CAPSTAN_RETURN_IF_ERROR(fill_chunk(kHeaderBytes));
    if (end_ - pos_ >= kHeaderBytes) {
      const char* header = reinterpret_cast<const char*>(chunk_.get() + pos_);
      const uint64_t length = decode_le64(header);
      if (crc32c_unmask(decode_le32(header + kLengthBytes)) == crc32c(header, kLengthBytes) &&
          length <= kChunkBytes - kRecordOverheadBytes) {  // (length + overhead could wrap)
        const size_t record_bytes = kRecordOverheadBytes + static_cast<size_t>(length);
        CAPSTAN_RETURN_IF_ERROR(fill_chunk(record_bytes));
        if (end_ - pos_ >= record_bytes) {
          std::byte* data = chunk_.get() + pos_ + kHeaderBytes;
          if (crc32c_unmask(decode_le32(reinterpret_cast<const char*>(data) + length)) !=
              crc32c(reinterpret_cast<const char*>(data), static_cast<size_t>(length))) {
            return corrupted("data checksum mismatch");
          }
          // A kString scalar is offsets {0, length}, then the bytes, in a
          // buffer of its own: a tensor that points into the chunk would
          // keep the whole chunk alive (a shuffle buffer would hold many
          // chunks for a few records each).
          StringScalar scalar(length);
          std::memcpy(scalar.data, data, static_cast<size_t>(length));
          pos_ += record_bytes;
          offset_ += record_bytes;
          CAPSTAN_ASSIGN_OR_RETURN(*record, std::move(scalar).tensor());
          return true;
        }
      }
    }
    // The end of the file, a damaged header, a truncated or an oversized
    // record: the general path below says which (from the chunk's bytes).
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<uint64_t> length, read_header());
  if (!length) return false;
  // A stream of unknown size (GZIP) may promise more than it holds: a long
  // record is read in steps first (as read() does), then copied once.
  std::string stepped;
  const bool in_steps = *length > kDataStepBytes && !stream_->size();
  if (in_steps) CAPSTAN_RETURN_IF_ERROR(read_data_in_steps(&stepped, *length));
  StringScalar scalar(*length);
  if (in_steps) {
    std::memcpy(scalar.data, stepped.data(), stepped.size());
  } else {
    CAPSTAN_RETURN_IF_ERROR(read_data(scalar.data, *length));
    CAPSTAN_RETURN_IF_ERROR(read_footer(scalar.data, *length));
  }
  CAPSTAN_ASSIGN_OR_RETURN(*record, std::move(scalar).tensor());
  return true;
}

Result<std::unique_ptr<TFRecordWriter>> TFRecordWriter::open(const std::string& path,
                                                             Compression compression) {
  CAPSTAN_ASSIGN_OR_RETURN(auto stream, open_output(path, compression));
  return std::make_unique<TFRecordWriter>(std::move(stream));
}

TFRecordWriter::TFRecordWriter(std::unique_ptr<OutputStream> stream)
    : stream_(std::move(stream)) {}

Status TFRecordWriter::write(std::string_view record) {
  using namespace tfrecord;
  if (closed_) return Status::FailedPrecondition("write to a closed TFRecordWriter");
  if (record.size() > kMaxRecordBytes) {
    return Status::InvalidArgument("record of " + std::to_string(record.size()) +
                                   " bytes exceeds the TFRecord limit of " +
                                   std::to_string(kMaxRecordBytes) + " bytes");
  }
  char header[kHeaderBytes];
  encode_le64(record.size(), header);
  encode_le32(crc32c_mask(crc32c(header, kLengthBytes)), header + kLengthBytes);
  char footer[kFooterBytes];
  encode_le32(crc32c_mask(crc32c(record.data(), record.size())), footer);
  CAPSTAN_RETURN_IF_ERROR(stream_->write(header, kHeaderBytes));
  CAPSTAN_RETURN_IF_ERROR(stream_->write(record.data(), record.size()));
  return stream_->write(footer, kFooterBytes);
}

Status TFRecordWriter::close() {
  closed_ = true;
  return stream_->close();
}

}  // namespace capstan::data::io
