#include "capstan/summary.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "io/crc32c.h"
#include "data/io/file.h"
#include "data/io/tfrecord.h"
#include "data/test_util.h"

namespace capstan {
namespace {

namespace fs = std::filesystem;
using data::testing::read_bytes;
using data::testing::TempDir;
using data::testing::write_bytes;

std::string le_bytes(uint64_t value, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += static_cast<char>(value >> (8 * i));
  return out;
}

uint32_t le32_at(const std::string& bytes, size_t at) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[at + i]);
  return value;
}

double double_at(const std::string& bytes, size_t at) {
  double value = 0;
  std::memcpy(&value, bytes.data() + at, sizeof(value));
  return value;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  return names;
}

// read_scalar_events(path) is DataLoss, its message holding each of `parts`.
void check_data_loss(const std::string& path, std::initializer_list<std::string> parts) {
  auto events = read_scalar_events(path);
  CHECK(events.status().code() == StatusCode::kDataLoss);
  for (const std::string& part : parts) CHECK_THAT(events.status().message(), Catch::Contains(part));
}

// Writes a TFRecord file at `path` of one record, `record`.
void write_record(const std::string& path, const std::string& record) {
  auto records = data::io::TFRecordWriter::open(path, data::io::Compression::kNone);
  REQUIRE(records.ok());
  REQUIRE((*records)->write(record).ok());
  REQUIRE((*records)->close().ok());
}

std::unique_ptr<SummaryWriter> make_writer(const std::string& logdir, const SummaryWriterOptions& options = {}) {
  auto writer = SummaryWriter::create(logdir, options);
  INFO(writer.status().to_string());
  REQUIRE(writer.ok());
  return std::move(*writer);
}

// A writer in `logdir` that keeps up to `max_queue` events in memory and
// writes them at least every `flush_interval`.
std::unique_ptr<SummaryWriter> make_writer(
    const std::string& logdir, int max_queue,
    std::chrono::milliseconds flush_interval = SummaryWriterOptions{}.flush_interval) {
  SummaryWriterOptions options;
  options.max_queue = max_queue;
  options.flush_interval = flush_interval;
  return make_writer(logdir, options);
}

std::vector<ScalarEvent> read_all(const std::string& path) {
  auto events = read_scalar_events(path);
  INFO(events.status().to_string());
  REQUIRE(events.ok());
  return *events;
}

TEST_CASE("scalars written by a SummaryWriter read back with their tags, steps and values") {
  TempDir dir;
  const double before = now_seconds();
  auto writer = make_writer(dir.file("run"));
  for (int64_t step = 1; step <= 3; ++step) {
    REQUIRE(writer->scalar("train/loss", 1.0 / static_cast<double>(step), step).ok());
    REQUIRE(writer->scalar("train/accuracy", 0.5 + 0.125 * static_cast<double>(step), step).ok());
  }
  REQUIRE(writer->scalar("test/auc", 0.9, 3).ok());
  REQUIRE(writer->close().ok());
  const double after = now_seconds();

  auto events = read_all(writer->path());
  REQUIRE(events.size() == 7);
  for (int64_t step = 1; step <= 3; ++step) {
    const ScalarEvent& loss = events[2 * (step - 1)];
    const ScalarEvent& accuracy = events[2 * (step - 1) + 1];
    CHECK(loss.tag == "train/loss");
    CHECK(loss.step == step);
    CHECK(loss.value == static_cast<double>(static_cast<float>(1.0 / static_cast<double>(step))));
    CHECK(accuracy.tag == "train/accuracy");
    CHECK(accuracy.step == step);
    CHECK(accuracy.value == 0.5 + 0.125 * static_cast<double>(step));  // exact in float32
  }
  CHECK(events[6].tag == "test/auc");
  CHECK(events[6].value == static_cast<double>(0.9f));  // stored as float32, as TensorBoard's simple_value
  for (const auto& event : events) {
    CHECK(event.wall_time >= before - 1e-3);
    CHECK(event.wall_time <= after + 1e-3);
  }
  for (size_t i = 1; i < events.size(); ++i) CHECK(events[i].wall_time >= events[i - 1].wall_time);
}

