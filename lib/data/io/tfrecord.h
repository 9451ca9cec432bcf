// TFRecord files: reading and writing sequences of binary records in
// TensorFlow's format (see record_format.h), optionally GZIP-compressed.
//
//   CAPSTAN_ASSIGN_OR_RETURN(auto writer, TFRecordWriter::open(path, Compression::kNone));
//   CAPSTAN_RETURN_IF_ERROR(writer->write(example_bytes));
//   CAPSTAN_RETURN_IF_ERROR(writer->close());
//
//   CAPSTAN_ASSIGN_OR_RETURN(auto reader, TFRecordReader::open(path, Compression::kNone));
//   std::string record;
//   while (true) {
//     CAPSTAN_ASSIGN_OR_RETURN(bool more, reader->read(&record));
//     if (!more) break;
//     ...
//   }
//
// Unlike LevelDB's log reader, which treats a half-written tail as the end
// of the log, a TFRecordReader reports every damaged or incomplete record:
// a TFRecord file is a finished data set, and a silently shorter one would
// train on less data without anyone knowing.
//
// Thread-safety: neither class is thread-safe; one thread uses each at a time.
#ifndef CAPSTAN_LIB_DATA_IO_TFRECORD_H_
#define CAPSTAN_LIB_DATA_IO_TFRECORD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "data/io/file.h"

namespace capstan::data::io {

class TFRecordReader {
 public:
  static Result<std::unique_ptr<TFRecordReader>> open(const std::string& path,
                                                      Compression compression);

  // Reads records from `stream`, which must be at its start (offsets count
  // from there), naming `name` in error messages.
  TFRecordReader(std::unique_ptr<InputStream> stream, std::string name);

  // Stores the next record in *record and returns true, or returns false at
  // the clean end of the file (after the last complete record). Errors are
  // kDataLoss naming the file and the offset of the bad record:
  //   "corrupted record at offset 120 in 'f': length checksum mismatch"
  //   "corrupted record at offset 120 in 'f': data checksum mismatch"
  //   "corrupted record at offset 120 in 'f': length 9000000000 exceeds ..."
  //   "truncated record at offset 120 in 'f' (expected 7 more bytes)"
  // or the stream's own error (I/O, corrupt gzip). Errors are sticky: every
  // later call returns the same one.
  Result<bool> read(std::string* record);

  // The same, into a kString scalar tensor (what the tf.data source uses),
  // whose one buffer is allocated at the record's size. From a plain file,
  // records are read 1-2 MiB at a time into a chunk and checked there, then
  // copied once into their tensor (a tensor pointing into the chunk would
  // keep all of it alive: a shuffle buffer would hold many chunks for a few
  // records each). Records that do not fit a chunk, and compressed streams,
  // are read straight from the stream into their tensor.
  Result<bool> read_tensor(Tensor* record);

  // The offset, in the uncompressed stream, of the next record to read (of
  // the bad record after an error).
  uint64_t offset() const { return offset_; }

 private:
  // Reads and checks the header: the record's length, or nullopt at the
  // clean end of the file.
  Result<std::optional<uint64_t>> read_header();
  // Reads the record's `length` bytes of data into `out`.
  Status read_data(char* out, uint64_t length);
  // The same into `record`, growing it in steps, then the footer.
  Status read_data_in_steps(std::string* record, uint64_t length);
  // Reads the footer and checks the data's checksum.
  Status read_footer(const char* data, uint64_t length);
  Status fail(Status status);
  Status corrupted(std::string_view why);
  Status truncated(uint64_t missing_bytes);
  // Up to n bytes: first what the chunk holds, then from the stream.
  Result<size_t> read_bytes(void* out, size_t n);
  // Makes the chunk hold at least `n` bytes from pos_ (fewer only at the
  // end of the stream): the rest moves to its front, then it is filled.
  Status fill_chunk(size_t n);

  // Plain files (size known): records are parsed in place from chunk_.
  // Twice the stream's own buffer, so that a refill (at least 1 MiB unless
  // a long record is left over) bypasses that buffer: one copy, by read(2).
  static constexpr size_t kChunkBytes = size_t{2} << 20;
  std::unique_ptr<std::byte[]> chunk_;
  size_t pos_ = 0;  // next unread byte in chunk_
  size_t end_ = 0;  // end of the bytes read into chunk_

  std::unique_ptr<InputStream> stream_;
  const std::string name_;
  uint64_t offset_ = 0;
  Status status_;
};

class TFRecordWriter {
 public:
  // Creates or truncates `path`.
  static Result<std::unique_ptr<TFRecordWriter>> open(const std::string& path,
                                                      Compression compression);

  explicit TFRecordWriter(std::unique_ptr<OutputStream> stream);

  // Appends one record. kInvalidArgument for a record larger than
  // tfrecord::kMaxRecordBytes; kFailedPrecondition after close(); the
  // stream's error (sticky) when writing fails.
  Status write(std::string_view record);

  // Flushes and closes the file; its result says whether every record
  // reached the file. The destructor closes too, dropping the result.
  Status close();

 private:
  std::unique_ptr<OutputStream> stream_;
  bool closed_ = false;
};

}  // namespace capstan::data::io

#endif  // CAPSTAN_LIB_DATA_IO_TFRECORD_H_
