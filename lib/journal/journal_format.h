// The write-ahead journal's on-disk format, shared by JournalWriter and
// JournalReader (cf. LevelDB's db/log_format.h). Everything a reader or a
// writer must agree on is defined here and nowhere else.
//
// Segments. A journal is a directory holding numbered segment files
//
//   journal-000001.log  journal-000002.log  ...
//
// (kSegmentPrefix, six or more decimal digits, kSegmentSuffix; see
// segment_file_name()). Numbering starts at 1 and has no gaps; the log is the
// concatenation of the segments in numeric order. Other files in the
// directory are ignored, so the journal may share a work_dir.
//
// Records. A segment is a sequence of records and nothing else (no file
// header, no padding, no blocks). Each record is:
//
//   offset  size    field
//   0       4       crc     uint32 LE: crc32c_mask(crc32c(length bytes ++ payload))
//   4       4       length  uint32 LE: bytes of payload
//   8       length  payload
//
// so a record occupies kHeaderBytes + length bytes. The checksum covers the
// length field too, so a damaged length is caught whenever its record lies
// wholly inside the file. Example: the record "abc" is the 11 bytes
//   01 95 73 aa  03 00 00 00  61 62 63
//
// Damage. Records are appended one write() each and the file is fsynced
// after each, so a crash can leave at most the last record of the last
// segment incomplete. The reader therefore classifies damage as:
//
//   torn tail (end of the log, not an error) -- only in the LAST segment:
//     - fewer than kHeaderBytes bytes left (header cut short);
//     - a header whose payload runs past the end of the file (payload cut
//       short);
//     - a checksum mismatch on a record that ends exactly at the end of the
//       file, or after which every remaining byte is zero (a file system that
//       extended the file before the data reached the disk);
//     - a length above kMaxRecordBytes in a header that is the last thing in
//       the file.
//     The reader stops there and reports the dropped byte count; the writer
//     truncates the segment to the last good record before appending.
//
//   corruption (kDataLoss, "journal corrupted at <file>:<offset>: <why>") --
//     anything else: a checksum mismatch or a length above kMaxRecordBytes
//     with more data after it, or any incomplete or bad record in a segment
//     that is not the last. A missing segment number is also kDataLoss.
//
// Known limit: a damaged length field in the last segment that points past
// the end of the file (but not above kMaxRecordBytes) cannot be told from a
// torn write, and is read as one.
#ifndef CAPSTAN_LIB_JOURNAL_JOURNAL_FORMAT_H_
#define CAPSTAN_LIB_JOURNAL_JOURNAL_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace capstan::journal {

constexpr size_t kCrcBytes = 4;
constexpr size_t kLengthBytes = 4;
constexpr size_t kHeaderBytes = kCrcBytes + kLengthBytes;  // 8

// The largest payload written or accepted: 64 MiB. Dispatcher state changes
// are a few hundred bytes; a length beyond this is treated as corruption
// rather than allocated.
constexpr uint32_t kMaxRecordBytes = uint32_t{64} << 20;

constexpr std::string_view kSegmentPrefix = "journal-";
constexpr std::string_view kSegmentSuffix = ".log";
constexpr uint64_t kFirstSegmentNumber = 1;

// "journal-000042.log" for 42.
inline std::string segment_file_name(uint64_t number) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%06llu", static_cast<unsigned long long>(number));
  std::string name(kSegmentPrefix);
  name += digits;
  name += kSegmentSuffix;
  return name;
}

}  // namespace capstan::journal

#endif  // CAPSTAN_LIB_JOURNAL_JOURNAL_FORMAT_H_
