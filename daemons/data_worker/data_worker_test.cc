#include "daemons/data_worker/data_worker.h"

#include <catch2/catch.hpp>

#include <algorithm>

#include "daemons/data_worker/test_fakes.h"

namespace capstan::data_worker {
namespace {

using testing::Harness;
using testing::range_task;

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(i);
  return out;
}

std::vector<int64_t> sequences_of(const std::vector<SplitRequest>& calls, int64_t task_id) {
  std::vector<int64_t> out;
  for (const SplitRequest& call : calls) {
    if (call.task_id == task_id) out.push_back(call.sequence);
  }
  return out;
}

}  // namespace

TEST_CASE("a heartbeat reply's new tasks are built, served and reported, its deletions drop them",
          "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.replies.push_back({{range_task(1, 7, 5)}, {}});
  h.start();
  REQUIRE(h.dispatcher.heartbeats.size() == 1);
  CHECK(h.dispatcher.heartbeats[0].empty());
  CHECK(h.worker->current_tasks() == std::vector<int64_t>{1});  // building counts

  // Serving: the first elements come (a request while building gets none).
  std::vector<int64_t> got;
  REQUIRE(h.run_until([&]() {
    auto reply = h.get(1, 2);
    REQUIRE(reply.ok());
    for (const Element& e : reply->reply.elements) got.push_back(testing::value_of(e));
    return !got.empty();
  }));
  CHECK(got.front() == 0);
  CHECK(h.worker->stats()->tasks.load() == 1);

  h.next_heartbeat();
  REQUIRE(h.dispatcher.heartbeats.size() == 2);
  CHECK(h.dispatcher.heartbeats[1] == std::vector<int64_t>{1});

  // The same task again (the dispatcher's reply crossed this heartbeat) is
  // not built twice; a deletion drops it.
  h.dispatcher.replies.push_back({{range_task(1, 7, 5)}, {}});
  h.next_heartbeat();
  CHECK(h.worker->current_tasks() == std::vector<int64_t>{1});
  h.dispatcher.replies.push_back({{}, {1}});
  h.next_heartbeat();
  CHECK(h.dispatcher.heartbeats.back() == std::vector<int64_t>{1});  // sent before the reply
  CHECK(h.worker->current_tasks().empty());
  CHECK(h.worker->stats()->tasks.load() == 0);
  auto gone = h.get(1);
  CHECK(gone.status().code() == StatusCode::kNotFound);
  CHECK_THAT(gone.status().message(), Catch::Contains("no task 1 on this worker"));
  h.next_heartbeat();
  CHECK(h.dispatcher.heartbeats.back().empty());
}

TEST_CASE("a task deleted while its pipeline is built is dropped once built", "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.replies.push_back({{range_task(3, 7, 5)}, {3}});  // added and deleted in one reply
  h.start();
  CHECK(h.worker->current_tasks().empty());
  CHECK(h.get(3).status().code() == StatusCode::kNotFound);
  // Once its build has ended (well within this), it is still gone.
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  h.run_until([&]() { return std::chrono::steady_clock::now() > until; });
  CHECK(h.worker->current_tasks().empty());
  CHECK(h.get(3).status().code() == StatusCode::kNotFound);
  CHECK(h.worker->stats()->tasks.load() == 0);
}

TEST_CASE("a task whose pipeline cannot be built hands its error to consumers", "[data-service][data-worker]") {
  Harness h;
  TaskSpec bad = range_task(4, 9, 5);
  bad.definition = "not a dataset";
  h.dispatcher.replies.push_back({{bad}, {}});
  h.start();
  Harness::Read read = h.read_all(4);
  CHECK(read.values.empty());
  CHECK_FALSE(read.error.ok());
  CHECK_THAT(read.error.message(), Catch::Contains("task 4 (job 9, dataset ds-range-5)"));
}

TEST_CASE("bad getElements requests are refused with the offending value", "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.replies.push_back({{range_task(1, 7, 5)}, {}});
  h.start();
  // Requests are checked once the task serves (while it builds, every
  // request gets "none yet").
  REQUIRE(h.run_until([&]() { return h.get(1, 1).value().from_runner; }));
  CHECK(h.get(2).status().code() == StatusCode::kNotFound);
  auto zero = h.get(1, 0);
  CHECK(zero.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(zero.status().message(), Catch::Contains("maxElements must be positive, got 0"));
  ElementsRequest negative;
  negative.task_id = 1;
  negative.get.max_bytes = -5;
  auto refused = h.worker->get_elements(std::move(negative)).wait(h.io.waitScope);
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("got -5"));
}

