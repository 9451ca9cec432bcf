// The TFRecord file format, shared by TFRecordReader and TFRecordWriter
// (cf. LevelDB's db/log_format.h). Byte-compatible with TensorFlow's
// tf.io.TFRecordWriter and tf.data.TFRecordDataset.
//
// A file is a sequence of records and nothing else (no file header, no
// padding). Each record is:
//
//   offset  size      field
//   0       8         length       uint64, little endian: bytes of data
//   8       4         length_crc   uint32 LE: crc32c_mask(crc32c(length bytes))
//   12      length    data
//   12+len  4         data_crc     uint32 LE: crc32c_mask(crc32c(data))
//
// so a record occupies kRecordOverheadBytes + length bytes. With GZIP the
// whole file (all records) is one gzip stream; offsets count uncompressed
// bytes.
//
// Example: the record "The Quick Brown Fox" (19 bytes) is the 35 bytes
//   13 00 00 00 00 00 00 00  0c 91 32 1b  "The Quick Brown Fox"  18 0d e8 3a
#ifndef CAPSTAN_LIB_DATA_IO_RECORD_FORMAT_H_
#define CAPSTAN_LIB_DATA_IO_RECORD_FORMAT_H_

#include <cstddef>
#include <cstdint>

namespace capstan::data::io::tfrecord {

constexpr size_t kLengthBytes = 8;
constexpr size_t kLengthCrcBytes = 4;
constexpr size_t kHeaderBytes = kLengthBytes + kLengthCrcBytes;  // 12
constexpr size_t kFooterBytes = 4;                                // data_crc
constexpr size_t kRecordOverheadBytes = kHeaderBytes + kFooterBytes;  // 16

// The largest record Capstan writes or reads: 2 GiB, protobuf's limit for a
// serialized message (a tf.train.Example). A length beyond it, even with a
// matching length_crc, is treated as corruption rather than allocated.
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 31;

}  // namespace capstan::data::io::tfrecord

#endif  // CAPSTAN_LIB_DATA_IO_RECORD_FORMAT_H_
