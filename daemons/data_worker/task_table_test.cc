// The data worker's task table and heartbeat backoff, without sockets.
#include "daemons/data_worker/task_table.h"

#include <catch2/catch.hpp>

#include <string>

namespace capstan::data_worker {
namespace {

using namespace std::chrono_literals;

struct FakeTask {
  std::string name;
};
using Table = TaskTable<FakeTask>;

std::shared_ptr<FakeTask> task(std::string name) { return std::make_shared<FakeTask>(FakeTask{std::move(name)}); }

TEST_CASE("task table: an assigned task is built once, then serves", "[data_worker]") {
  Table t;
  CHECK(t.assign(7));
  CHECK_FALSE(t.assign(7));  // building: not again
  std::shared_ptr<FakeTask> found;
  CHECK(t.lookup(7, &found) == Table::State::kBuilding);
  CHECK(t.current_ids() == std::vector<int64_t>{7});  // building tasks are reported
  CHECK(t.built(7, task("seven")) == nullptr);
  CHECK(t.lookup(7, &found) == Table::State::kServing);
  CHECK(found->name == "seven");
  CHECK_FALSE(t.assign(7));  // serving: not again
  CHECK(t.size() == 1);
}

TEST_CASE("task table: a heartbeat deletion destroys a serving task, an unknown one is a no-op", "[data_worker]") {
  Table t;
  t.assign(1);
  t.built(1, task("one"));
  auto removed = t.remove(1);
  REQUIRE(removed != nullptr);
  CHECK(removed->name == "one");
  std::shared_ptr<FakeTask> found;
  CHECK(t.lookup(1, &found) == Table::State::kUnknown);
  CHECK(t.remove(99) == nullptr);
  CHECK(t.current_ids().empty());
}

TEST_CASE("task table: a task deleted while building is dropped when built, unless assigned again",
          "[data_worker]") {
  Table t;
  t.assign(3);
  CHECK(t.remove(3) == nullptr);  // building: dropped later
  std::shared_ptr<FakeTask> found;
  CHECK(t.lookup(3, &found) == Table::State::kUnknown);
  CHECK(t.current_ids().empty());
  CHECK(t.size() == 0);
  auto dropped = t.built(3, task("three"));
  REQUIRE(dropped != nullptr);  // the caller destroys it
  CHECK(t.lookup(3, &found) == Table::State::kUnknown);

  t.assign(4);
  t.remove(4);
  CHECK_FALSE(t.assign(4));  // assigned again while still building: keep it
  CHECK(t.built(4, task("four")) == nullptr);
  CHECK(t.lookup(4, &found) == Table::State::kServing);
}

TEST_CASE("task table: a failed build is forgotten, so the next assignment builds again", "[data_worker]") {
  Table t;
  t.assign(5);
  t.build_failed(5);
  std::shared_ptr<FakeTask> found;
  CHECK(t.lookup(5, &found) == Table::State::kUnknown);
  CHECK(t.assign(5));
}

TEST_CASE("task table: a finished task is reported until the dispatcher acknowledges, and reads as ended after "
          "deletion",
          "[data_worker]") {
  Table t;
  t.assign(8);
  t.built(8, task("eight"));
  CHECK(t.mark_finished(8));
  CHECK_FALSE(t.mark_finished(8));  // once
  CHECK(t.start_finish(8));
  CHECK_FALSE(t.start_finish(8));  // one call in flight
  CHECK(t.finishes_to_retry().empty());
  t.finish_failed(8);  // the dispatcher is away
  CHECK(t.finishes_to_retry() == std::vector<int64_t>{8});
  CHECK(t.start_finish(8));
  t.finish_done(8);
  CHECK(t.finishes_to_retry().empty());

  t.remove(8);
  std::shared_ptr<FakeTask> found;
  CHECK(t.lookup(8, &found) == Table::State::kFinishedAndDeleted);
}

TEST_CASE("task table: deleting a task stops reporting its finish", "[data_worker]") {
  Table t;
  t.assign(9);
  t.built(9, task("nine"));
  t.mark_finished(9);
  t.start_finish(9);
  t.finish_failed(9);
  t.remove(9);
  CHECK(t.finishes_to_retry().empty());
}

TEST_CASE("task table: shutting down takes every serving task", "[data_worker]") {
  Table t;
  t.assign(1);
  t.assign(2);
  t.built(1, task("one"));
  auto all = t.take_all();
  REQUIRE(all.size() == 1);
  CHECK(all[0]->name == "one");
  std::shared_ptr<FakeTask> found;
  CHECK(t.lookup(1, &found) == Table::State::kUnknown);
}

TEST_CASE("heartbeat backoff: doubles while the dispatcher is away, up to the cap, and resets", "[data_worker]") {
  HeartbeatBackoff b(200ms, 1000ms);
  CHECK(b.delay() == 200ms);
  CHECK(b.failed());        // the outage starts: log it
  CHECK_FALSE(b.failed());  // still down: log nothing
  CHECK(b.delay() == 800ms);
  b.failed();
  CHECK(b.delay() == 1000ms);  // capped
  CHECK(b.dispatcher_down());
  CHECK(b.succeeded());  // it was down
  CHECK(b.delay() == 200ms);
  CHECK_FALSE(b.succeeded());
  // An interval above the cap is the cap.
  HeartbeatBackoff slow(3000ms, 1000ms);
  slow.failed();
  CHECK(slow.delay() == 3000ms);
}

TEST_CASE("heartbeat backoff: the dispatcher may ask for a longer interval, never a shorter one", "[data_worker]") {
  HeartbeatBackoff b(200ms, 1000ms);
  b.succeeded(750ms);
  CHECK(b.delay() == 750ms);
  b.succeeded(50ms);  // shorter than ours: ours
  CHECK(b.delay() == 200ms);
  b.succeeded(0ms);  // no request
  CHECK(b.delay() == 200ms);
}

}  // namespace
}  // namespace capstan::data_worker
