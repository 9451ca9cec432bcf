#include "data/io/tfrecord.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/data/tfrecord.h"
#include "io/crc32c.h"
#include "data/io/record_format.h"
#include "data/test_util.h"

namespace capstan::data::io {
namespace {

using capstan::io::crc32c;
using capstan::io::crc32c_mask;

using testing::gunzip_file;
using testing::gzip;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

// The 35 bytes TensorFlow writes for the record "The Quick Brown Fox"
// (tensorflow/rust's test resource tf_rust_expected.tfrecord).
const std::string kQuickBrownFoxRecord(
    "\x13\x00\x00\x00\x00\x00\x00\x00"  // length 19, little endian
    "\x0c\x91\x32\x1b"                  // masked crc32c of the length
    "The Quick Brown Fox"               // data
    "\x18\x0d\xe8\x3a",                 // masked crc32c of the data
    35);

// Encodes one record by hand, from the layout in record_format.h.
std::string encode_record(const std::string& data) {
  std::string out;
  auto put_le = [&out](uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out += static_cast<char>(value >> (8 * i));
  };
  put_le(data.size(), 8);
  put_le(crc32c_mask(crc32c(out.data(), 8)), 4);
  out += data;
  put_le(crc32c_mask(crc32c(data.data(), data.size())), 4);
  return out;
}

// Records of assorted sizes: empty, small, binary, and one of 3 MiB that
// spans the reader's buffers.
std::vector<std::string> sample_records(size_t count) {
  std::mt19937_64 rng(42);
  std::vector<std::string> records;
  for (size_t i = 0; i < count; ++i) {
    size_t size = i == 0 ? 0 : i == count / 2 ? 3 * 1024 * 1024 + 5 : rng() % 300;
    std::string record(size, '\0');
    for (auto& c : record) c = static_cast<char>(rng());
    records.push_back(std::move(record));
  }
  return records;
}

void write_records(const std::string& path, Compression compression,
                   const std::vector<std::string>& records) {
  auto writer = TFRecordWriter::open(path, compression);
  REQUIRE(writer.ok());
  for (const auto& record : records) REQUIRE((*writer)->write(record).ok());
  REQUIRE((*writer)->close().ok());
}

// Reads every record; returns the error that stopped the reader, if any.
// Reads every record with read(), then again with read_tensor(), and
// checks that the two give the same records and the same error.
Status read_records(const std::string& path, Compression compression,
                    std::vector<std::string>* records) {
  records->clear();
  auto reader = TFRecordReader::open(path, compression);
  if (!reader.ok()) return reader.status();
  std::string record;
  Status status;
  while (true) {
    auto more = (*reader)->read(&record);
    if (!more.ok()) {
      // Errors are sticky and the offset stays at the bad record.
      uint64_t offset = (*reader)->offset();
      CHECK((*reader)->read(&record).status() == more.status());
      CHECK((*reader)->offset() == offset);
      status = more.status();
      break;
    }
    if (!*more) break;
    records->push_back(record);
  }

  auto tensors = TFRecordReader::open(path, compression);
  REQUIRE(tensors.ok());
  std::vector<std::string> from_tensors;
  while (true) {
    Tensor t;
    auto more = (*tensors)->read_tensor(&t);
    if (!more.ok()) {
      CHECK(more.status() == status);
      CHECK((*tensors)->read_tensor(&t).status() == status);
      break;
    }
    if (!*more) {
      CHECK(status.ok());
      break;
    }
    REQUIRE(t.dtype() == DType::kString);
    REQUIRE(t.shape() == Shape{});
    REQUIRE(t.validate().ok());
    from_tensors.emplace_back(t.string_at(0));
  }
  CHECK(from_tensors == *records);
  return status;
}

std::string describe(const Status& status) { return status.to_string(); }

TEST_CASE("TFRecordWriter writes the same bytes as TensorFlow") {
  TempDir dir;
  std::string path = dir.file("fox.tfrecord");
  write_records(path, Compression::kNone, {"The Quick Brown Fox"});
  CHECK(read_bytes(path) == kQuickBrownFoxRecord);
  CHECK(encode_record("The Quick Brown Fox") == kQuickBrownFoxRecord);
}

TEST_CASE("TFRecordReader reads the bytes TensorFlow wrote") {
  TempDir dir;
  std::string path = dir.file("fox.tfrecord");
  write_bytes(path, kQuickBrownFoxRecord);
  auto reader = TFRecordReader::open(path, Compression::kNone);
  REQUIRE(reader.ok());
  std::string record;
  auto more = (*reader)->read(&record);
  REQUIRE(more.ok());
  CHECK(*more);
  CHECK(record == "The Quick Brown Fox");
  CHECK((*reader)->offset() == 35);
  more = (*reader)->read(&record);
  REQUIRE(more.ok());
  CHECK_FALSE(*more);
  CHECK((*reader)->offset() == 35);
}

// Writes 200 sample records to `path` with `compression`: the file, as
// `uncompressed` reads it, must be their encodings back to back, and they
// must read back.
void check_byte_identical(const std::string& path, Compression compression,
                          std::string (*uncompressed)(const std::string& path)) {
  auto records = sample_records(200);
  write_records(path, compression, records);
  std::string expected_bytes;
  for (const auto& record : records) expected_bytes += encode_record(record);
  CHECK(uncompressed(path) == expected_bytes);
  std::vector<std::string> got;
  REQUIRE(read_records(path, compression, &got).ok());
  CHECK(got == records);
}

TEST_CASE("records written to a plain file read back byte-identical") {
  TempDir dir;
  check_byte_identical(dir.file("data.tfrecord"), Compression::kNone, read_bytes);
}

TEST_CASE("records written to a gzip file read back byte-identical") {
  TempDir dir;
  check_byte_identical(dir.file("data.tfrecord.gz"), Compression::kGzip, gunzip_file);
}

TEST_CASE("read_tensor across 2 MiB chunks: records of every size, tensors kept or dropped, stay intact") {
  TempDir dir;
  std::string path = dir.file("chunks.tfrecord");
  // Sizes around the chunk (2 MiB) and its edges, and many small records,
  // so records straddle chunk boundaries at every phase.
  std::vector<std::string> records;
  const std::vector<size_t> sizes = {0,           1,          1000,           (2u << 20) - 17, (2u << 20) - 16,
                                     (2u << 20) - 15, (1u << 20), (2u << 20) + 5, 5u << 20,        17};
  uint32_t seed = 7;
  for (int round = 0; round < 3; ++round) {
    for (size_t size : sizes) {
      std::string record(size, '\0');
      for (char& c : record) c = static_cast<char>(seed = seed * 1103515245u + 12345u);
      records.push_back(std::move(record));
    }
    for (int k = 0; k < 3000; ++k) records.push_back(std::string(static_cast<size_t>(k % 700), static_cast<char>('a' + k % 26)));
  }
  write_records(path, Compression::kNone, records);
  auto reader = TFRecordReader::open(path, Compression::kNone);
  REQUIRE(reader.ok());
  std::vector<std::pair<size_t, Tensor>> kept;  // every 7th record, held to the end
  size_t n = 0;
  uint64_t offset = 0;
  for (;; ++n) {
    Tensor t;
    auto more = (*reader)->read_tensor(&t);
    REQUIRE(more.ok());
    if (!*more) break;
    REQUIRE(n < records.size());
    REQUIRE(t.dtype() == DType::kString);
    REQUIRE(t.string_at(0) == records[n]);
    REQUIRE(t.validate().ok());
    offset += tfrecord::kRecordOverheadBytes + records[n].size();
    REQUIRE((*reader)->offset() == offset);
    if (n % 7 == 0) kept.emplace_back(n, std::move(t));
  }
  CHECK(n == records.size());
  for (const auto& [index, tensor] : kept) {
    INFO("record " << index);
    CHECK(tensor.string_at(0) == records[index]);
  }
}

TEST_CASE("offset() is the uncompressed offset of the next record") {
  TempDir dir;
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    std::string path = dir.file("offsets");
    write_records(path, compression, {"a", "", "xyz"});
    auto reader = TFRecordReader::open(path, compression);
    REQUIRE(reader.ok());
    std::string record;
    CHECK((*reader)->offset() == 0);
    for (uint64_t expected : {17u, 33u, 52u}) {
      REQUIRE((*reader)->read(&record).ok());
      CHECK((*reader)->offset() == expected);
    }
  }
}

TEST_CASE("an empty TFRecord file has no records") {
  TempDir dir;
  std::vector<std::string> got;
  write_bytes(dir.file("empty"), "");
  CHECK(read_records(dir.file("empty"), Compression::kNone, &got).ok());
  CHECK(got.empty());
  CHECK(read_records(dir.file("empty"), Compression::kGzip, &got).ok());
  CHECK(got.empty());
  write_records(dir.file("none.gz"), Compression::kGzip, {});
  CHECK(read_records(dir.file("none.gz"), Compression::kGzip, &got).ok());
  CHECK(got.empty());
}

// Flips one byte of record k (at `field_offset` within it) in a file of five
// records and checks the error names record k's offset.
void check_flip(Compression compression, size_t field_offset_in_record, bool in_data_crc,
                const std::string& expected_why) {
  TempDir dir;
  std::vector<std::string> records = {"zero", "one one", "two two two", "three", "four!"};
  std::string bytes;
  std::vector<uint64_t> offsets;
  for (const auto& record : records) {
    offsets.push_back(bytes.size());
    bytes += encode_record(record);
  }
  for (size_t k = 0; k < records.size(); ++k) {
    std::string damaged = bytes;
    size_t at = offsets[k] + (in_data_crc ? 12 + records[k].size() : 0) + field_offset_in_record;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x20);
    std::string path = dir.file("flip");
    write_bytes(path, compression == Compression::kGzip ? gzip(damaged) : damaged);
    std::vector<std::string> got;
    Status status = read_records(path, compression, &got);
    INFO("record " << k << ": " << describe(status));
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(status.message() == "corrupted record at offset " + std::to_string(offsets[k]) +
                                  " in '" + path + "': " + expected_why);
    // The records before the damaged one were read intact.
    CHECK(got == std::vector<std::string>(records.begin(), records.begin() + k));
  }
}

