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

TEST_CASE("a failure cancels the closures running elsewhere; their late results are dropped", "[closures]") {
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

TEST_CASE("released values are forgotten; unknown ids are NotFound", "[closures]") {
  ClosureQueue q;
  int64_t a = q.schedule("f", "").value();
  q.release(a);  // still queued: kept
  CHECK(q.state(a).ok());
  q.next(0);
  q.complete(a, 0, std::string("v"));
  q.release(a);
  CHECK(q.value(a).status().code() == StatusCode::kNotFound);
  CHECK(q.state(999).status().code() == StatusCode::kNotFound);
  CHECK_FALSE(q.complete(999, 0, std::string("x")));
}

}  // namespace capstan::coordinator