TEST_CASE("create() makes the logdir and names the file events.out.tfevents.<seconds>.<hostname>.<pid>.<n><suffix>") {
  TempDir dir;
  const std::string logdir = dir.file("a/b/run");
  const auto before = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  SummaryWriterOptions options;
  options.filename_suffix = ".v2";
  auto writer = make_writer(logdir, options);
  REQUIRE(fs::is_directory(logdir));
  REQUIRE(files_in(logdir).size() == 1);
  const std::string name = files_in(logdir)[0];
  CHECK(writer->path() == logdir + "/" + name);

  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof(host) - 1) == 0);
  const std::string prefix = "events.out.tfevents.";
  REQUIRE(name.starts_with(prefix));
  const std::string seconds = name.substr(prefix.size(), 10);
  CHECK(std::stoll(seconds) >= before);
  CHECK(std::stoll(seconds) <= before + 5);
  const std::string rest = name.substr(prefix.size() + 10);
  const std::string expected_start = "." + std::string(host) + "." + std::to_string(::getpid()) + ".";
  CHECK(rest.starts_with(expected_start));
  CHECK(rest.ends_with(".v2"));
  const std::string counter = rest.substr(expected_start.size(), rest.size() - expected_start.size() - 3);
  CHECK(!counter.empty());
  CHECK(counter.find_first_not_of("0123456789") == std::string::npos);
}

TEST_CASE("two writers in one logdir in the same second write two files") {
  TempDir dir;
  auto first = make_writer(dir.path());
  auto second = make_writer(dir.path());
  CHECK(first->path() != second->path());
  REQUIRE(first->scalar("a", 1, 1).ok());
  REQUIRE(second->scalar("b", 2, 1).ok());
  REQUIRE(first->close().ok());
  REQUIRE(second->close().ok());
  CHECK(files_in(dir.path()).size() == 2);
  CHECK(read_all(first->path()).at(0).tag == "a");
  CHECK(read_all(second->path()).at(0).tag == "b");
}

// Event { wall_time: W  file_version: "brain.Event:2" } is
//   09 <W, 8 bytes little endian>     field 1 (wall_time), fixed64
//   1a 0d "brain.Event:2"             field 3 (file_version), 13 bytes
// 24 bytes, framed as TFRecord: length 24 (8 bytes LE), the masked CRC32C
// of those 8 bytes (a3 7f 4b 22), the data, the masked CRC32C of the data.
TEST_CASE("the first record is the file_version event, byte for byte as TensorFlow writes it") {
  TempDir dir;
  const double before = now_seconds();
  auto writer = make_writer(dir.path());
  const double after = now_seconds();
  // Readable at once: create() writes it to the file.
  const std::string bytes = read_bytes(writer->path());
  REQUIRE(bytes.size() == 12 + 24 + 4);
  CHECK(bytes.substr(0, 12) == le_bytes(24, 8) + std::string("\xa3\x7f\x4b\x22", 4));
  const std::string data = bytes.substr(12, 24);
  CHECK(data[0] == '\x09');
  const double wall_time = double_at(data, 1);
  CHECK(wall_time >= before - 1e-3);
  CHECK(wall_time <= after + 1e-3);
  CHECK(data.substr(9) == std::string("\x1a\x0d") + "brain.Event:2");
  CHECK(le32_at(bytes, 36) == capstan::io::crc32c_mask(capstan::io::crc32c(data.data(), data.size())));
}