TEST_CASE("a damaged length is a length checksum mismatch at that record's offset") {
  check_flip(Compression::kNone, 0, false, "length checksum mismatch");
  check_flip(Compression::kNone, 7, false, "length checksum mismatch");
  check_flip(Compression::kGzip, 3, false, "length checksum mismatch");
}

TEST_CASE("a damaged length CRC is a length checksum mismatch at that record's offset") {
  check_flip(Compression::kNone, 8, false, "length checksum mismatch");
  check_flip(Compression::kNone, 11, false, "length checksum mismatch");
  check_flip(Compression::kGzip, 9, false, "length checksum mismatch");
}

TEST_CASE("damaged data is a data checksum mismatch at that record's offset") {
  check_flip(Compression::kNone, 12, false, "data checksum mismatch");
  check_flip(Compression::kNone, 14, false, "data checksum mismatch");
  check_flip(Compression::kGzip, 12, false, "data checksum mismatch");
}

TEST_CASE("a damaged data CRC is a data checksum mismatch at that record's offset") {
  check_flip(Compression::kNone, 0, true, "data checksum mismatch");
  check_flip(Compression::kNone, 3, true, "data checksum mismatch");
  check_flip(Compression::kGzip, 2, true, "data checksum mismatch");
}

TEST_CASE("a file cut anywhere inside its last record is a truncated record") {
  TempDir dir;
  std::string first = encode_record("first record");
  std::string last = encode_record("the last record, cut short");
  std::string bytes = first + last;
  const uint64_t last_offset = first.size();
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    for (size_t cut = last_offset + 1; cut < bytes.size(); ++cut) {
      std::string path = dir.file("cut");
      std::string kept = bytes.substr(0, cut);
      write_bytes(path, compression == Compression::kGzip ? gzip(kept) : kept);
      std::vector<std::string> got;
      Status status = read_records(path, compression, &got);
      INFO(compression_name(compression) << " cut at " << cut << ": " << describe(status));
      REQUIRE(status.code() == StatusCode::kDataLoss);
      size_t have = cut - last_offset;
      // Inside the header only the header's missing bytes are known; after
      // it, the (checksummed) length says how much is missing.
      size_t missing = have < tfrecord::kHeaderBytes ? tfrecord::kHeaderBytes - have
                                                     : last.size() - have;
      CHECK(status.message() == "truncated record at offset " + std::to_string(last_offset) +
                                    " in '" + path + "' (expected " + std::to_string(missing) +
                                    " more bytes)");
      CHECK(got == std::vector<std::string>{"first record"});
    }
  }
}

