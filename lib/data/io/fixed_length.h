// FixedLengthRecordReader: the records of a binary file made of a header,
// records of a fixed size, and a footer, with
// tf.data.FixedLengthRecordDataset's semantics:
//
//   [header_bytes][record_bytes][record_bytes]...[record_bytes][footer_bytes]
//
// The header and footer are skipped. When the body (file minus header and
// footer) is not a whole number of records, TensorFlow fails rather than
// dropping or padding the remainder, and so does this reader:
//   - uncompressed: open() returns kInvalidArgument before any record
//     ("... has body length 10 bytes, which is not an exact multiple of the
//     record length (4 bytes)"), as TF does when it moves to the file;
//   - GZIP (size unknown until the end): the complete records are returned,
//     then read() returns kDataLoss with the same message, as TF does.
// A file shorter than header + footer is the same error (TF's unsigned
// arithmetic makes that case accidental; here it is explicit).
//
// Thread-safety: not thread-safe; one thread uses a reader at a time.
#ifndef CAPSTAN_LIB_DATA_IO_FIXED_LENGTH_H_
#define CAPSTAN_LIB_DATA_IO_FIXED_LENGTH_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "capstan/status.h"
#include "data/io/file.h"

namespace capstan::data::io {

class FixedLengthRecordReader {
 public:
  // kInvalidArgument when record_bytes <= 0, header_bytes < 0 or
  // footer_bytes < 0 (TF's checks), or for an uncompressed file whose body
  // is not a multiple of record_bytes.
  static Result<std::unique_ptr<FixedLengthRecordReader>> open(const std::string& path,
                                                               int64_t record_bytes,
                                                               int64_t header_bytes,
                                                               int64_t footer_bytes,
                                                               Compression compression);

  // Stores the next record (record_bytes long) in *record and returns true,
  // or returns false after the last one. Errors are sticky.
  Result<bool> read(std::string* record);

 private:
  FixedLengthRecordReader(std::unique_ptr<InputStream> stream, std::string path,
                          uint64_t record_bytes, uint64_t header_bytes, uint64_t footer_bytes);
  // Skips the header; for GZIP also fills the footer lookahead.
  Status start();
  Status fail(Status status);
  // TensorFlow's message for a body that is not a whole number of records.
  std::string remainder_message(uint64_t body_bytes) const;

  std::unique_ptr<InputStream> stream_;
  const std::string path_;
  const uint64_t record_bytes_;
  const uint64_t header_bytes_;
  const uint64_t footer_bytes_;
  // Uncompressed: records left to read, known from the file size.
  std::optional<uint64_t> records_left_;
  // GZIP: the last footer_bytes_ bytes read, which are the footer if the
  // stream ends now. A record is returned only once footer_bytes_ more bytes
  // follow it.
  std::string lookahead_;
  std::string block_;  // scratch for GZIP reads
  Status status_;
};

}  // namespace capstan::data::io

#endif  // CAPSTAN_LIB_DATA_IO_FIXED_LENGTH_H_
