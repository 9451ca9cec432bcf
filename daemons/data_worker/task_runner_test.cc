#include "daemons/data_worker/task_runner.h"

#include <catch2/catch.hpp>

namespace capstan::data_worker {
namespace {

using data::Dataset;

std::unique_ptr<data::Iterator> iterate(const Dataset& ds, const FunctionRegistry* fns = nullptr) {
  auto it = ds.make_iterator(fns);
  REQUIRE(it.ok());
  return std::move(*it);
}

int64_t value(const Element& e) { return e.components.at(0).flat<int64_t>()[0]; }

TaskRunner::Request take(int n) {
  TaskRunner::Request r;
  r.max_elements = n;
  r.wait = std::chrono::milliseconds(2000);
  return r;
}

// A numbered request of `client`: `sequence`, having `received` elements.
TaskRunner::Request numbered(int64_t client, int64_t sequence, int64_t received, int n = 3) {
  TaskRunner::Request r = take(n);
  r.client_id = client;
  r.sequence = sequence;
  r.received = received;
  return r;
}

std::vector<int64_t> values(const TaskRunner::Reply& reply) {
  std::vector<int64_t> out;
  for (const auto& e : reply.elements) out.push_back(value(e));
  return out;
}

// Waits until the runner's producer has buffered `n` elements (a fixed sleep
// is not enough for a thread that a loaded machine keeps waiting).
void wait_buffered(const TaskRunner& runner, int64_t n) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (runner.produced() < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(runner.produced() >= n);
}

}  // namespace

TEST_CASE("a numbered request asked again gets the same reply, the next number gets new elements",
          "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(20)), {});
  wait_buffered(runner, 20);  // full batches
  auto first = runner.get(numbered(7, 1, 0));
  REQUIRE(first.ok());
  CHECK(values(*first) == std::vector<int64_t>{0, 1, 2});
  // The reply was lost on the way: the retry carries the same number.
  CHECK(values(runner.get(numbered(7, 1, 0)).value()) == std::vector<int64_t>{0, 1, 2});
  // Another client's numbers are its own.
  CHECK(values(runner.get(numbered(8, 1, 0)).value()) == std::vector<int64_t>{3, 4, 5});
  CHECK(values(runner.get(numbered(7, 2, 3)).value()) == std::vector<int64_t>{6, 7, 8});
  CHECK(values(runner.get(numbered(7, 2, 3)).value()) == std::vector<int64_t>{6, 7, 8});
  CHECK(values(runner.get(numbered(8, 2, 3)).value()) == std::vector<int64_t>{9, 10, 11});

  auto skipped = runner.get(numbered(7, 5, 6));
  CHECK(skipped.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(skipped.status().message(), Catch::Contains("request number 5 after number 2"));
  CHECK(runner.get(numbered(7, 1, 0)).status().code() == StatusCode::kFailedPrecondition);
  CHECK(runner.get(numbered(-1, 1, 0)).status().code() == StatusCode::kInvalidArgument);
  CHECK(runner.get(numbered(9, 1, -4)).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a rebuilt task skips the elements its consumer already has", "[data-service][task]") {
  // The worker restarted: the consumer has 0..6 and its request number 4
  // (for 7..) never got an answer. The rebuilt pipeline starts from 0 again.
  TaskRunner runner(iterate(Dataset::range(10)), {});
  std::vector<int64_t> got;
  for (int64_t sequence = 4, received = 7;; ++sequence) {
    auto reply = runner.get(numbered(3, sequence, received));
    REQUIRE(reply.ok());
    for (int64_t v : values(*reply)) got.push_back(v);
    received += static_cast<int64_t>(reply->elements.size());
    if (reply->end_of_sequence) break;
  }
  CHECK(got == std::vector<int64_t>{7, 8, 9});
}

TEST_CASE("only the first request of a task can skip: a later consumer reads on", "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(10)), {});
  wait_buffered(runner, 10);
  CHECK(values(runner.get(numbered(1, 1, 0)).value()) == std::vector<int64_t>{0, 1, 2});
  // A second consumer says it has 5 elements (from another worker's task,
  // say): nothing of this task is skipped for it.
  CHECK(values(runner.get(numbered(2, 1, 5)).value()) == std::vector<int64_t>{3, 4, 5});
}

TEST_CASE("a consumer claiming more elements than the task has gets the end", "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(4)), {});
  auto reply = runner.get(numbered(1, 1, 100));
  REQUIRE(reply.ok());
  CHECK(reply->elements.empty());
  CHECK(reply->end_of_sequence);
}

TEST_CASE("first-come requests get elements in order, in batches, then the end", "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(10)), {});
  std::vector<int64_t> got;
  while (true) {
    auto reply = runner.get(take(3));
    REQUIRE(reply.ok());
    CHECK(reply->elements.size() <= 3);
    for (const auto& e : reply->elements) got.push_back(value(e));
    if (reply->end_of_sequence) break;
  }
  CHECK(got == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(runner.get(take(3)).value().end_of_sequence);
}

TEST_CASE("a batch stops at max_bytes but always carries one element", "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(10)), {});
  auto r = take(10);
  r.max_bytes = 20;  // 8 bytes per element
  wait_buffered(runner, 10);  // let the buffer fill
  auto reply = runner.get(r);
  REQUIRE(reply.ok());
  CHECK(reply->elements.size() == 2);
  r.max_bytes = 1;
  CHECK(runner.get(r).value().elements.size() == 1);
}

TEST_CASE("a pipeline error reaches the consumer once, in order", "[data-service][task]") {
  FunctionRegistry fns;
  fns.register_map("fail_on_2", [](Element e) -> Result<Element> {
    if (e.components[0].flat<int64_t>()[0] == 2) return Status::InvalidArgument("two");
    return e;
  });
  TaskRunner runner(iterate(Dataset::range(4).map(data::Fn::named("fail_on_2")), &fns), {});
  std::vector<int64_t> got;
  int errors = 0;
  while (true) {
    auto reply = runner.get(take(10));
    REQUIRE(reply.ok());  // the pipeline's error is in the reply, not a failed call
    if (!reply->pipeline_error.ok()) {
      ++errors;
      CHECK(reply->elements.empty());
      CHECK_THAT(reply->pipeline_error.message(), Catch::Contains("two"));
      continue;
    }
    for (const auto& e : reply->elements) got.push_back(value(e));
    if (reply->end_of_sequence) break;
  }
  CHECK(errors == 1);
  CHECK(got == std::vector<int64_t>{0, 1, 3});
}

TEST_CASE("coordinated reads hand consecutive elements to the consumers of a round", "[data-service][task]") {
  TaskRunner::Options options;
  options.num_consumers = 3;
  TaskRunner runner(iterate(Dataset::range(0, 1000)), options);
  for (int64_t round = 0; round < 4; ++round) {
    for (int64_t c = 2; c >= 0; --c) {  // any order within the round
      TaskRunner::Request r;
      r.consumer_index = c;
      r.round = round;
      auto reply = runner.get(r);
      REQUIRE(reply.ok());
      REQUIRE(reply->elements.size() == 1);
      CHECK(value(reply->elements[0]) == round * 3 + c);
    }
  }
}

TEST_CASE("coordinated read requests are checked", "[data-service][task]") {
  TaskRunner::Options options;
  options.num_consumers = 2;
  TaskRunner runner(iterate(Dataset::range(0, 1000)), options);
  TaskRunner::Request r;
  r.consumer_index = 2;
  r.round = 0;
  CHECK(runner.get(r).status().code() == StatusCode::kInvalidArgument);
  r.consumer_index = -1;
  CHECK(runner.get(r).status().code() == StatusCode::kInvalidArgument);
  r.consumer_index = 0;
  REQUIRE(runner.get(r).ok());
  CHECK(runner.get(r).status().code() == StatusCode::kFailedPrecondition);  // same round twice
}

TEST_CASE("the cross-trainer cache lets a second trainer read the same elements", "[data-service][task]") {
  TaskRunner::Options options;
  options.cross_trainer_cache = true;
  TaskRunner runner(iterate(Dataset::range(0, 1000)), options);
  auto read = [&runner](const std::string& trainer, int n) {
    TaskRunner::Request r;
    r.trainer_id = trainer;
    r.max_elements = n;
    std::vector<int64_t> got;
    auto reply = runner.get(r);  // keep the reply alive while iterating it
    for (const auto& e : reply.value().elements) got.push_back(value(e));
    return got;
  };
  CHECK(read("a", 5) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(read("b", 5) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(runner.produced() == 5);  // produced once, read twice
  CHECK(read("b", 2) == std::vector<int64_t>{5, 6});
  CHECK(read("a", 2) == std::vector<int64_t>{5, 6});
  TaskRunner::Request anonymous;
  CHECK(runner.get(anonymous).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a trainer that falls behind the cache window jumps to its start", "[data-service][task]") {
  TaskRunner::Options options;
  options.cross_trainer_cache = true;
  options.cache_bytes = 8 * 4;  // four int64 elements
  TaskRunner runner(iterate(Dataset::range(0, 1000)), options);
  TaskRunner::Request fast;
  fast.trainer_id = "fast";
  fast.max_elements = 10;
  CHECK(runner.get(fast).value().elements.size() == 10);
  TaskRunner::Request slow;
  slow.trainer_id = "slow";
  auto reply = runner.get(slow).value();
  REQUIRE(reply.elements.size() == 1);
  CHECK(value(reply.elements[0]) == 6);  // the window holds 6..9
}

TEST_CASE("destroying a runner mid-stream stops its producer", "[data-service][task]") {
  auto runner = std::make_unique<TaskRunner>(iterate(Dataset::range(0, int64_t{1} << 40)), TaskRunner::Options{});
  REQUIRE(runner->get(take(4)).ok());
  runner.reset();  // joins; must not hang
  SUCCEED("destroyed");
}

}  // namespace capstan::data_worker

// ---- Requests in flight (a window of numbered requests) ------------------------

namespace capstan::data_worker {
namespace {

// A numbered request of a consumer with several in flight: number
// `sequence`, having acknowledged the replies up to `acknowledged`.
TaskRunner::Request windowed(int64_t sequence, int64_t acknowledged, int64_t received, int n = 2) {
  TaskRunner::Request r = numbered(5, sequence, received, n);
  r.acknowledged = acknowledged;
  return r;
}

}  // namespace

TEST_CASE("requests in flight get consecutive elements in their numbers' order", "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(12)), {});
  wait_buffered(runner, 12);  // full batches
  // Three in flight before any reply arrived: none acknowledged.
  CHECK(values(runner.get(windowed(1, 0, 0)).value()) == std::vector<int64_t>{0, 1});
  CHECK(values(runner.get(windowed(2, 0, 0)).value()) == std::vector<int64_t>{2, 3});
  CHECK(values(runner.get(windowed(3, 0, 0)).value()) == std::vector<int64_t>{4, 5});
  // Reply 1 arrived: request 4 acknowledges it.
  CHECK(values(runner.get(windowed(4, 1, 2)).value()) == std::vector<int64_t>{6, 7});
}

TEST_CASE("a reply lost mid-window is sent again, and so are the replies after it", "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(12)), {});
  wait_buffered(runner, 12);  // full batches
  CHECK(values(runner.get(windowed(1, 0, 0)).value()) == std::vector<int64_t>{0, 1});
  CHECK(values(runner.get(windowed(2, 0, 0)).value()) == std::vector<int64_t>{2, 3});
  CHECK(values(runner.get(windowed(3, 1, 2)).value()) == std::vector<int64_t>{4, 5});
  // Reply 2 was lost (reply 3 arrived, but the consumer takes replies in
  // order): it asks for 2 and 3 again, having acknowledged 1.
  CHECK(values(runner.get(windowed(2, 1, 2)).value()) == std::vector<int64_t>{2, 3});
  CHECK(values(runner.get(windowed(3, 1, 2)).value()) == std::vector<int64_t>{4, 5});
  CHECK(values(runner.get(windowed(4, 3, 6)).value()) == std::vector<int64_t>{6, 7});
  // Acknowledged replies are gone: asking for one again is a protocol error.
  auto again = runner.get(windowed(2, 1, 2));
  CHECK(again.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(again.status().message(), Catch::Contains("whose reply it acknowledged"));
}

TEST_CASE("a window's requests are checked", "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(100)), {});
  wait_buffered(runner, 100);  // full batches
  CHECK(runner.get(windowed(1, 0, 0)).ok());
  // A gap: number 3 before number 2 was served.
  auto gap = runner.get(windowed(3, 0, 0));
  CHECK(gap.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(gap.status().message(), Catch::Contains("request number 3 after number 1"));
  // Acknowledging the request itself, or more than the window allows.
  CHECK(runner.get(windowed(2, 2, 0)).status().code() == StatusCode::kInvalidArgument);
  auto wide = runner.get(windowed(2 + TaskRunner::kMaxRequestsInFlight, 1, 2));
  CHECK(wide.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(wide.status().message(), Catch::Contains("in flight"));
  // None of that changed the state: number 2 gets the next elements.
  CHECK(values(runner.get(windowed(2, 1, 2)).value()) == std::vector<int64_t>{2, 3});
  // A consumer the runner has not served may have had its first numbers
  // answered while the task was being built (empty), or have one still on
  // its way: those numbers get an empty reply, the one it sent elements.
  TaskRunner::Request other = windowed(4, 1, 0);
  other.client_id = 6;
  CHECK(values(runner.get(other).value()) == std::vector<int64_t>{4, 5});
  other.sequence = 2;
  auto empty = runner.get(other);
  REQUIRE(empty.ok());
  CHECK(empty->elements.empty());
  CHECK_FALSE(empty->end_of_sequence);
}

TEST_CASE("a rebuilt task skips what a consumer with a window has, and serves the window in order",
          "[data-service][task]") {
  // The worker restarted while requests 4 and 5 were in flight; the consumer
  // had acknowledged 3 replies (6 elements) and sends 4 and 5 again.
  TaskRunner runner(iterate(Dataset::range(12)), {});
  CHECK(values(runner.get(windowed(4, 3, 6, 1)).value()) == std::vector<int64_t>{6});
  CHECK(values(runner.get(windowed(5, 3, 6, 1)).value()) == std::vector<int64_t>{7});
  CHECK(values(runner.get(windowed(4, 3, 6, 1)).value()) == std::vector<int64_t>{6});  // 4 lost again
  CHECK(values(runner.get(windowed(6, 4, 7, 1)).value()) == std::vector<int64_t>{8});
}

TEST_CASE("a rebuilt task trusts a consumer's count only once the replies before its first one are acknowledged",
          "[data-service][task]") {
  // Two in flight: request 180 reached the old worker, which answered it
  // (elements 222 and 223) and died; request 181, sent with the count of
  // the replies up to 179 (222), reached the rebuilt task. Trusting it would
  // hand out 222 and 223 a second time.
  TaskRunner runner(iterate(Dataset::range(300)), {});
  wait_buffered(runner, 256);  // a full buffer: full batches
  auto first = runner.get(windowed(181, 179, 222));
  REQUIRE(first.ok());
  CHECK(first->elements.empty());
  CHECK_FALSE(first->end_of_sequence);
  // Request 182 acknowledges 180, with its elements: now the count holds.
  CHECK(values(runner.get(windowed(182, 180, 224)).value()) == std::vector<int64_t>{224, 225});
  CHECK(values(runner.get(windowed(183, 182, 226)).value()) == std::vector<int64_t>{226, 227});
}

TEST_CASE("a rebuilt task gets the count right when the reply before its first one was lost",
          "[data-service][task]") {
  // As above, but reply 180 never arrived: the consumer sends 180 and 181
  // again, then 182 with the count of 222 it really has.
  TaskRunner runner(iterate(Dataset::range(300)), {});
  wait_buffered(runner, 256);  // a full buffer: full batches
  CHECK(runner.get(windowed(181, 179, 222)).value().elements.empty());
  CHECK(runner.get(windowed(180, 179, 222)).value().elements.empty());
  CHECK(runner.get(windowed(181, 179, 222)).value().elements.empty());
  CHECK(values(runner.get(windowed(182, 181, 222)).value()) == std::vector<int64_t>{222, 223});
}

}  // namespace capstan::data_worker

namespace capstan::data_worker {

TEST_CASE("the end goes to a windowed consumer only once every earlier reply is acknowledged",
          "[data-service][task]") {
  TaskRunner runner(iterate(Dataset::range(2)), {});
  wait_buffered(runner, 2);  // both buffered
  TaskRunner::Request first = numbered(5, 1, 0, 2);
  first.acknowledged = 0;
  REQUIRE(values(runner.get(first).value()) == std::vector<int64_t>{0, 1});
  // Request 2 went out before reply 1 arrived: the task is over, but reply
  // 1's elements are not acknowledged, so "none ready", not the end.
  TaskRunner::Request ahead = numbered(5, 2, 0, 2);
  ahead.acknowledged = 0;
  auto held = runner.get(ahead);
  REQUIRE(held.ok());
  CHECK(held->elements.empty());
  CHECK_FALSE(held->end_of_sequence);
  // Acknowledging reply 1 (and 2), request 3 gets the end.
  TaskRunner::Request last = numbered(5, 3, 2, 2);
  last.acknowledged = 2;
  CHECK(runner.get(last).value().end_of_sequence);
}

}  // namespace capstan::data_worker
