// The closure lanes alone: a real queue and worker table, fake workers, a
// manual clock.
#include "daemons/coordinator/closure_lanes.h"

#include <catch2/catch.hpp>

#include "daemons/coordinator/test_fakes.h"

namespace capstan::coordinator {
namespace {

using testing::WorkerRecord;

struct Ended {
  int64_t id;
  ClosureQueue::State state;
  Status error;
};

struct Fixture : testing::CoordinatorParts {
  explicit Fixture(CoordinatorConfig c = {}) : config(std::move(c)) {
    requeue = [this](int64_t id) { return queue.worker_failed(id).size(); };
  }

  int64_t add_worker(WorkerRecord& record) {
    int64_t id = CoordinatorParts::add_worker(record);
    lanes.start(id);
    ws.poll();
    return id;
  }
  int64_t schedule() {
    int64_t id = queue.schedule("train_step", "args").value();
    changes.notify();
    ws.poll();
    return id;
  }
  void advance(kj::Duration d) { CoordinatorParts::advance(d, 10); }

  CoordinatorConfig config;
  ClosureQueue queue;
  std::vector<Ended> ended;
  int stats_updates = 0;
  WorkerTimes times{nullptr};
  ClosureLanes lanes{config, queue, workers, health, variables, gate, context,
                     ClosureLanes::Hooks{[this]() { ++stats_updates; },
                                         [this](int64_t id, ClosureQueue::State state, const Status& error) {
                                           ended.push_back({id, state, error});
                                         }},
                     times};
};

TEST_CASE("a lane runs each queued closure on its worker and records the value", "[coordinator][lanes]") {
  WorkerRecord record;  // outlives the fixture's peers
  Fixture f;
  int64_t worker = f.add_worker(record);
  int64_t id = f.schedule();
  REQUIRE(record.runs.size() == 1);
  CHECK(record.runs[0].run.closure_id == id);
  CHECK(record.runs[0].run.worker_index == 0);
  CHECK(record.runs[0].run.num_workers == 1);
  CHECK(record.runs[0].run.attempt == 1);
  CHECK(f.stats_updates == 1);
  record.reply(0, std::string("value"));
  f.ws.poll();
  REQUIRE(f.ended.size() == 1);
  CHECK(f.ended[0].id == id);
  CHECK(f.ended[0].state == ClosureQueue::State::kDone);
  CHECK(f.queue.value(id).value() == "value");
  CHECK(f.workers.alive(worker));
}

TEST_CASE("a run whose worker is lost goes back to the queue and runs on another worker", "[coordinator][lanes]") {
  WorkerRecord first, second;
  Fixture f;
  int64_t lost = f.add_worker(first);
  int64_t id = f.schedule();
  REQUIRE(first.runs.size() == 1);
  f.add_worker(second);
  first.reply(0, Status::Unavailable("link broken"), /*worker_lost=*/true);
  f.ws.poll();
  CHECK_FALSE(f.workers.alive(lost));
  CHECK(f.ended.empty());
  REQUIRE(second.runs.size() == 1);
  CHECK(second.runs[0].run.closure_id == id);
  CHECK(second.runs[0].run.attempt == 2);
}

TEST_CASE("a run that failed while a parameter server was lost runs again", "[coordinator][lanes]") {
  WorkerRecord record;  // outlives the fixture's peers
  Fixture f;
  f.add_worker(record);
  int64_t id = f.schedule();
  REQUIRE(record.runs.size() == 1);
  // The parameter server goes down and comes back while the closure runs.
  f.health.set(0, PsHealth::State::kDown, Status::Ok(), f.timer.now());
  f.health.set(0, PsHealth::State::kUp, Status::Ok(), f.timer.now());
  record.reply(0, Status::NotFound("no shard w/part_0"));
  f.ws.poll();
  REQUIRE(f.ended.size() == 1);
  CHECK(f.ended[0].state == ClosureQueue::State::kQueued);
  REQUIRE(record.runs.size() == 2);
  CHECK(record.runs[1].run.closure_id == id);
}

TEST_CASE("nothing starts while the gate is paused, a drained gate ends the lanes", "[coordinator][lanes]") {
  WorkerRecord record;  // outlives the fixture's peers
  Fixture f;
  f.add_worker(record);
  auto pause = f.gate.pause([&f]() { f.changes.notify(); });
  f.schedule();
  CHECK(record.runs.empty());
  pause.reset();
  f.ws.poll();
  REQUIRE(record.runs.size() == 1);
  f.gate.drain();
  record.reply(0, std::string("value"));
  f.ws.poll();
  f.schedule();
  CHECK(record.runs.size() == 1);
  CHECK(f.queue.queued() == 1);
}

TEST_CASE("closure_timeout fails a run that takes longer and tells its worker to stop", "[coordinator][lanes]") {
  CoordinatorConfig config;
  config.closure_timeout = std::chrono::milliseconds(1000);
  WorkerRecord record;
  Fixture f(config);
  f.add_worker(record);
  int64_t id = f.schedule();
  REQUIRE(record.runs.size() == 1);
  CHECK(record.runs[0].run.deadline_unix_ms > 0);
  f.advance(1000 * kj::MILLISECONDS);
  REQUIRE(f.ended.size() == 1);
  CHECK(f.ended[0].state == ClosureQueue::State::kFailed);
  CHECK(f.ended[0].error.code() == StatusCode::kDeadlineExceeded);
  CHECK(record.cancels == std::vector<int64_t>{id});
}

TEST_CASE("a worker that stops answering pings is dropped", "[coordinator][lanes]") {
  CoordinatorConfig config;
  config.worker_ping_interval = std::chrono::milliseconds(1000);
  config.worker_ping_timeout = std::chrono::milliseconds(1000);
  WorkerRecord record;
  Fixture f(config);
  int64_t id = f.add_worker(record);
  f.advance(1000 * kj::MILLISECONDS);
  CHECK(record.pings == 1);
  CHECK(f.workers.alive(id));
  record.answer_pings = false;
  f.advance(1000 * kj::MILLISECONDS);
  CHECK(record.pings == 2);
  f.advance(1000 * kj::MILLISECONDS);
  CHECK_FALSE(f.workers.alive(id));
}

}  // namespace
}  // namespace capstan::coordinator