std::string header_claiming(uint64_t length) {
  std::string header;
  for (int i = 0; i < 8; ++i) header += static_cast<char>(length >> (8 * i));
  uint32_t crc = crc32c_mask(crc32c(header.data(), 8));
  for (int i = 0; i < 4; ++i) header += static_cast<char>(crc >> (8 * i));
  return header;
}

TEST_CASE("a checksummed length over 2 GiB is corruption, not an allocation") {
  TempDir dir;
  for (auto compression : {Compression::kNone, Compression::kGzip}) {
    std::string path = dir.file("huge");
    std::string bytes = encode_record("ok") + header_claiming(uint64_t{1} << 40) + "tail";
    write_bytes(path, compression == Compression::kGzip ? gzip(bytes) : bytes);
    std::vector<std::string> got;
    Status status = read_records(path, compression, &got);
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(status.message() == "corrupted record at offset 18 in '" + path +
                                  "': record length 1099511627776 exceeds the limit of "
                                  "2147483648 bytes");
    CHECK(got == std::vector<std::string>{"ok"});
  }
}

TEST_CASE("a checksummed length near 2^64 is corruption for read_tensor too, not a wrap-around") {
  TempDir dir;
  for (uint64_t length : {~uint64_t{0}, ~uint64_t{0} - 5, ~uint64_t{0} - 15, ~uint64_t{0} - 16}) {
    std::string path = dir.file("wrap");
    write_bytes(path, encode_record("first") + header_claiming(length) + std::string(64, 'x'));
    auto reader = TFRecordReader::open(path, Compression::kNone);
    REQUIRE(reader.ok());
    Tensor record;
    REQUIRE((*reader)->read_tensor(&record).ok());
    auto second = (*reader)->read_tensor(&record);
    INFO(length);
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(second.status().message(), Catch::Contains("exceeds the limit"));
  }
}