// Event { wall_time: W  step: 5  summary { value { tag: "loss"  simple_value: 0.5 } } } is
//   09 <W>                            field 1 (wall_time)
//   10 05                             field 2 (step), varint 5
//   2a 0d                             field 5 (summary), 13 bytes:
//     0a 0b                             Summary field 1 (value), 11 bytes:
//       0a 04 "loss"                      Value field 1 (tag)
//       15 00 00 00 3f                    Value field 2 (simple_value), float 0.5
// 26 bytes; the masked CRC32C of length 26 is 12 9b d8 2d.
TEST_CASE("a scalar's record is TensorFlow's encoding of an Event with a Summary value") {
  TempDir dir;
  auto writer = make_writer(dir.path());
  REQUIRE(writer->scalar("loss", 0.5, 5).ok());
  REQUIRE(writer->flush().ok());
  const std::string bytes = read_bytes(writer->path());
  const size_t at = 12 + 24 + 4;
  REQUIRE(bytes.size() == at + 12 + 26 + 4);
  CHECK(bytes.substr(at, 12) == le_bytes(26, 8) + std::string("\x12\x9b\xd8\x2d", 4));
  const std::string data = bytes.substr(at + 12, 26);
  CHECK(data[0] == '\x09');
  CHECK(double_at(data, 1) >= double_at(bytes, 13));  // not before the file_version event
  CHECK(data.substr(9) == std::string("\x10\x05\x2a\x0d\x0a\x0b\x0a\x04loss\x15\x00\x00\x00\x3f", 17));
  CHECK(le32_at(bytes, at + 12 + 26) == capstan::io::crc32c_mask(capstan::io::crc32c(data.data(), data.size())));
}

TEST_CASE("events wait in memory until flush(), max_queue or the flush interval") {
  TempDir dir;
  auto writer = make_writer(dir.path(), 3, std::chrono::hours(1));
  REQUIRE(writer->scalar("x", 1, 1).ok());
  REQUIRE(writer->scalar("x", 2, 2).ok());
  CHECK(read_all(writer->path()).empty());
  REQUIRE(writer->scalar("x", 3, 3).ok());  // the third: max_queue
  CHECK(read_all(writer->path()).size() == 3);
  REQUIRE(writer->scalar("x", 4, 4).ok());
  CHECK(read_all(writer->path()).size() == 3);
  REQUIRE(writer->flush().ok());
  CHECK(read_all(writer->path()).size() == 4);

  SECTION("a zero flush interval writes every event at once") {
    TempDir other;
    auto each = make_writer(other.path(), 100, std::chrono::milliseconds(0));
    REQUIRE(each->scalar("y", 1, 1).ok());
    CHECK(read_all(each->path()).size() == 1);
  }
}

TEST_CASE("the destructor writes the waiting events and closes the file") {
  TempDir dir;
  std::string path;
  {
    auto writer = make_writer(dir.path(), 1000);
    path = writer->path();
    for (int64_t step = 0; step < 10; ++step) REQUIRE(writer->scalar("loss", 0.25, step).ok());
    CHECK(read_all(path).empty());
  }
  auto events = read_all(path);
  REQUIRE(events.size() == 10);
  CHECK(events.back().step == 9);
}

