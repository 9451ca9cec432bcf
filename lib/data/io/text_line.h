// TextLineReader: the lines of a text file, with tf.data.TextLineDataset's
// semantics (TensorFlow's io::BufferedInputStream::ReadLine):
//   - lines end at '\n'; the '\n' is not part of the line;
//   - every '\r' is dropped, not only a trailing one ("a\r\n" and "a\rb\n"
//     give "a" and "ab"), as TensorFlow does;
//   - a last line without '\n' is returned unless it is empty after dropping
//     '\r' ("a\nb" gives "a", "b"; "a\n" and "a\n\r" give just "a");
//   - an empty file gives no lines; an empty line in the middle gives "".
//
//   CAPSTAN_ASSIGN_OR_RETURN(auto lines, TextLineReader::open("adult.data", Compression::kNone));
//   std::string line;
//   while (true) {
//     CAPSTAN_ASSIGN_OR_RETURN(bool more, lines->read(&line));
//     if (!more) break;
//   }
//
// Thread-safety: not thread-safe; one thread uses a reader at a time.
#ifndef CAPSTAN_LIB_DATA_IO_TEXT_LINE_H_
#define CAPSTAN_LIB_DATA_IO_TEXT_LINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "capstan/status.h"
#include "data/io/file.h"

namespace capstan::data::io {

class TextLineReader {
 public:
  static Result<std::unique_ptr<TextLineReader>> open(const std::string& path,
                                                      Compression compression);

  explicit TextLineReader(std::unique_ptr<InputStream> stream);

  // Stores the next line in *line and returns true, or returns false at the
  // end. Errors are the stream's (I/O, corrupt gzip) and are sticky.
  Result<bool> read(std::string* line);

 private:
  // Appends the next block of the stream to buffer_; false at its end.
  Result<bool> fill();

  std::unique_ptr<InputStream> stream_;
  std::string buffer_;  // bytes read from stream_; buffer_[begin_, end) unread
  size_t begin_ = 0;
  bool at_end_ = false;
  Status status_;
};

}  // namespace capstan::data::io

#endif  // CAPSTAN_LIB_DATA_IO_TEXT_LINE_H_
