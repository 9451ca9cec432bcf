// tf.io.TFRecordWriter: writes TFRecord files that TensorFlow reads (and
// that Dataset::tfrecord_dataset reads back).
//
//   auto writer = capstan::data::TFRecordWriter::open("train-00000.tfrecord.gz",
//                                                     capstan::data::Compression::kGzip).value();
//   for (const std::string& example : serialized_examples) writer->write(example);
//   capstan::Status closed = writer->close();   // did every record reach the file?
//
// Each record is framed as TensorFlow frames it: its length (uint64, little
// endian), the masked CRC32C of the length, the bytes, the masked CRC32C of
// the bytes. With Compression::kGzip the whole file is one GZIP stream, as
// tf.io.TFRecordOptions(compression_type="GZIP") writes it.
//
// Thread-safety: one writer is used by one thread at a time.
#ifndef CAPSTAN_DATA_TFRECORD_H_
#define CAPSTAN_DATA_TFRECORD_H_

#include "capstan/export.h"

#include <memory>
#include <string>
#include <string_view>

#include "capstan/data/dataset.h"
#include "capstan/status.h"

namespace capstan CAPSTAN_API {
namespace data {

class TFRecordWriter {
 public:
  // Creates or truncates `path`. Errors name the path (NotFound for a
  // missing directory, PermissionDenied, ...).
  static Result<std::unique_ptr<TFRecordWriter>> open(const std::string& path,
                                                      Compression compression = Compression::kNone);
  // Closes the file if close() was not called (its result is then lost).
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  // Appends one record. InvalidArgument for a record over TensorFlow's
  // limit; FailedPrecondition after close(); a write error sticks.
  Status write(std::string_view record);
  // Flushes and closes the file: OK when every record reached it.
  Status close();

 private:
  struct CAPSTAN_HIDDEN Impl;
  explicit TFRecordWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace data
}  // namespace capstan

#endif  // CAPSTAN_DATA_TFRECORD_H_