TEST_CASE("a task's end is reported with finishTask once, retried after the dispatcher answers heartbeats again",
          "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.replies.push_back({{range_task(1, 7, 3)}, {}});
  h.dispatcher.finish_answers.push_back(Status::Unavailable("dispatcher:5050 is restarting"));
  h.start();
  Harness::Read read = h.read_all(1);  // end_sent(1) at the end
  CHECK(read.values == iota(3));
  REQUIRE(read.ended);

  // The dispatcher went away: finishTask failed, and so do the heartbeats,
  // which back off (interval doubling) without retrying it.
  h.dispatcher.down = true;
  h.settle();
  REQUIRE(h.dispatcher.finishes == std::vector<int64_t>{1});
  h.worker->end_sent(1);  // a second consumer saw the end: no second call
  h.settle();
  CHECK(h.dispatcher.finishes.size() == 1);
  for (int i = 0; i < 8; ++i) h.next_heartbeat();
  CHECK(h.worker->stats()->heartbeat_failures.load() >= 2);
  CHECK(h.worker->stats()->heartbeat_failures.load() < 8);  // backed off
  CHECK(h.dispatcher.finishes.size() == 1);

  // It answers again: the heartbeat after that sends finishTask again.
  h.dispatcher.down = false;
  for (int i = 0; i < 8 && h.dispatcher.finishes.size() < 2; ++i) h.next_heartbeat();
  CHECK(h.dispatcher.finishes == std::vector<int64_t>{1, 1});
  // Accepted: never sent again, and the task keeps ending for late readers.
  h.next_heartbeat();
  h.next_heartbeat();
  CHECK(h.dispatcher.finishes.size() == 2);
  h.dispatcher.replies.push_back({{}, {1}});
  h.next_heartbeat();
  auto late = h.get(1);
  REQUIRE(late.ok());
  CHECK(late->reply.end_of_sequence);
}

TEST_CASE("a finishTask the dispatcher refuses is not sent again", "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.replies.push_back({{range_task(1, 7, 2)}, {}});
  h.dispatcher.finish_answers.push_back(Status::FailedPrecondition("task 1 is not assigned to worker:6000"));
  h.start();
  REQUIRE(h.read_all(1).ended);
  h.settle();
  h.next_heartbeat();
  h.next_heartbeat();
  CHECK(h.dispatcher.finishes == std::vector<int64_t>{1});
}

TEST_CASE("a getSplit that fails transiently is retried with the same sequence number",
          "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.set_range_splits(7, 6, 2);  // three splits
  h.dispatcher.split_failures = {Status::Unavailable("dispatcher restarting"),
                                 Status::DeadlineExceeded("getSplit did not finish within 10000 ms")};
  h.dispatcher.replies.push_back({{range_task(1, 7, 6, wire::ProcessingMode::DYNAMIC)}, {}});
  h.start();
  Harness::Read read = h.read_all(1);
  INFO(read.error.to_string());
  CHECK(read.ended);
  CHECK(read.values == iota(6));  // nothing lost, nothing twice
  // Two failed tries of split 0, then 0, 1, 2 and the end (3).
  CHECK(sequences_of(h.dispatcher.split_calls, 1) == std::vector<int64_t>{0, 0, 0, 1, 2, 3});
  CHECK(h.worker->stats()->splits_fetched.load() == 3);
}