TEST_CASE("a length beyond the end of a plain file is a truncated record, found up front") {
  TempDir dir;
  std::string path = dir.file("short");
  // 1 GiB claimed, 4 bytes present: the reader must not allocate 1 GiB.
  write_bytes(path, header_claiming(uint64_t{1} << 30) + "tail");
  std::vector<std::string> got;
  Status status = read_records(path, Compression::kNone, &got);
  CHECK(status.message() == "truncated record at offset 0 in '" + path + "' (expected " +
                                std::to_string((uint64_t{1} << 30) + 4 - 4) + " more bytes)");
}

TEST_CASE("a length beyond the end of a gzip stream is a truncated record") {
  TempDir dir;
  std::string path = dir.file("short.gz");
  const uint64_t claimed = 100 * 1000 * 1000;  // more than one 64 MiB read step
  write_bytes(path, gzip(header_claiming(claimed) + "tail"));
  std::vector<std::string> got;
  Status status = read_records(path, Compression::kGzip, &got);
  CHECK(status.message() == "truncated record at offset 0 in '" + path + "' (expected " +
                                std::to_string(claimed + 4 - 4) + " more bytes)");
}

TEST_CASE("errors of the gzip stream pass through the reader") {
  TempDir dir;
  std::string path = dir.file("bad.gz");
  std::string compressed = gzip(encode_record("some data to compress"));
  compressed[0] = 'X';
  write_bytes(path, compressed);
  std::vector<std::string> got;
  Status status = read_records(path, Compression::kGzip, &got);
  CHECK(status.code() == StatusCode::kDataLoss);
  CHECK(status.message().find("corrupt gzip data in '" + path + "'") == 0);
}

TEST_CASE("opening a missing TFRecord file is NotFound") {
  TempDir dir;
  auto reader = TFRecordReader::open(dir.file("missing"), Compression::kNone);
  CHECK(reader.status().code() == StatusCode::kNotFound);
  auto writer = TFRecordWriter::open(dir.file("no/dir/f"), Compression::kNone);
  CHECK(writer.status().code() == StatusCode::kNotFound);
}

