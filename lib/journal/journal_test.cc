#include "journal/journal.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/memory_file_system.h"
#include "io/testing.h"
#include "journal/journal_format.h"

namespace capstan::journal {
namespace {

namespace fs = std::filesystem;

// A scratch directory for a journal.
class TempDir : public io::testing::TempDir {
 public:
  TempDir() : io::testing::TempDir("journal_test") {}
  std::string journal() const { return file("journal"); }
};

std::string segment(const std::string& dir, uint64_t number) {
  return dir + "/" + segment_file_name(number);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  REQUIRE(out);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out);
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::string bytes = read_file(path);
  REQUIRE(offset < bytes.size());
  bytes[offset] = static_cast<char>(bytes[offset] ^ 0x40);
  write_file(path, bytes);
}

void put_le32(const std::string& path, uint64_t offset, uint32_t value) {
  std::string bytes = read_file(path);
  REQUIRE(offset + 4 <= bytes.size());
  for (int i = 0; i < 4; ++i) bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
  write_file(path, bytes);
}

size_t count_segments(const std::string& dir) {
  size_t n = 0;
  while (fs::exists(segment(dir, n + 1))) ++n;
  return n;
}

// Writes `records` to a journal in `dir` through one writer.
void write_records(const std::string& dir, const std::vector<std::string>& records,
                   uint64_t max_segment_bytes = 64 << 20, bool sync = true) {
  auto writer = JournalWriter::open(dir, sync, max_segment_bytes);
  REQUIRE(writer.ok());
  for (const std::string& r : records) REQUIRE((*writer)->append(r).ok());
  REQUIRE((*writer)->records_written() == records.size());
}

// "record 7 ....." of a length that varies with i (sometimes empty).
std::string make_record(int i) {
  if (i % 17 == 0) return "";
  std::string r = "record " + std::to_string(i) + " ";
  r.append(static_cast<size_t>((i * 37) % 150), static_cast<char>('a' + i % 26));
  return r;
}

std::vector<std::string> three_records() { return {"first record", "second record", "third record"}; }

// The offset of record `index` in a segment holding `records` in order.
uint64_t offset_of(const std::vector<std::string>& records, size_t index) {
  uint64_t offset = 0;
  for (size_t i = 0; i < index; ++i) offset += kHeaderBytes + records[i].size();
  return offset;
}

// Expects kDataLoss from read_all with every fragment in the message.
void require_data_loss(const std::string& dir, const std::vector<std::string>& fragments) {
  auto records = read_all(dir);
  REQUIRE_FALSE(records.ok());
  INFO(records.status().to_string());
  REQUIRE(records.status().code() == StatusCode::kDataLoss);
  for (const std::string& f : fragments) CHECK(records.status().message().find(f) != std::string::npos);
}

// Reads the journal in `dir` back: expects `records`, then its end, having
// dropped a torn tail of `dropped` bytes. Returns the reader, at its end.
std::unique_ptr<JournalReader> require_records(const std::string& dir, const std::vector<std::string>& records,
                                               uint64_t dropped) {
  auto reader = JournalReader::open(dir);
  REQUIRE(reader.ok());
  std::string record;
  for (const std::string& expected : records) {
    auto more = (*reader)->read(&record);
    REQUIRE(more.ok());
    REQUIRE(*more);
    REQUIRE(record == expected);
  }
  auto more = (*reader)->read(&record);
  REQUIRE(more.ok());
  CHECK_FALSE(*more);
  CHECK((*reader)->dropped_tail_bytes() == dropped);
  return *std::move(reader);
}

// A journal of three_records() in one segment, `path`.
struct ThreeRecords {
  ThreeRecords() { write_records(tmp.journal(), records); }
  TempDir tmp;
  const std::vector<std::string> records = three_records();
  const std::string path = segment(tmp.journal(), 1);
};

// A journal of 30 records ("record number 1" ...) across at least three
// segments of 128 bytes.
struct ThirtyRecords {
  ThirtyRecords() {
    for (int i = 1; i <= 30; ++i) records.push_back("record number " + std::to_string(i));
    write_records(tmp.journal(), records, /*max_segment_bytes=*/128);
    REQUIRE(count_segments(tmp.journal()) >= 3);
  }
  TempDir tmp;
  std::vector<std::string> records;
};

TEST_CASE("journal_format: a record is masked crc, little-endian length, payload") {
  TempDir tmp;
  write_records(tmp.journal(), {"abc"});
  const std::string bytes = read_file(segment(tmp.journal(), 1));
  // The example in journal_format.h.
  const std::string expected("\x01\x95\x73\xaa\x03\x00\x00\x00" "abc", 11);
  CHECK(bytes == expected);
  CHECK(segment_file_name(1) == "journal-000001.log");
  CHECK(segment_file_name(42) == "journal-000042.log");
  CHECK(segment_file_name(1234567) == "journal-1234567.log");
}

TEST_CASE("journal: many records round trip across several segments") {
  TempDir tmp;
  std::vector<std::string> records;
  for (int i = 0; i < 1000; ++i) records.push_back(make_record(i));
  write_records(tmp.journal(), records, /*max_segment_bytes=*/1024);

  size_t segments = count_segments(tmp.journal());
  CHECK(segments > 10);
  for (size_t n = 1; n <= segments; ++n) CHECK(fs::file_size(segment(tmp.journal(), n)) <= 1024);

  auto reader = require_records(tmp.journal(), records, 0);
  // The end is sticky.
  std::string record;
  auto more = reader->read(&record);
  REQUIRE(more.ok());
  CHECK_FALSE(*more);
}

TEST_CASE("journal: a batch is appended in order, across segments, and replays with single records") {
  TempDir dir;
  {
    auto writer = JournalWriter::open(dir.journal(), /*sync=*/true, /*max_segment_bytes=*/100);
    REQUIRE(writer.ok());
    REQUIRE((*writer)->append("first").ok());
    std::vector<std::string> batch;
    for (int i = 0; i < 12; ++i) batch.push_back("batch-" + std::to_string(i) + std::string(20, 'x'));
    REQUIRE((*writer)->append_batch(batch).ok());
    REQUIRE((*writer)->append_batch({}).ok());
    REQUIRE((*writer)->append("last").ok());
    CHECK((*writer)->records_written() == 14);
  }
  auto records = read_all(dir.journal());
  REQUIRE(records.ok());
  REQUIRE(records->size() == 14);
  CHECK(records->front() == "first");
  CHECK((*records)[5] == "batch-4" + std::string(20, 'x'));
  CHECK(records->back() == "last");
}

TEST_CASE("journal: append_batch costs one fsync for the whole batch") {
  io::MemoryFileSystem fs;
  auto writer = JournalWriter::open("/j", /*sync=*/true, 64 << 20, fs);
  REQUIRE(writer.ok());
  const int64_t before = fs.file_syncs();
  REQUIRE((*writer)->append_batch({"a", "b", "c", "d"}).ok());
  CHECK(fs.file_syncs() == before + 1);
  REQUIRE((*writer)->append("e").ok());
  CHECK(fs.file_syncs() == before + 2);
}

TEST_CASE("journal: a failed fsync in a batch breaks the writer, as for one record") {
  io::MemoryFileSystem fs;
  auto writer = JournalWriter::open("/j", /*sync=*/true, 64 << 20, fs);
  REQUIRE(writer.ok());
  fs.fail_next_sync(Status::Unknown("disk gone"));
  Status failure = (*writer)->append_batch({"a", "b"});
  CHECK(failure.code() == StatusCode::kUnknown);
  CHECK(failure.message().find("disk gone") != std::string::npos);
  CHECK((*writer)->append("c").code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("journal: a record larger than max_segment_bytes gets a segment of its own") {
  TempDir tmp;
  const std::vector<std::string> records = {"small", std::string(500, 'x'), "after"};
  write_records(tmp.journal(), records, /*max_segment_bytes=*/100);
  CHECK(count_segments(tmp.journal()) == 3);
  CHECK(fs::file_size(segment(tmp.journal(), 2)) == kHeaderBytes + 500);
  auto all = read_all(tmp.journal());
  REQUIRE(all.ok());
  CHECK(*all == records);
}

TEST_CASE("journal: a missing directory is an empty journal") {
  TempDir tmp;
  auto all = read_all(tmp.path() + "/does/not/exist");
  REQUIRE(all.ok());
  CHECK(all->empty());
}

TEST_CASE("journal: an empty directory is an empty journal") {
  TempDir tmp;
  require_records(tmp.path(), {}, 0);
}

TEST_CASE("journal: a new writer creates the directory and one empty segment") {
  TempDir tmp;
  const std::string dir = tmp.path() + "/a/b/journal";
  auto writer = JournalWriter::open(dir);
  REQUIRE(writer.ok());
  CHECK((*writer)->records_written() == 0);
  CHECK(fs::is_directory(dir));
  CHECK(fs::file_size(segment(dir, 1)) == 0);
  auto all = read_all(dir);
  REQUIRE(all.ok());
  CHECK(all->empty());
}

TEST_CASE("journal: files that are not canonical segment names are ignored") {
  TempDir tmp;
  write_records(tmp.journal(), {"one", "two"});
  write_file(tmp.journal() + "/journal-2.log", "garbage");
  write_file(tmp.journal() + "/journal-000002.log.tmp", "garbage");
  write_file(tmp.journal() + "/journal-00000x.log", "garbage");
  write_file(tmp.journal() + "/notes.txt", "garbage");
  auto all = read_all(tmp.journal());
  REQUIRE(all.ok());
  CHECK(*all == std::vector<std::string>{"one", "two"});
}

TEST_CASE_METHOD(ThreeRecords, "journal: a cut at every byte of the last record is a torn tail") {
  const std::string whole = read_file(path);
  const uint64_t start = offset_of(records, 2);
  REQUIRE(whole.size() == start + kHeaderBytes + records[2].size());

  for (uint64_t cut = start; cut < whole.size(); ++cut) {
    INFO("cut at " << cut);
    write_file(path, whole.substr(0, cut));
    require_records(tmp.journal(), {records[0], records[1]}, cut - start);
  }
}

TEST_CASE("journal: a torn tail in the last of several segments ends the log") {
  TempDir tmp;
  std::vector<std::string> records;
  for (int i = 1; i <= 50; ++i) records.push_back(make_record(i));
  write_records(tmp.journal(), records, /*max_segment_bytes=*/256);
  const size_t segments = count_segments(tmp.journal());
  REQUIRE(segments >= 3);
  const std::string last = segment(tmp.journal(), segments);
  const uint64_t size = fs::file_size(last);
  fs::resize_file(last, size - 1);

  auto all = read_all(tmp.journal());
  REQUIRE(all.ok());
  records.pop_back();
  CHECK(*all == records);
}

TEST_CASE_METHOD(ThreeRecords, "journal: a checksum mismatch in the record that ends the file is a torn tail") {
  flip_byte(path, offset_of(records, 2) + kHeaderBytes + 3);
  require_records(tmp.journal(), {records[0], records[1]}, kHeaderBytes + records[2].size());
}

TEST_CASE_METHOD(ThreeRecords, "journal: a zero-filled tail is a torn tail") {
  write_file(path, read_file(path) + std::string(100, '\0'));
  require_records(tmp.journal(), records, 100);
}

TEST_CASE_METHOD(ThreeRecords, "journal: an impossible length in a header that ends the file is a torn tail") {
  write_file(path, read_file(path) + std::string("\x01\x02\x03\x04\xff\xff\xff\xff", 8));

  auto all = read_all(tmp.journal());
  REQUIRE(all.ok());
  CHECK(*all == records);
}

TEST_CASE_METHOD(ThreeRecords, "journal: a writer reopened after a torn tail truncates it and appends") {
  const uint64_t good = offset_of(records, 2);
  fs::resize_file(path, good + 5);

  {
    auto writer = JournalWriter::open(tmp.journal());
    REQUIRE(writer.ok());
    CHECK(fs::file_size(path) == good);
    REQUIRE((*writer)->append("fourth").ok());
    REQUIRE((*writer)->append("fifth").ok());
    CHECK((*writer)->records_written() == 2);
  }
  require_records(tmp.journal(), {"first record", "second record", "fourth", "fifth"}, 0);
}

TEST_CASE("journal: a writer reopened on a clean journal continues the last segment") {
  TempDir tmp;
  write_records(tmp.journal(), {"a", "b"}, /*max_segment_bytes=*/1024);
  write_records(tmp.journal(), {"c"}, /*max_segment_bytes=*/1024);
  CHECK(count_segments(tmp.journal()) == 1);
  // A reopened writer rolls to the next number when the last segment is full.
  write_records(tmp.journal(), {std::string(2000, 'd'), "e"}, /*max_segment_bytes=*/1024);
  CHECK(count_segments(tmp.journal()) == 3);
  auto all = read_all(tmp.journal());
  REQUIRE(all.ok());
  CHECK(*all == std::vector<std::string>{"a", "b", "c", std::string(2000, 'd'), "e"});
}

TEST_CASE_METHOD(ThreeRecords, "journal: a flipped byte in the middle record is DataLoss with file and offset") {
  const uint64_t middle = offset_of(records, 1);
  flip_byte(path, middle + kHeaderBytes + 4);

  auto reader = JournalReader::open(tmp.journal());
  REQUIRE(reader.ok());
  std::string record;
  auto more = (*reader)->read(&record);
  REQUIRE(more.ok());
  REQUIRE(*more);
  CHECK(record == records[0]);
  auto bad = (*reader)->read(&record);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK(bad.status().message() ==
        "journal corrupted at " + path + ":" + std::to_string(middle) + ": checksum mismatch");
  // Errors are sticky.
  auto again = (*reader)->read(&record);
  REQUIRE_FALSE(again.ok());
  CHECK(again.status() == bad.status());
  CHECK((*reader)->dropped_tail_bytes() == 0);
}

TEST_CASE_METHOD(ThreeRecords, "journal: a flipped checksum byte in the middle record is DataLoss") {
  flip_byte(path, offset_of(records, 1) + 1);
  require_data_loss(tmp.journal(), {path + ":" + std::to_string(offset_of(records, 1)), "checksum mismatch"});
}

TEST_CASE_METHOD(ThirtyRecords, "journal: a flipped byte in a segment that is not the last is DataLoss") {
  const std::string first = segment(tmp.journal(), 1);

  SECTION("in a middle record") {
    flip_byte(first, kHeaderBytes + records[0].size() + kHeaderBytes + 2);
    require_data_loss(tmp.journal(), {first + ":" + std::to_string(kHeaderBytes + records[0].size()),
                                      "checksum mismatch"});
  }
  SECTION("in the record that ends the segment") {
    flip_byte(first, fs::file_size(first) - 1);
    require_data_loss(tmp.journal(), {first + ":", "checksum mismatch"});
  }
}

TEST_CASE_METHOD(ThirtyRecords, "journal: a truncated segment that is not the last is DataLoss") {
  const std::string first = segment(tmp.journal(), 1);
  const uint64_t second = kHeaderBytes + records[0].size();

  SECTION("inside a payload") {
    fs::resize_file(first, second + kHeaderBytes + 3);
    require_data_loss(tmp.journal(), {first + ":" + std::to_string(second), "truncated record"});
  }
  SECTION("inside a header") {
    fs::resize_file(first, second + 3);
    require_data_loss(tmp.journal(), {first + ":" + std::to_string(second), "truncated header"});
  }
  SECTION("with a zero-filled tail") {
    write_file(first, read_file(first) + std::string(20, '\0'));
    require_data_loss(tmp.journal(), {first + ":", "checksum mismatch"});
  }
}

TEST_CASE_METHOD(ThirtyRecords, "journal: a missing middle segment is DataLoss naming it") {
  fs::remove(segment(tmp.journal(), 2));

  auto reader = JournalReader::open(tmp.journal());
  REQUIRE_FALSE(reader.ok());
  CHECK(reader.status().code() == StatusCode::kDataLoss);
  CHECK(reader.status().message().find(segment(tmp.journal(), 2)) != std::string::npos);
  require_data_loss(tmp.journal(), {"missing segment", "journal-000002.log"});
  // Nor will a writer append to it.
  auto writer = JournalWriter::open(tmp.journal());
  REQUIRE_FALSE(writer.ok());
  CHECK(writer.status().code() == StatusCode::kDataLoss);
}

TEST_CASE("journal: a missing first segment is DataLoss") {
  TempDir tmp;
  write_records(tmp.journal(), {"one", "two", "three"}, /*max_segment_bytes=*/16);
  REQUIRE(count_segments(tmp.journal()) == 3);
  fs::remove(segment(tmp.journal(), 1));
  require_data_loss(tmp.journal(), {"missing segment", "journal-000001.log"});
}

TEST_CASE_METHOD(ThreeRecords, "journal: a huge length mid-file is DataLoss without allocating it") {
  const uint64_t middle = offset_of(records, 1);

  SECTION("0xffffffff") {
    put_le32(path, middle + kCrcBytes, 0xffffffffu);
    require_data_loss(tmp.journal(), {path + ":" + std::to_string(middle), "length 4294967295 exceeds"});
  }
  SECTION("one above the limit") {
    put_le32(path, middle + kCrcBytes, kMaxRecordBytes + 1);
    require_data_loss(tmp.journal(), {path + ":" + std::to_string(middle), "exceeds the limit"});
  }
}

TEST_CASE_METHOD(ThreeRecords, "journal: a writer does not open a journal whose last segment is corrupted") {
  flip_byte(path, offset_of(records, 1) + kHeaderBytes);
  const uint64_t size = fs::file_size(path);

  auto writer = JournalWriter::open(tmp.journal());
  REQUIRE_FALSE(writer.ok());
  CHECK(writer.status().code() == StatusCode::kDataLoss);
  CHECK(writer.status().message().find("journal corrupted at " + path) != std::string::npos);
  CHECK(fs::file_size(path) == size);  // Nothing truncated.
}

TEST_CASE("journal: a failed fsync breaks the writer") {
  io::MemoryFileSystem fs;
  auto writer = JournalWriter::open("/j", /*sync=*/true, 64 << 20, fs);
  REQUIRE(writer.ok());
  REQUIRE((*writer)->append("before").ok());

  fs.fail_next_sync(Status::DataLoss("Input/output error"));
  Status failure = (*writer)->append("lost?");
  CHECK(failure.code() == StatusCode::kDataLoss);
  CHECK(failure.message().find("journal-000001.log") != std::string::npos);
  CHECK((*writer)->records_written() == 1);

  Status later = (*writer)->append("after");
  CHECK(later.code() == StatusCode::kFailedPrecondition);
  CHECK(later.message().find(failure.to_string()) != std::string::npos);
  CHECK((*writer)->append("after again") == later);
  CHECK((*writer)->records_written() == 1);
}

TEST_CASE("journal: acknowledged records survive a crash, with sync=false they need not") {
  io::MemoryFileSystem fs;
  {
    // Small segments: the directory entries of new segments must be durable too.
    auto writer = JournalWriter::open("/j", /*sync=*/true, /*max_segment_bytes=*/40, fs);
    REQUIRE(writer.ok());
    for (int i = 0; i < 6; ++i) REQUIRE((*writer)->append(make_record(i)).ok());
  }
  fs.crash();
  auto all = read_all("/j", fs);
  REQUIRE(all.ok());
  CHECK(all->size() == 6);
  CHECK(all->back() == make_record(5));

  io::MemoryFileSystem unsynced;
  {
    auto writer = JournalWriter::open("/j", /*sync=*/false, 64 << 20, unsynced);
    REQUIRE(writer.ok());
    for (int i = 0; i < 6; ++i) REQUIRE((*writer)->append(make_record(i)).ok());
  }
  unsynced.crash();
  auto lost = read_all("/j", unsynced);
  REQUIRE(lost.ok());
  CHECK(lost->empty());
}

TEST_CASE("journal: a write that fails part way leaves a torn tail the next writer truncates") {
  io::MemoryFileSystem fs;
  auto writer = JournalWriter::open("/j", /*sync=*/true, 64 << 20, fs);
  REQUIRE(writer.ok());
  REQUIRE((*writer)->append("before").ok());
  fs.fail_writes_after(5, Status::ResourceExhausted("disk full"));
  Status failure = (*writer)->append("does not fit");
  CHECK(failure.code() == StatusCode::kResourceExhausted);
  CHECK((*writer)->append("x").code() == StatusCode::kFailedPrecondition);
  fs.allow_writes();
  writer->reset();
  CHECK(fs.contents("/j/" + segment_file_name(1))->size() == kHeaderBytes + 6 + 5);

  auto reopened = JournalWriter::open("/j", /*sync=*/true, 64 << 20, fs);
  REQUIRE(reopened.ok());
  CHECK(fs.contents("/j/" + segment_file_name(1))->size() == kHeaderBytes + 6);
  REQUIRE((*reopened)->append("after").ok());
  auto all = read_all("/j", fs);
  REQUIRE(all.ok());
  CHECK(*all == std::vector<std::string>{"before", "after"});
}

TEST_CASE("journal: a failed write breaks the writer and reopening recovers") {
  TempDir tmp;
  auto writer = JournalWriter::open(tmp.journal());
  REQUIRE(writer.ok());
  REQUIRE((*writer)->append("before").ok());

  // A file size limit makes write() fail with EFBIG part way through the record.
  struct rlimit old_limit;
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 64;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  Status failure = (*writer)->append(std::string(200, 'x'));
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  std::signal(SIGXFSZ, old_handler);

  INFO(failure.to_string());
  CHECK(failure.code() == StatusCode::kResourceExhausted);
  Status later = (*writer)->append("after");
  CHECK(later.code() == StatusCode::kFailedPrecondition);
  CHECK(later.message().find(failure.to_string()) != std::string::npos);
  CHECK((*writer)->append("after again") == later);
  writer->reset();

  // The partial record is a torn tail: the reader drops it, a new writer truncates it.
  auto reader = JournalReader::open(tmp.journal());
  REQUIRE(reader.ok());
  std::string record;
  REQUIRE(*(*reader)->read(&record));
  CHECK(record == "before");
  CHECK_FALSE(*(*reader)->read(&record));
  CHECK((*reader)->dropped_tail_bytes() == 64 - (kHeaderBytes + 6));

  write_records(tmp.journal(), {"recovered"});
  auto all = read_all(tmp.journal());
  REQUIRE(all.ok());
  CHECK(*all == std::vector<std::string>{"before", "recovered"});
}

TEST_CASE("journal: a failure creating the next segment breaks the writer") {
  TempDir tmp;
  auto writer = JournalWriter::open(tmp.journal(), /*sync=*/true, /*max_segment_bytes=*/32);
  REQUIRE(writer.ok());
  REQUIRE((*writer)->append("fills segment one").ok());
  // Something already holds the next segment's name.
  fs::create_directory(segment(tmp.journal(), 2));

  Status failure = (*writer)->append("needs segment two");
  CHECK_FALSE(failure.ok());
  CHECK(failure.message().find("journal-000002.log") != std::string::npos);
  Status later = (*writer)->append("x");
  CHECK(later.code() == StatusCode::kFailedPrecondition);
  CHECK(later.message().find(failure.to_string()) != std::string::npos);
  CHECK((*writer)->records_written() == 1);
}

TEST_CASE("journal: a record over kMaxRecordBytes is refused without breaking the writer") {
  TempDir tmp;
  auto writer = JournalWriter::open(tmp.journal());
  REQUIRE(writer.ok());
  Status too_big = (*writer)->append(std::string(kMaxRecordBytes + 1, 'x'));
  CHECK(too_big.code() == StatusCode::kInvalidArgument);
  REQUIRE((*writer)->append("fine").ok());
  CHECK(fs::file_size(segment(tmp.journal(), 1)) == kHeaderBytes + 4);
}

TEST_CASE("journal: a second writer on the same directory is refused") {
  TempDir tmp;
  {
    auto first = JournalWriter::open(tmp.journal());
    REQUIRE(first.ok());
    auto second = JournalWriter::open(tmp.journal());
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == StatusCode::kFailedPrecondition);
    CHECK(second.status().message().find("already open") != std::string::npos);
  }
  auto after_close = JournalWriter::open(tmp.journal());
  CHECK(after_close.ok());
}

TEST_CASE("journal: opening a path that is a file fails") {
  TempDir tmp;
  const std::string path = tmp.path() + "/plain_file";
  write_file(path, "not a directory");
  auto writer = JournalWriter::open(path);
  REQUIRE_FALSE(writer.ok());
  CHECK(writer.status().code() == StatusCode::kFailedPrecondition);
  auto reader = JournalReader::open(path);
  // opendir's ENOTDIR: NotFound, as everywhere (io::errno_to_status).
  REQUIRE_FALSE(reader.ok());
  CHECK(reader.status().code() == StatusCode::kNotFound);
  auto empty = JournalWriter::open("");
  CHECK(empty.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("journal: sync=false still writes readable records") {
  TempDir tmp;
  std::vector<std::string> records;
  for (int i = 0; i < 100; ++i) records.push_back(make_record(i));
  write_records(tmp.journal(), records, /*max_segment_bytes=*/512, /*sync=*/false);
  CHECK(count_segments(tmp.journal()) > 1);
  auto all = read_all(tmp.journal());
  REQUIRE(all.ok());
  CHECK(*all == records);
}

}  // namespace
}  // namespace capstan::journal
