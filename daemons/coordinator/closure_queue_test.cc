#include "daemons/coordinator/closure_queue.h"

#include <catch2/catch.hpp>

namespace capstan::coordinator {

using State = ClosureQueue::State;

TEST_CASE("closures run in schedule order and deliver their values", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "1").value();
  int64_t b = q.schedule("g", "2").value();
  CHECK(q.queued() == 2);
  auto first = q.next(7);
  REQUIRE(first);
  CHECK(first->id == a);
  CHECK(first->function == "f");
  CHECK(first->args == "1");
  CHECK(first->attempts == 1);
  CHECK(q.state(a).value() == State::kRunning);
  CHECK(q.value(a).status().code() == StatusCode::kUnavailable);  // not finished yet
  CHECK(q.complete(a, 7, std::string("va")));
  CHECK(q.value(a).value() == "va");
  CHECK(q.next(7)->id == b);
  CHECK_FALSE(q.next(7).has_value());
  CHECK_FALSE(q.idle());
  CHECK(q.complete(b, 7, std::string("vb")));
  CHECK(q.idle());
}

TEST_CASE("the first error is raised once by the next schedule, then cleared", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "").value();
  int64_t b = q.schedule("f", "").value();
  int64_t c = q.schedule("f", "").value();
  auto run = q.next(1);
  REQUIRE(run->id == a);
  CHECK(q.complete(a, 1, Status::InvalidArgument("bad input")));
  CHECK(q.has_error());
  // Queued closures are cancelled; their fetch says so.
  CHECK(q.state(b).value() == State::kCancelled);
  CHECK(q.value(c).status().code() == StatusCode::kCancelled);
  CHECK_THAT(q.value(c).status().message(), Catch::Contains("bad input"));
  CHECK(q.value(a).status() == Status::InvalidArgument("bad input"));
  CHECK(q.idle());
  auto raised = q.schedule("f", "");
  REQUIRE_FALSE(raised.ok());
  CHECK(raised.status() == Status::InvalidArgument("bad input"));
  // Cleared: new work can be scheduled.
  CHECK(q.schedule("f", "").ok());
}

TEST_CASE("a failure cancels the closures running elsewhere, their late results are dropped", "[closures]") {
  ClosureQueue q;
  int64_t slow = q.schedule("long", "").value();
  int64_t failing = q.schedule("f", "").value();
  int64_t queued = q.schedule("f", "").value();
  REQUIRE(q.next(1)->id == slow);
  REQUIRE(q.next(2)->id == failing);
  CHECK(q.take_cancelled_runs().empty());
  CHECK(q.complete(failing, 2, Status::InvalidArgument("bad input")));
  // TF: the running closure is cancelled too, and its fetch raises Cancelled.
  CHECK(q.state(slow).value() == State::kCancelled);
  CHECK(q.value(slow).status().code() == StatusCode::kCancelled);
  CHECK(q.state(queued).value() == State::kCancelled);
  CHECK(q.idle());
  auto runs = q.take_cancelled_runs();
  REQUIRE(runs.size() == 1);
  CHECK(runs[0] == std::pair<int64_t, int64_t>{slow, 1});
  CHECK(q.take_cancelled_runs().empty());
  // The cancelled run's value arrives late: dropped.
  CHECK_FALSE(q.complete(slow, 1, std::string("late")));
  CHECK(q.value(slow).status().code() == StatusCode::kCancelled);
  // A worker failing now re-queues nothing.
  CHECK(q.worker_failed(1).empty());
  CHECK(q.take_error().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("take_error returns the error once, as join and done raise it", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "").value();
  q.next(0);
  q.complete(a, 0, Status::Internal("boom"));
  CHECK(q.take_error().code() == StatusCode::kInternal);
  CHECK(q.take_error().ok());
}

TEST_CASE("closures running on a failed worker go back to the front, once", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "a").value();
  int64_t b = q.schedule("f", "b").value();
  int64_t c = q.schedule("f", "c").value();
  q.next(1);  // a on worker 1
  q.next(2);  // b on worker 2
  auto requeued = q.worker_failed(1);
  CHECK(requeued == std::vector<int64_t>{a});
  CHECK(q.worker_failed(1).empty());  // exactly once
  auto retry = q.next(2);
  REQUIRE(retry);
  CHECK(retry->id == a);  // ahead of c
  CHECK(retry->attempts == 2);
  CHECK(q.next(2)->id == c);
  CHECK(q.complete(a, 2, std::string("done-a")));
  CHECK(q.complete(b, 2, std::string("done-b")));
}

TEST_CASE("a result from a lost run is dropped: each value is delivered once", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "").value();
  q.next(1);
  q.worker_failed(1);  // worker 1 presumed dead...
  q.next(2);
  CHECK(q.complete(a, 2, std::string("from-2")));
  CHECK_FALSE(q.complete(a, 1, std::string("from-1")));  // ...but it answered late
  CHECK(q.value(a).value() == "from-2");
  CHECK_FALSE(q.complete(a, 2, std::string("again")));
}

TEST_CASE("an Unavailable result re-queues the closure instead of failing it", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "").value();
  q.next(1);
  CHECK(q.complete(a, 1, Status::Unavailable("parameter server restarting")));
  CHECK_FALSE(q.has_error());
  CHECK(q.state(a).value() == State::kQueued);
  CHECK(q.next(1)->id == a);
}