TEST_CASE("TFRecordWriter refuses writes after close and closes once") {
  TempDir dir;
  auto writer = TFRecordWriter::open(dir.file("f"), Compression::kNone);
  REQUIRE(writer.ok());
  REQUIRE((*writer)->write("a").ok());
  REQUIRE((*writer)->close().ok());
  CHECK((*writer)->close().ok());
  CHECK((*writer)->write("b").code() == StatusCode::kFailedPrecondition);
  CHECK(read_bytes(dir.file("f")) == encode_record("a"));
}

TEST_CASE("TFRecordWriter refuses a record over 2 GiB without reading it") {
  TempDir dir;
  auto writer = TFRecordWriter::open(dir.file("f"), Compression::kNone);
  REQUIRE(writer.ok());
  char byte = 0;
  // The size is checked before the data is touched, so a view that claims
  // more than it holds is safe here.
  std::string_view too_big(&byte, tfrecord::kMaxRecordBytes + 1);
  Status status = (*writer)->write(too_big);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  REQUIRE((*writer)->close().ok());
  CHECK(read_bytes(dir.file("f")).empty());
}

TEST_CASE("TFRecordWriter reports a full disk") {
  auto writer = TFRecordWriter::open("/dev/full", Compression::kNone);
  REQUIRE(writer.ok());
  Status status = (*writer)->write(std::string(1 << 20, 'x'));
  if (status.ok()) status = (*writer)->close();
  CHECK(status.code() == StatusCode::kResourceExhausted);
}

TEST_CASE("TFRecordReader reads from any InputStream it is given") {
  TempDir dir;
  std::string path = dir.file("f");
  write_bytes(path, kQuickBrownFoxRecord + kQuickBrownFoxRecord);
  auto stream = open_input(path, Compression::kNone);
  REQUIRE(stream.ok());
  TFRecordReader reader(std::move(*stream), "my-name");
  std::string record;
  int count = 0;
  while (true) {
    auto more = reader.read(&record);
    REQUIRE(more.ok());
    if (!*more) break;
    CHECK(record == "The Quick Brown Fox");
    ++count;
  }
  CHECK(count == 2);
}

std::vector<std::string> read_back(const std::string& path, data::Compression compression) {
  auto it = Dataset::tfrecord_dataset({path}, compression).make_iterator();
  REQUIRE(it.ok());
  std::vector<std::string> out;
  while (true) {
    auto next = (*it)->get_next();
    REQUIRE(next.ok());
    if (!next->has_value()) return out;
    out.push_back(std::string((**next).components.at(0).string_at(0)));
  }
}

TEST_CASE("public TFRecordWriter: what it writes, plain or GZIP, tfrecord_dataset reads back", "[tfrecord]") {
  testing::TempDir dir;
  std::vector<std::string> records = {"", "a", std::string(100000, 'x'), std::string("\0\1\2", 3)};
  for (data::Compression compression : {data::Compression::kNone, data::Compression::kGzip}) {
    const std::string path = dir.file(compression == data::Compression::kGzip ? "r.tfrecord.gz" : "r.tfrecord");
    auto writer = data::TFRecordWriter::open(path, compression);
    REQUIRE(writer.ok());
    for (const auto& record : records) REQUIRE((*writer)->write(record).ok());
    REQUIRE((*writer)->close().ok());
    CHECK(read_back(path, compression) == records);
  }
}

TEST_CASE("public TFRecordWriter: writing after close fails, a missing directory is NotFound naming the path",
          "[tfrecord]") {
  testing::TempDir dir;
  auto writer = data::TFRecordWriter::open(dir.file("w.tfrecord"));
  REQUIRE(writer.ok());
  REQUIRE((*writer)->close().ok());
  CHECK((*writer)->write("late").code() == StatusCode::kFailedPrecondition);
  auto missing = data::TFRecordWriter::open(dir.file("no/such/dir/w.tfrecord"));
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("no/such/dir"));
}

}  // namespace
}  // namespace capstan::data::io