TEST_CASE("scalars from several threads at once all reach the file whole") {
  TempDir dir;
  auto writer = make_writer(dir.path(), 7);
  constexpr int kThreads = 4, kEach = 250;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&writer, t]() {
      for (int i = 0; i < kEach; ++i) {
        if (!writer->scalar("thread/" + std::to_string(t), i, i).ok()) return;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  REQUIRE(writer->close().ok());
  auto events = read_all(writer->path());
  REQUIRE(events.size() == kThreads * kEach);
  std::vector<int> next(kThreads, 0);  // each thread's events arrive in its order
  for (const auto& event : events) {
    const int t = std::stoi(event.tag.substr(std::strlen("thread/")));
    CHECK(event.step == next[t]);
    CHECK(event.value == next[t]);
    ++next[t];
  }
}

TEST_CASE("scalar() with an empty tag is InvalidArgument, and after close() FailedPrecondition") {
  TempDir dir;
  auto writer = make_writer(dir.path());
  Status empty = writer->scalar("", 1, 1);
  CHECK(empty.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(empty.message(), Catch::Contains("train/loss"));
  REQUIRE(writer->close().ok());
  CHECK(writer->close().ok());  // the first close's result again
  CHECK(writer->flush().ok());
  Status late = writer->scalar("loss", 1, 2);
  CHECK(late.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(late.message(), Catch::Contains(writer->path()));
  CHECK(read_all(writer->path()).empty());
}

TEST_CASE("create() with an empty logdir, a suffix with '/' or max_queue 0 is InvalidArgument") {
  TempDir dir;
  CHECK(SummaryWriter::create("").status().code() == StatusCode::kInvalidArgument);
  SummaryWriterOptions slash;
  slash.filename_suffix = "/x";
  CHECK(SummaryWriter::create(dir.path(), slash).status().code() == StatusCode::kInvalidArgument);
  SummaryWriterOptions zero;
  zero.max_queue = 0;
  CHECK(SummaryWriter::create(dir.path(), zero).status().code() == StatusCode::kInvalidArgument);
  CHECK(files_in(dir.path()).empty());
}

TEST_CASE("create() on a file is FailedPrecondition naming it, under a file the system error naming it") {
  TempDir dir;
  const std::string file = dir.file("not-a-dir");
  write_bytes(file, "x");
  auto on_file = SummaryWriter::create(file);
  CHECK(on_file.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(on_file.status().message(), Catch::Contains("'" + file + "' is not a directory"));

  auto under_file = SummaryWriter::create(file + "/run");
  REQUIRE_FALSE(under_file.ok());
  CHECK_THAT(under_file.status().message(), Catch::Contains("cannot create log directory '" + file + "/run'"));
  CHECK_THAT(under_file.status().message(), Catch::Contains("pass a logdir"));
}

TEST_CASE("a write error (file size limit) is ResourceExhausted naming the file, and it sticks") {
  TempDir dir;
  auto writer = make_writer(dir.path(), 1000);
  // The file holds its 40-byte first record; allow 100 bytes in all.
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 100;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  for (int64_t step = 0; step < 10; ++step) REQUIRE(writer->scalar("loss", 1, step).ok());
  Status flushed = writer->flush();
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &saved) == 0);
  ::signal(SIGXFSZ, old_handler);
  CHECK(flushed.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(flushed.message(), Catch::Contains("'" + writer->path() + "'"));
  CHECK(writer->scalar("loss", 1, 11) == flushed);
  CHECK(writer->flush() == flushed);
  CHECK(writer->close() == flushed);
}

TEST_CASE("a damaged record is DataLoss naming the file and the record's offset") {
  TempDir dir;
  auto writer = make_writer(dir.path());
  REQUIRE(writer->scalar("loss", 0.5, 5).ok());
  REQUIRE(writer->close().ok());
  const std::string good = read_bytes(writer->path());
  const std::string path = dir.file("damaged");

  SECTION("a byte of the scalar's data") {
    std::string bad = good;
    bad[40 + 12 + 20] ^= 0x01;  // inside "loss"
    write_bytes(path, bad);
    check_data_loss(path, {"offset 40 in '" + path + "'", "data checksum mismatch"});
  }
  SECTION("a byte of the first record's length") {
    std::string bad = good;
    bad[0] ^= 0x40;
    write_bytes(path, bad);
    check_data_loss(path, {"offset 0 in '" + path + "'", "length checksum mismatch"});
  }
  SECTION("a record cut short") {
    write_bytes(path, good.substr(0, good.size() - 3));
    check_data_loss(path, {"truncated record at offset 40 in '" + path + "'"});
  }
}

TEST_CASE("a file that does not start with the file_version event is not an event file") {
  TempDir dir;
  const std::string path = dir.file("events.out.tfevents.0.fake");

  SECTION("records that are not Events") {
    write_record(path, std::string("\xff\xff\xff", 3));
    check_data_loss(path, {"offset 0 in '" + path + "' is not an Event"});
  }
  SECTION("an Event that is not the file_version event") {
    write_record(path, std::string("\x10\x05", 2));  // Event { step: 5 }
    check_data_loss(path, {"'" + path + "' is not a TensorBoard event file"});
  }
  SECTION("an empty file") {
    write_bytes(path, "");
    check_data_loss(path, {"'" + path + "' is empty"});
  }
}

TEST_CASE("read_scalar_events of a missing file is NotFound naming it") {
  TempDir dir;
  auto events = read_scalar_events(dir.file("missing"));
  CHECK(events.status().code() == StatusCode::kNotFound);
  CHECK_THAT(events.status().message(), Catch::Contains(dir.file("missing")));
}

}  // namespace
}  // namespace capstan