TEST_CASE("a released value is forgotten and a fetch of it says it was released", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "").value();
  q.next(0);
  REQUIRE(q.complete(a, 0, std::string("v")) == State::kDone);
  CHECK(q.finished() == 1);
  CHECK(q.release(a).value());
  CHECK(q.size() == 0);
  Status fetched = q.value(a).status();
  CHECK(fetched.code() == StatusCode::kNotFound);
  CHECK_THAT(fetched.message(), Catch::Contains("closure " + std::to_string(a)) && Catch::Contains("was released"));
  CHECK(q.state(a).status().message() == fetched.message());
  // Never handed out: NotFound without the word.
  CHECK(q.state(999).status().code() == StatusCode::kNotFound);
  CHECK_THAT(q.state(999).status().message(), !Catch::Contains("released"));
  CHECK_FALSE(q.complete(999, 0, std::string("x")));
}

TEST_CASE("a closure released while queued or running is dropped as it finishes", "[closures]") {
  ClosureQueue q;
  int64_t queued = q.schedule("f", "").value();
  int64_t running = q.schedule("f", "").value();
  CHECK(q.next(0)->id == queued);
  CHECK(q.next(1)->id == running);
  q.worker_failed(0);  // `queued` is queued again
  CHECK(q.release(queued).value());
  CHECK(q.release(running).value());
  // Still dispatched and run (the program may not want its value, but its
  // effect on the variables).
  CHECK(q.queued() == 1);
  CHECK(q.state(running).status().code() == StatusCode::kNotFound);  // says released
  REQUIRE(q.complete(running, 1, std::string("v")) == State::kDone);
  CHECK(q.size() == 1);
  CHECK(q.next(0)->id == queued);
  REQUIRE(q.complete(queued, 0, std::string("v")) == State::kDone);
  CHECK(q.size() == 0);
  CHECK(q.finished() == 0);
}

TEST_CASE("the error of a released closure is still raised, and the closures it cancels that were released go",
          "[closures]") {
  ClosureQueue q;
  int64_t failing = q.schedule("f", "").value();
  int64_t waiting = q.schedule("f", "").value();
  int64_t kept = q.schedule("f", "").value();
  q.next(0);
  CHECK(q.release(failing).value());
  CHECK(q.release(waiting).value());
  REQUIRE(q.complete(failing, 0, Status::InvalidArgument("bad input")) == State::kFailed);
  CHECK(q.size() == 1);  // only `kept`, cancelled, is still there to fetch
  CHECK(q.value(kept).status().code() == StatusCode::kCancelled);
  CHECK(q.take_error().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("release refuses ids never handed out, a second release of one is no change", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "").value();
  for (int64_t bad : {int64_t{0}, int64_t{-3}, a + 1}) {
    Result<bool> released = q.release(bad);
    CHECK(released.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(released.status().message(), Catch::Contains(std::to_string(bad)));
  }
  CHECK(q.release(a).value());
  CHECK_FALSE(q.release(a).value());
  CHECK(q.check_id(a).ok());
}

TEST_CASE("release_client releases what one client scheduled, finished or not", "[closures]") {
  ClosureQueue q;
  int64_t mine_done = q.schedule("f", "", {7, 1}).value();
  int64_t theirs = q.schedule("f", "", {8, 1}).value();
  int64_t mine_queued = q.schedule("f", "", {7, 2}).value();
  int64_t anonymous = q.schedule("f", "").value();
  q.next(0);
  REQUIRE(q.complete(mine_done, 0, std::string("v")));
  CHECK(q.owner(mine_queued)->request_seq == 2);
  CHECK(q.release_client(7) == std::vector<int64_t>{mine_done, mine_queued});
  CHECK(q.release_client(7).empty());
  CHECK(q.release_client(0).empty());  // no owner: only release() lets it go
  CHECK(q.state(theirs).ok());
  CHECK(q.state(anonymous).ok());
  CHECK(q.state(mine_done).status().code() == StatusCode::kNotFound);
  CHECK(q.size() == 3);  // theirs, anonymous and mine_queued until it finishes
}

TEST_CASE("a snapshot keeps owners and closures released in flight, a restore drops them as they finish",
          "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "a", {7, 1}).value();
  int64_t b = q.schedule("f", "b", {7, 2}).value();
  int64_t c = q.schedule("f", "c", {7, 3}).value();
  q.next(0);
  REQUIRE(q.complete(a, 0, std::string("v")));
  CHECK(q.release(a).value());
  CHECK(q.release(b).value());
  ClosureQueue::Snapshot snapshot = q.snapshot();
  REQUIRE(snapshot.entries.size() == 2);  // b (released, queued) and c
  CHECK(snapshot.entries[0].released);
  CHECK(snapshot.entries[1].owner.request_seq == 3);

  ClosureQueue restored;
  for (auto& entry : snapshot.entries) restored.restore_entry(entry);
  restored.restore_pending(snapshot.pending_error, snapshot.next_id);
  CHECK(restored.state(a).status().code() == StatusCode::kNotFound);
  CHECK_THAT(restored.state(a).status().message(), Catch::Contains("released"));
  CHECK(restored.next(0)->id == b);
  REQUIRE(restored.complete(b, 0, std::string("v")));
  CHECK(restored.size() == 1);
  CHECK(restored.owner(c)->client == 7);
}

}  // namespace capstan::coordinator
