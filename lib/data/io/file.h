// Byte streams over local files, optionally GZIP-compressed: the layer the
// tf.data file sources (TFRecord, text lines, fixed-length records) read and
// write through.
//
//   CAPSTAN_ASSIGN_OR_RETURN(auto in, open_input("part-0.gz", Compression::kGzip));
//   char buf[4096];
//   CAPSTAN_ASSIGN_OR_RETURN(size_t n, in->read(buf, sizeof(buf)));  // 0 at end
//
// Errors name the path and carry the code the caller should act on:
// kNotFound (no such file), kPermissionDenied, kDataLoss (I/O error, corrupt
// or truncated GZIP data), kResourceExhausted (disk full, too many open
// files), kFailedPrecondition (the path is a directory).
//
// Thread-safety: a stream is not thread-safe; one thread uses it at a time.
// The free functions may be called from any thread.
#ifndef CAPSTAN_LIB_DATA_IO_FILE_H_
#define CAPSTAN_LIB_DATA_IO_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"

namespace capstan::data::io {

// TensorFlow's compression_type: "" or "NONE", and "GZIP" (a gzip file,
// possibly several concatenated members, as `gzip` and TF's writers make).
enum class Compression { kNone, kGzip };

// "", "NONE", "GZIP" in any case; nullopt for anything else (TF's "ZLIB" is
// not supported).
std::optional<Compression> compression_from_name(std::string_view name);
// "NONE" or "GZIP".
std::string_view compression_name(Compression compression);

// A Status for the failed system call that set `error_number`: the project's
// one table, capstan::io::errno_to_status (io/durable_file.h).
Status status_from_errno(int error_number, std::string_view context);

class InputStream {
 public:
  virtual ~InputStream();

  // Reads up to n bytes into buf and returns how many it read: at least one
  // when n > 0 and data remains, 0 at the end. After an error every later
  // call returns the same error.
  virtual Result<size_t> read(void* buf, size_t n) = 0;

  // Bytes of (uncompressed) data returned so far.
  virtual uint64_t position() const = 0;

  // The total bytes the stream yields, where known before reading it (plain
  // regular files); nullopt for compressed streams. Readers use it to reject
  // impossible record lengths without allocating.
  virtual std::optional<uint64_t> size() const { return std::nullopt; }
};

// Reads until n bytes or the end of the stream; returns the count read
// (less than n only at the end).
Result<size_t> read_fully(InputStream& stream, void* buf, size_t n);

// Opens `path` for sequential reading. A GZIP stream checks each member's
// CRC and length trailer; a zero-byte file reads as empty.
Result<std::unique_ptr<InputStream>> open_input(const std::string& path,
                                                Compression compression);

class OutputStream {
 public:
  // Closes the file if close() was not called, dropping any error: call
  // close() to learn whether the data reached the file.
  virtual ~OutputStream();

  // Appends n bytes (buffered). After an error every later call returns the
  // same error.
  virtual Status write(const void* data, size_t n) = 0;

  // Flushes buffered data (and finishes the GZIP stream) and closes the
  // file. Does not fsync. write() after close() is kFailedPrecondition;
  // a second close() is a no-op returning the first one's result.
  virtual Status close() = 0;
};

// Creates or truncates `path` for writing (GZIP: one gzip member).
Result<std::unique_ptr<OutputStream>> open_output(const std::string& path,
                                                  Compression compression);

// The paths that the glob(3) pattern matches, sorted bytewise. A pattern
// that matches nothing gives an empty vector; the caller decides whether
// that is an error. kInvalidArgument for an empty or malformed pattern
// (unterminated '[', trailing '\'); an unreadable directory on the way is
// an error rather than silently skipped.
Result<std::vector<std::string>> match_files(const std::string& pattern);

}  // namespace capstan::data::io

#endif  // CAPSTAN_LIB_DATA_IO_FILE_H_
