// The data dispatcher's write-ahead journal: an append-only log of opaque
// records (serialized state changes) in a directory of numbered segment
// files. The format, and what counts as a torn tail versus corruption, is in
// journal_format.h.
//
// The dispatcher replays the journal at start and then appends one record per
// state change, before applying it (TF's DataServiceDispatcherImpl::Apply):
//
//   CAPSTAN_ASSIGN_OR_RETURN(std::vector<std::string> records, journal::read_all(work_dir));
//   for (const std::string& r : records) CAPSTAN_RETURN_IF_ERROR(state.apply(r));
//   CAPSTAN_ASSIGN_OR_RETURN(auto writer, journal::JournalWriter::open(work_dir));
//   ...
//   CAPSTAN_RETURN_IF_ERROR(writer->append(update));  // durable once this returns
//   CAPSTAN_RETURN_IF_ERROR(state.apply(update));
//
// A kDataLoss from the reader or from JournalWriter::open means the journal
// is damaged somewhere other than its tail: the dispatcher must refuse to
// start rather than run with a state that silently lost changes.
//
// Both go through an io::FileSystem (the local one unless handed another;
// tests hand in io::MemoryFileSystem to fail fsyncs and simulate crashes),
// which must outlive them.
//
// Thread-safety: neither class is thread-safe; one thread uses each at a time.
// At most one JournalWriter may have a directory open (enforced with a lock on
// the directory; a second open fails with kFailedPrecondition).
#ifndef CAPSTAN_LIB_JOURNAL_JOURNAL_H_
#define CAPSTAN_LIB_JOURNAL_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "capstan/status.h"
#include "io/file_system.h"

namespace capstan::journal {

class JournalWriter {
 public:
  // Opens the journal in `dir` (creating the directory and its missing
  // parents if needed) and positions after the last good record: a torn tail
  // in the last segment is truncated away first. Returns kDataLoss when the
  // last segment is corrupted or a segment is missing (nothing is truncated
  // then). Only the last segment is scanned; replay with JournalReader to
  // check the others.
  //
  // sync: fsync each record before append() returns, and the directory
  // whenever a segment is created. With sync=false nothing is fsynced and a
  // machine crash may lose any suffix of the journal (even whole segments).
  //
  // max_segment_bytes: an append that would take a non-empty segment past
  // this size goes to a new segment instead (a single larger record gets a
  // segment of its own).
  static Result<std::unique_ptr<JournalWriter>> open(const std::string& dir, bool sync = true,
                                                     uint64_t max_segment_bytes = 64 << 20,
                                                     io::FileSystem& fs = io::local_file_system());

  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  // Appends one record and, when sync, fsyncs it before returning: OK means
  // the record will be replayed after a crash. A record over kMaxRecordBytes
  // is kInvalidArgument and changes nothing. Any write, fsync or
  // segment-creation failure breaks the writer (LevelDB's DBImpl::Write: the
  // data on disk is no longer known): that append returns the failure, and
  // every later one returns the same kFailedPrecondition naming it. Reopen
  // the journal (i.e. restart) to recover.
  Status append(std::string_view record);
  // Appends `records` in order with one fsync for all of them (group
  // commit): OK means every one will be replayed. Failures as append()'s; a
  // failure may leave any prefix of them written.
  Status append_batch(const std::vector<std::string>& records);

  // Records appended through this writer since open().
  uint64_t records_written() const { return records_written_; }

 private:
  JournalWriter(io::FileSystem& fs, std::string dir, bool sync, uint64_t max_segment_bytes,
                std::unique_ptr<io::DirectoryLock> dir_lock);

  // Closes the current segment (if any) and creates segment `number`.
  Status start_segment(uint64_t number);
  // Records `failure` as the first failure and returns it.
  Status fail(Status failure);
  // Writes one record without fsyncing it.
  Status write_record(std::string_view record);

  // Constant after open().
  io::FileSystem& fs_;
  const std::string dir_;  // fsynced when a segment is created
  const bool sync_;
  const uint64_t max_segment_bytes_;
  const std::unique_ptr<io::DirectoryLock> dir_lock_;

  std::unique_ptr<io::WritableFile> segment_;  // null before the first segment
  uint64_t segment_number_ = 0;
  std::string segment_path_;
  uint64_t segment_bytes_ = 0;  // Bytes in the current segment: where the next record goes.
  uint64_t records_written_ = 0;
  Status broken_;  // The first failure; OK while the writer is usable.
};

class JournalReader {
 public:
  // Opens the journal in `dir`. A missing or empty directory is a journal with
  // no records. Returns kDataLoss when a segment number is missing.
  static Result<std::unique_ptr<JournalReader>> open(const std::string& dir,
                                                     io::FileSystem& fs = io::local_file_system());

  ~JournalReader();
  JournalReader(const JournalReader&) = delete;
  JournalReader& operator=(const JournalReader&) = delete;

  // Stores the next record in *record and returns true, or returns false at
  // the end of the log (clean, or a torn tail: see dropped_tail_bytes()).
  // Corruption is kDataLoss "journal corrupted at <file>:<offset>: <why>",
  // where offset is that of the bad record; I/O failures carry their errno.
  // Errors are sticky: every later call returns the same one.
  Result<bool> read(std::string* record);

  // Bytes of the torn record dropped at the end of the last segment (0 when
  // the log ended cleanly or has not been read to the end yet).
  uint64_t dropped_tail_bytes() const { return dropped_tail_bytes_; }

 private:
  JournalReader(io::FileSystem& fs, std::string dir, std::vector<uint64_t> segments);

  // Opens segments_[next_segment_], making it current.
  Status open_next_segment();

  // Constant after open().
  io::FileSystem& fs_;
  const std::string dir_;
  const std::vector<uint64_t> segments_;  // Segment numbers, ascending, no gaps.

  size_t next_segment_ = 0;  // Index in segments_ of the segment to open next.
  std::unique_ptr<io::RandomAccessFile> segment_;  // null between segments
  std::string segment_path_;
  uint64_t segment_size_ = 0;
  uint64_t offset_ = 0;  // Of the next record in the current segment.
  bool done_ = false;
  Status error_;
  uint64_t dropped_tail_bytes_ = 0;
};

// Reads every record of the journal in `dir`, in order (the dispatcher's
// replay at start). A torn tail ends the log silently; corruption is
// kDataLoss as for JournalReader::read().
Result<std::vector<std::string>> read_all(const std::string& dir, io::FileSystem& fs = io::local_file_system());

}  // namespace capstan::journal

#endif  // CAPSTAN_LIB_JOURNAL_JOURNAL_H_
