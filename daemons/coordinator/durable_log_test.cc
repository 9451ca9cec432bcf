// DurableLog alone: a real journal in a temporary directory, its batches
// written on a real pool.
#include "daemons/coordinator/durable_log.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "daemons/coordinator/test_fakes.h"
#include "data/test_util.h"

namespace capstan::coordinator {
namespace {

// A work_dir of its own and what a DurableLog needs.
struct Fixture : testing::CoordinatorParts {
  ~Fixture() { pool.join(); }  // before the directory goes

  // Opens the journal in `dir`; what it replays goes to `replayed`.
  Result<std::unique_ptr<DurableLog>> open(DurableLog::Compaction compaction = {}) {
    replayed.clear();
    return DurableLog::open(dir.path(), pool, log, std::move(compaction), &replayed);
  }

  data::testing::TempDir dir;
  std::vector<std::string> replayed;  // by the last open()
};

// A state of `live` records for compaction to write.
DurableLog::Compaction compaction_of(int64_t min_records, std::vector<std::string> live) {
  DurableLog::Compaction c;
  c.min_records = min_records;
  c.live_records = [live]() { return static_cast<int64_t>(live.size()); };
  c.snapshot = [live]() { return live; };
  return c;
}

TEST_CASE("records appended at once and enqueued are replayed in their order after reopening",
          "[coordinator][durable]") {
  Fixture f;
  {
    auto log = f.open().value();
    CHECK(f.replayed.empty());
    REQUIRE(log->append_now("variable").ok());
    for (int i = 0; i < 50; ++i) log->enqueue("closure " + std::to_string(i));
    auto synced = log->synced();
    REQUIRE(f.wait(synced).ok());
    CHECK(log->records() == 51);
  }
  auto log = f.open().value();
  REQUIRE(f.replayed.size() == 51);
  CHECK(f.replayed.front() == "variable");
  CHECK(f.replayed.back() == "closure 49");
  CHECK(log->records() == 51);
}

TEST_CASE("synced resolves at once when nothing is enqueued, and after the batch that holds the last record",
          "[coordinator][durable]") {
  Fixture f;
  auto log = f.open().value();
  auto idle = log->synced();
  CHECK(idle.poll(f.ws));
  log->enqueue("a");
  auto first = log->synced();
  log->enqueue("b");  // waits for the batch of "a" to end, then goes in the next
  auto second = log->synced();
  REQUIRE(f.wait(first).ok());
  REQUIRE(f.wait(second).ok());
  log.reset();
  auto reopened = f.open().value();
  CHECK(f.replayed == std::vector<std::string>{"a", "b"});
}

TEST_CASE("past min_records and twice the live records, the journal becomes the snapshot and CURRENT names it",
          "[coordinator][durable]") {
  Fixture f;
  {
    auto log = f.open(compaction_of(10, {"state 1", "state 2"})).value();
    for (int i = 0; i < 12; ++i) log->enqueue("closure " + std::to_string(i));
    auto synced = log->synced();
    REQUIRE(f.wait(synced).ok());
    CHECK(log->compactions() >= 1);
    CHECK(log->generation() == log->compactions());
  }
  CHECK_THAT(data::testing::read_bytes(f.dir.file("CURRENT")), Catch::StartsWith("journal-"));
  for (const auto& entry : std::filesystem::directory_iterator(f.dir.path())) {
    CHECK_FALSE(entry.path().extension() == ".log");  // the first journal's segments are gone
  }
  auto log = f.open().value();
  // The snapshot, then what was enqueued after the last compaction.
  REQUIRE(f.replayed.size() >= 2);
  CHECK(f.replayed[0] == "state 1");
  CHECK(f.replayed[1] == "state 2");
  CHECK(f.replayed.size() < 12);
}

TEST_CASE("compact_if_due rewrites a long replayed journal at once, and leaves a short one",
          "[coordinator][durable]") {
  Fixture f;
  {
    auto log = f.open().value();
    for (int i = 0; i < 30; ++i) REQUIRE(log->append_now("r" + std::to_string(i)).ok());
  }
  {
    auto log = f.open(compaction_of(100, {"s"})).value();
    REQUIRE(log->compact_if_due().ok());
    CHECK(log->compactions() == 0);  // 30 < min_records
  }
  auto log = f.open(compaction_of(20, {"s"})).value();
  CHECK(f.replayed.size() == 30);
  REQUIRE(log->compact_if_due().ok());
  CHECK(log->compactions() == 1);
  CHECK(log->records() == 1);
  log.reset();
  auto reopened = f.open().value();
  CHECK(f.replayed == std::vector<std::string>{"s"});
}

TEST_CASE("CURRENT naming a missing journal is DataLoss naming it", "[coordinator][durable]") {
  Fixture f;
  std::ofstream(f.dir.file("CURRENT")) << "journal-7\n";
  auto log = f.open();
  REQUIRE(log.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(log.status().message(), Catch::Contains("journal-7") && Catch::Contains("missing"));
}

TEST_CASE("CURRENT that names no journal directory is DataLoss quoting it", "[coordinator][durable]") {
  Fixture f;
  std::ofstream(f.dir.file("CURRENT")) << "../elsewhere\n";
  auto log = f.open();
  REQUIRE(log.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(log.status().message(), Catch::Contains("'../elsewhere'"));
}

TEST_CASE("a journal a crashed compaction left behind, that CURRENT never named, is removed at open",
          "[coordinator][durable]") {
  Fixture f;
  {
    auto log = f.open().value();
    REQUIRE(log->append_now("kept").ok());
  }
  std::filesystem::create_directories(f.dir.file("journal-1"));
  std::ofstream(f.dir.file("journal-1") + "/junk") << "half a snapshot";
  auto log = f.open().value();
  CHECK(f.replayed == std::vector<std::string>{"kept"});
  CHECK_FALSE(std::filesystem::exists(f.dir.file("journal-1")));
}

TEST_CASE("a second DurableLog on a work_dir in use is refused", "[coordinator][durable]") {
  Fixture f;
  auto first = f.open().value();
  auto second = f.open();
  CHECK(second.status().code() == StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace capstan::coordinator