TEST_CASE("a getSplit the dispatcher refuses reaches the consumer, naming the split, the task and the job",
          "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.set_range_splits(7, 6, 2);
  h.dispatcher.split_failures = {Status::InvalidArgument("sequence 0 of task 1 is past the next (-1)")};
  h.dispatcher.replies.push_back({{range_task(1, 7, 6, wire::ProcessingMode::DYNAMIC)}, {}});
  h.start();
  Harness::Read read = h.read_all(1);
  CHECK(read.values.empty());
  CHECK(read.error.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(read.error.message(), Catch::Contains("getting split 0 of task 1 (job 7, source 0) from the dispatcher") &&
                                       Catch::Contains("is past the next"));
  // Not retried with backoff: the refusal went to the consumer as the
  // pipeline's error (the next pull asks again, as a local iterator would).
  REQUIRE_FALSE(h.dispatcher.split_calls.empty());
  CHECK(h.dispatcher.split_calls.front().sequence == 0);
}

TEST_CASE("a DYNAMIC task that cannot reach the dispatcher for its retry window fails with Unavailable",
          "[data-service][data-worker]") {
  DataWorkerConfig config = testing::fast_config();
  config.split_retry.window = std::chrono::milliseconds(50);
  Harness h(config);
  h.dispatcher.replies.push_back({{range_task(1, 7, 6, wire::ProcessingMode::DYNAMIC)}, {}});
  // Only getSplit fails: the heartbeat assigns the task, and the task's very
  // first split request already finds the dispatcher away.
  h.dispatcher.splits_down = true;
  h.start();
  Harness::Read read = h.read_all(1);
  CHECK(read.error.code() == StatusCode::kUnavailable);
  CHECK_THAT(read.error.message(), Catch::Contains("retried for 50 ms"));
  std::vector<int64_t> tries = sequences_of(h.dispatcher.split_calls, 1);
  CHECK(tries.size() > 1);
  CHECK(std::all_of(tries.begin(), tries.end(), [](int64_t s) { return s == 0; }));
}

TEST_CASE("a task moved here from a lost worker runs beside this worker's task of the job and replays its splits",
          "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.set_range_splits(7, 8, 2);  // four splits
  // Task 2 ran on a worker now lost and had leased the job's first split.
  h.dispatcher.lease(7, 2, 0);
  h.dispatcher.replies.push_back({{range_task(1, 7, 8, wire::ProcessingMode::DYNAMIC)}, {}});
  h.start();
  // The dispatcher's ReassignTask: task 2 comes in a later reply.
  h.dispatcher.replies.push_back({{range_task(2, 7, 8, wire::ProcessingMode::DYNAMIC)}, {}});
  h.next_heartbeat();
  CHECK(h.worker->current_tasks() == std::vector<int64_t>{1, 2});

  Harness::Read own = h.read_all(1);
  Harness::Read moved = h.read_all(2);
  REQUIRE(own.ended);
  REQUIRE(moved.ended);
  // Its leased split again, from sequence 0.
  std::vector<int64_t> moved_sequences = sequences_of(h.dispatcher.split_calls, 2);
  REQUIRE_FALSE(moved_sequences.empty());
  CHECK(moved_sequences.front() == 0);
  CHECK(std::find(moved.values.begin(), moved.values.end(), 0) != moved.values.end());
  // Between them, every element of the job once.
  std::vector<int64_t> all = own.values;
  all.insert(all.end(), moved.values.begin(), moved.values.end());
  std::sort(all.begin(), all.end());
  CHECK(all == iota(8));

  // Both end and are reported, each once.
  h.settle();
  std::vector<int64_t> finished = h.dispatcher.finishes;
  std::sort(finished.begin(), finished.end());
  CHECK(finished == std::vector<int64_t>{1, 2});
  // Deleting one leaves the other serving.
  h.dispatcher.replies.push_back({{}, {2}});
  h.next_heartbeat();
  CHECK(h.worker->current_tasks() == std::vector<int64_t>{1});
}

TEST_CASE("a consumer's numbered requests in flight reach the runner in their order", "[data-service][data-worker]") {
  Harness h;
  h.dispatcher.replies.push_back({{range_task(1, 7, 40)}, {}});
  h.start();
  // Wait for the task to serve (numbered requests from another client).
  REQUIRE(h.run_until([&]() { return h.get(1, 1, 99, 1).value().from_runner; }));
  std::vector<kj::Promise<Result<ElementsReply>>> in_flight;
  for (int64_t sequence = 1; sequence <= 6; ++sequence) {
    ElementsRequest request;
    request.task_id = 1;
    request.get.client_id = 5;
    request.get.sequence = sequence;
    request.get.acknowledged = 0;
    request.get.max_elements = 2;
    in_flight.push_back(h.worker->get_elements(std::move(request)));
  }
  int64_t last = -1;
  for (auto& promise : in_flight) {
    auto reply = promise.wait(h.io.waitScope);
    REQUIRE(reply.ok());
    for (const Element& e : reply->reply.elements) {
      CHECK(testing::value_of(e) > last);
      last = testing::value_of(e);
    }
  }
  CHECK(last > 0);
}

}  // namespace capstan::data_worker
