#include "journal/group_commit.h"

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/memory_file_system.h"
#include "io/testing.h"
#include "sync/mutex.h"

namespace capstan::journal {
namespace {

using io::testing::SyncGate;

std::unique_ptr<GroupCommitter> open_committer(io::MemoryFileSystem& fs) {
  auto writer = JournalWriter::open("/j", /*sync=*/true, 64 << 20, fs);
  REQUIRE(writer.ok());
  return std::make_unique<GroupCommitter>(std::move(*writer));
}

TEST_CASE("group commit: records queued during an fsync go out together with one more fsync") {
  io::MemoryFileSystem fs;
  auto committer = open_committer(fs);
  const int64_t syncs_before = fs.file_syncs();
  SyncGate gate;
  fs.on_sync([&gate]() { gate.pass(); });

  const uint64_t first = committer->enqueue("r1");
  Status first_status;
  std::thread leader([&]() { first_status = committer->wait_durable(first); });
  gate.wait_for_arrival();  // r1's fsync is in flight

  constexpr int kFollowers = 8;
  std::vector<Status> statuses(kFollowers);
  std::vector<std::thread> followers;
  for (int i = 0; i < kFollowers; ++i) {
    const uint64_t ticket = committer->enqueue("r" + std::to_string(i + 2));
    followers.emplace_back([&, i, ticket]() { statuses[static_cast<size_t>(i)] = committer->wait_durable(ticket); });
  }
  CHECK_FALSE(committer->is_durable(first));
  gate.open();
  leader.join();
  for (auto& t : followers) t.join();

  CHECK(first_status.ok());
  for (const Status& s : statuses) CHECK(s.ok());
  CHECK(committer->batches_written() == 2);
  CHECK(fs.file_syncs() - syncs_before == 2);  // not 1 + kFollowers

  // Every acknowledged record survives a crash, in order.
  fs.crash();
  committer.reset();
  auto records = read_all("/j", fs);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 1 + kFollowers);
  for (int i = 0; i < 1 + kFollowers; ++i) CHECK((*records)[static_cast<size_t>(i)] == "r" + std::to_string(i + 1));
}

TEST_CASE("group commit: many threads queueing and waiting at once all get durable records") {
  io::MemoryFileSystem fs;
  auto committer = open_committer(fs);
  constexpr int kThreads = 16;
  std::vector<std::thread> threads;
  std::vector<Status> statuses(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i]() {
      statuses[static_cast<size_t>(i)] = committer->wait_durable(committer->enqueue("t" + std::to_string(i)));
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : statuses) CHECK(s.ok());
  CHECK(committer->batches_written() <= kThreads);
  fs.crash();
  committer.reset();
  auto records = read_all("/j", fs);
  REQUIRE(records.ok());
  CHECK(records->size() == kThreads);
}

TEST_CASE("group commit: a failed fsync fails the waiters of its batch and every later one") {
  io::MemoryFileSystem fs;
  auto committer = open_committer(fs);
  REQUIRE(committer->wait_durable(committer->enqueue("fine")).ok());
  CHECK(committer->health().ok());

  fs.fail_next_sync(Status::DataLoss("Input/output error"));
  Status failed = committer->wait_durable(committer->enqueue("lost"));
  CHECK(failed.code() == StatusCode::kDataLoss);
  CHECK(committer->health().code() == StatusCode::kFailedPrecondition);
  CHECK(committer->health().message().find("Input/output error") != std::string::npos);
  CHECK(committer->wait_durable(committer->enqueue("later")) == failed);
  // What was durable stays so.
  CHECK(committer->wait_durable(1).ok());
}

TEST_CASE("group commit: records still queued are written when the committer goes") {
  io::MemoryFileSystem fs;
  auto committer = open_committer(fs);
  committer->enqueue("a");
  committer->enqueue("b");
  CHECK(committer->last_ticket() == 2);
  CHECK(committer->batches_written() == 0);
  committer.reset();
  auto records = read_all("/j", fs);
  REQUIRE(records.ok());
  CHECK(*records == std::vector<std::string>{"a", "b"});
}

TEST_CASE("group commit: waiting for what is durable already writes nothing") {
  io::MemoryFileSystem fs;
  auto committer = open_committer(fs);
  CHECK(committer->wait_durable(0).ok());
  const uint64_t ticket = committer->enqueue("x");
  REQUIRE(committer->wait_durable(ticket).ok());
  const int64_t syncs = fs.file_syncs();
  CHECK(committer->wait_durable(ticket).ok());
  CHECK(committer->is_durable(ticket));
  CHECK(fs.file_syncs() == syncs);
  CHECK(committer->batches_written() == 1);
}

}  // namespace
}  // namespace capstan::journal
