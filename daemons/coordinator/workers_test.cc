#include "daemons/coordinator/workers.h"

#include <catch2/catch.hpp>

#include "daemons/coordinator/test_fakes.h"

namespace capstan::coordinator {
namespace {

using testing::WorkerRecord;

struct Fixture : testing::CoordinatorParts {
  Fixture() {
    requeue = [this](int64_t id) {
      requeued_for.push_back(id);
      return size_t{2};
    };
  }
  int64_t add(int task_index, std::set<std::string> functions = {"train_step"}) {
    return add_worker(record, task_index, std::move(functions));
  }

  std::vector<int64_t> requeued_for;
  WorkerRecord record;  // every peer's; they hold it and never touch it as they go
};

TEST_CASE("a worker without a task index gets the lowest one no registered worker has", "[coordinator][workers]") {
  Fixture f;
  int64_t a = f.add(0);
  int64_t b = f.add(2);
  int64_t c = f.add(-1);
  int64_t d = f.add(-1);
  CHECK(f.workers.task_index(a) == 0);
  CHECK(f.workers.task_index(b) == 2);
  CHECK(f.workers.task_index(c) == 1);
  CHECK(f.workers.task_index(d) == 3);
  // A given index another worker has is kept (both shard alike).
  int64_t e = f.add(2);
  CHECK(f.workers.task_index(e) == 2);
  CHECK(f.workers.task_index(99) == -1);
  CHECK(f.workers.size() == 5);
  CHECK(std::set<int64_t>{a, b, c, d, e}.size() == 5);
}

TEST_CASE("replica candidates are the workers with the function, not leaving, by task index",
          "[coordinator][workers]") {
  Fixture f;
  int64_t late = f.add(3);
  int64_t first = f.add(0);
  int64_t other = f.add(1, {"eval_step"});
  int64_t leaving = f.add(2);
  f.workers.find(leaving)->leaving = true;
  CHECK(f.workers.replica_candidates("train_step") == std::vector<int64_t>{first, late});
  CHECK(f.workers.replica_candidates("eval_step") == std::vector<int64_t>{other});
  CHECK(f.workers.any_has("eval_step"));
  CHECK_FALSE(f.workers.any_has("predict"));
  CHECK(f.workers.functions() == std::set<std::string>{"eval_step", "train_step"});
  auto targets = f.workers.targets();
  REQUIRE(targets.size() == 4);
  CHECK(targets[0].id == late);
  CHECK(targets[0].task_index == 3);
}

TEST_CASE("dropping a worker re-queues its closures, forgets it and wakes what waits for it",
          "[coordinator][workers]") {
  Fixture f;
  int64_t id = f.add(0);
  bool gone = false;
  auto waiting = f.workers.dropped(id).then([&]() { gone = true; }).eagerlyEvaluate(nullptr);
  f.ws.poll();
  CHECK_FALSE(gone);
  f.workers.drop(id, Status::Unavailable("link broken"));
  f.ws.poll();
  CHECK(gone);
  CHECK(f.requeued_for == std::vector<int64_t>{id});
  CHECK(f.notified == 1);
  CHECK_FALSE(f.workers.alive(id));
  // Unknown ids: nothing happens, and waiting for one resolves at once.
  f.workers.drop(id, Status::Unavailable("again"));
  CHECK(f.requeued_for.size() == 1);
  CHECK(f.workers.dropped(id).poll(f.ws));
}

TEST_CASE("a worker that leaves is forgotten without re-queueing anything", "[coordinator][workers]") {
  Fixture f;
  int64_t id = f.add(0);
  bool gone = false;
  auto waiting = f.workers.dropped(id).then([&]() { gone = true; }).eagerlyEvaluate(nullptr);
  CHECK(f.workers.remove(id));
  f.ws.poll();
  CHECK(gone);
  CHECK(f.requeued_for.empty());
  CHECK(f.notified == 0);
  CHECK_FALSE(f.workers.remove(id));
}

}  // namespace
}  // namespace capstan::coordinator
