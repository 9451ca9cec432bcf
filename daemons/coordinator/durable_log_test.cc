// DurableLog alone: a real journal in a temporary directory, its batches
// written on a real pool.
#include "daemons/coordinator/durable_log.h"

#include <catch2/catch.hpp>
#include <spdlog/sinks/null_sink.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "data/test_util.h"
#include "async/mailbox.h"

namespace capstan::coordinator {
namespace {

struct Loop {
  Loop() : io(kj::setupAsyncIo()), mailbox(*io.lowLevelProvider), pool(1) {}
  ~Loop() { pool.join(); }

  // Runs the loop until `promise` resolves (the pool answers through the
  // mailbox), for up to 10 s.
  template <typename T>
  T wait(kj::Promise<T>& promise) {
    for (int i = 0; i < 1000 && !promise.poll(io.waitScope); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return promise.wait(io.waitScope);
  }

  kj::AsyncIoContext io;
  async::Mailbox mailbox;
  boost::asio::thread_pool pool;
  std::shared_ptr<spdlog::logger> log =
      std::make_shared<spdlog::logger>("durable_log_test", std::make_shared<spdlog::sinks::null_sink_mt>());
};

// A state of `live` records for compaction to write.
DurableLog::Compaction compaction_of(int64_t min_records, std::vector<std::string> live) {
  DurableLog::Compaction c;
  c.min_records = min_records;
  c.live_records = [live]() { return static_cast<int64_t>(live.size()); };
  c.snapshot = [live]() { return live; };
  return c;
}

Result<std::unique_ptr<DurableLog>> open(Loop& loop, const std::string& dir, std::vector<std::string>* replay,
                                         DurableLog::Compaction compaction = {}) {
  return DurableLog::open(dir, loop.pool, loop.log, std::move(compaction), replay);
}

TEST_CASE("records appended at once and enqueued are replayed in their order after reopening",
          "[coordinator][durable]") {
  data::testing::TempDir dir;
  Loop loop;
  {
    std::vector<std::string> replay;
    auto log = open(loop, dir.path(), &replay).value();
    CHECK(replay.empty());
    REQUIRE(log->append_now("variable").ok());
    for (int i = 0; i < 50; ++i) log->enqueue("closure " + std::to_string(i));
    auto synced = log->synced();
    REQUIRE(loop.wait(synced).ok());
    CHECK(log->records() == 51);
  }
  std::vector<std::string> replay;
  auto log = open(loop, dir.path(), &replay).value();
  REQUIRE(replay.size() == 51);
  CHECK(replay.front() == "variable");
  CHECK(replay.back() == "closure 49");
  CHECK(log->records() == 51);
}

TEST_CASE("synced resolves at once when nothing is enqueued, and after the batch that holds the last record",
          "[coordinator][durable]") {
  data::testing::TempDir dir;
  Loop loop;
  std::vector<std::string> replay;
  auto log = open(loop, dir.path(), &replay).value();
  auto idle = log->synced();
  CHECK(idle.poll(loop.io.waitScope));
  log->enqueue("a");
  auto first = log->synced();
  log->enqueue("b");  // waits for the batch of "a" to end, then goes in the next
  auto second = log->synced();
  REQUIRE(loop.wait(first).ok());
  REQUIRE(loop.wait(second).ok());
  std::vector<std::string> again;
  log.reset();
  auto reopened = open(loop, dir.path(), &again).value();
  CHECK(again == std::vector<std::string>{"a", "b"});
}

TEST_CASE("past min_records and twice the live records, the journal becomes the snapshot and CURRENT names it",
          "[coordinator][durable]") {
  data::testing::TempDir dir;
  Loop loop;
  {
    std::vector<std::string> replay;
    auto log = open(loop, dir.path(), &replay, compaction_of(10, {"state 1", "state 2"})).value();
    for (int i = 0; i < 12; ++i) log->enqueue("closure " + std::to_string(i));
    auto synced = log->synced();
    REQUIRE(loop.wait(synced).ok());
    CHECK(log->compactions() >= 1);
    CHECK(log->generation() == log->compactions());
  }
  CHECK_THAT(data::testing::read_bytes(dir.file("CURRENT")), Catch::StartsWith("journal-"));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    CHECK_FALSE(entry.path().extension() == ".log");  // the first journal's segments are gone
  }
  std::vector<std::string> replay;
  auto log = open(loop, dir.path(), &replay).value();
  // The snapshot, then what was enqueued after the last compaction.
  REQUIRE(replay.size() >= 2);
  CHECK(replay[0] == "state 1");
  CHECK(replay[1] == "state 2");
  CHECK(replay.size() < 12);
}

TEST_CASE("compact_if_due rewrites a long replayed journal at once, and leaves a short one",
          "[coordinator][durable]") {
  data::testing::TempDir dir;
  Loop loop;
  {
    std::vector<std::string> replay;
    auto log = open(loop, dir.path(), &replay).value();
    for (int i = 0; i < 30; ++i) REQUIRE(log->append_now("r" + std::to_string(i)).ok());
  }
  {
    std::vector<std::string> replay;
    auto log = open(loop, dir.path(), &replay, compaction_of(100, {"s"})).value();
    REQUIRE(log->compact_if_due().ok());
    CHECK(log->compactions() == 0);  // 30 < min_records
  }
  std::vector<std::string> replay;
  auto log = open(loop, dir.path(), &replay, compaction_of(20, {"s"})).value();
  CHECK(replay.size() == 30);
  REQUIRE(log->compact_if_due().ok());
  CHECK(log->compactions() == 1);
  CHECK(log->records() == 1);
  log.reset();
  std::vector<std::string> after;
  auto reopened = open(loop, dir.path(), &after).value();
  CHECK(after == std::vector<std::string>{"s"});
}

TEST_CASE("CURRENT naming a missing journal is DataLoss naming it", "[coordinator][durable]") {
  data::testing::TempDir dir;
  Loop loop;
  std::ofstream(dir.file("CURRENT")) << "journal-7\n";
  std::vector<std::string> replay;
  auto log = open(loop, dir.path(), &replay);
  REQUIRE(log.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(log.status().message(), Catch::Contains("journal-7") && Catch::Contains("missing"));
}

TEST_CASE("CURRENT that names no journal directory is DataLoss quoting it", "[coordinator][durable]") {
  data::testing::TempDir dir;
  Loop loop;
  std::ofstream(dir.file("CURRENT")) << "../elsewhere\n";
  std::vector<std::string> replay;
  auto log = open(loop, dir.path(), &replay);
  REQUIRE(log.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(log.status().message(), Catch::Contains("'../elsewhere'"));
}

TEST_CASE("a journal a crashed compaction left behind, that CURRENT never named, is removed at open",
          "[coordinator][durable]") {
  data::testing::TempDir dir;
  Loop loop;
  {
    std::vector<std::string> replay;
    auto log = open(loop, dir.path(), &replay).value();
    REQUIRE(log->append_now("kept").ok());
  }
  std::filesystem::create_directories(dir.file("journal-1"));
  std::ofstream(dir.file("journal-1") + "/junk") << "half a snapshot";
  std::vector<std::string> replay;
  auto log = open(loop, dir.path(), &replay).value();
  CHECK(replay == std::vector<std::string>{"kept"});
  CHECK_FALSE(std::filesystem::exists(dir.file("journal-1")));
}

TEST_CASE("a second DurableLog on a work_dir in use is refused", "[coordinator][durable]") {
  data::testing::TempDir dir;
  Loop loop;
  std::vector<std::string> replay;
  auto first = open(loop, dir.path(), &replay).value();
  std::vector<std::string> other;
  auto second = open(loop, dir.path(), &other);
  CHECK(second.status().code() == StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace capstan::coordinator
