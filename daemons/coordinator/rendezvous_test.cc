// The group rendezvous on a manual clock.
#include "daemons/coordinator/rendezvous.h"

#include <catch2/catch.hpp>
#include <kj/async-io.h>
#include <kj/timer.h>

namespace capstan::coordinator {
namespace {

using namespace std::chrono_literals;

struct Harness {
  Harness() : io(kj::setupAsyncIo()), timer(kj::origin<kj::TimePoint>()), rendezvous(timer) {}
  void advance(std::chrono::milliseconds by) {
    timer.advanceTo(timer.now() + by.count() * kj::MILLISECONDS);
    io.waitScope.poll();
  }
  kj::AsyncIoContext io;
  kj::TimerImpl timer;
  GroupRendezvous rendezvous;
};

TEST_CASE("a group forms once all its ranks joined, each learns every address and the generation",
          "[coordinator][rendezvous]") {
  Harness h;
  auto a = h.rendezvous.join("dense", 3, 2, "c:3", 10s);
  auto b = h.rendezvous.join("dense", 3, -1, "a:1", 10s);  // the lowest free rank: 0
  CHECK(h.rendezvous.waiting("dense") == 2);
  CHECK_FALSE(a.poll(h.io.waitScope));
  auto c = h.rendezvous.join("dense", 3, 1, "b:2", 10s);
  for (auto* p : {&a, &b, &c}) REQUIRE(p->poll(h.io.waitScope));
  auto ra = a.wait(h.io.waitScope), rb = b.wait(h.io.waitScope), rc = c.wait(h.io.waitScope);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  REQUIRE(rc.ok());
  CHECK(ra->addresses == std::vector<std::string>{"a:1", "b:2", "c:3"});
  CHECK(ra->rank == 2);
  CHECK(rb->rank == 0);
  CHECK(rc->rank == 1);
  CHECK(ra->generation == 1);
  CHECK(rb->addresses == ra->addresses);
  CHECK(h.rendezvous.waiting("dense") == 0);
  // Forming it again (the survivors after a failure) is the next generation.
  auto d = h.rendezvous.join("dense", 1, 0, "a:1", 10s);
  CHECK(d.wait(h.io.waitScope)->generation == 2);
  CHECK(h.rendezvous.generation("dense") == 2);
  CHECK(h.rendezvous.generation("other") == 0);
}

TEST_CASE("a group that does not form in time fails naming the ranks that never joined", "[coordinator][rendezvous]") {
  Harness h;
  auto a = h.rendezvous.join("g", 4, 0, "a:1", 1000ms);
  h.advance(500ms);
  auto b = h.rendezvous.join("g", 4, 2, "c:1", 1000ms);
  h.advance(600ms);  // a's deadline has passed, b's not
  REQUIRE(a.poll(h.io.waitScope));
  auto ra = a.wait(h.io.waitScope);
  CHECK(ra.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(ra.status().message(), Catch::Contains("rank(s) 1, 3 never joined"));
  CHECK(h.rendezvous.waiting("g") == 1);  // a left; b still waits
  h.advance(500ms);
  auto rb = b.wait(h.io.waitScope);
  CHECK_THAT(rb.status().message(), Catch::Contains("rank(s) 0, 1, 3 never joined"));
  CHECK(h.rendezvous.waiting("g") == 0);
}

TEST_CASE("bad joins are refused at once", "[coordinator][rendezvous]") {
  Harness h;
  auto code = [&](kj::Promise<Result<GroupMembership>> p) { return p.wait(h.io.waitScope).status().code(); };
  CHECK(code(h.rendezvous.join("", 2, 0, "a:1", 1s)) == StatusCode::kInvalidArgument);
  CHECK(code(h.rendezvous.join("g", 0, 0, "a:1", 1s)) == StatusCode::kInvalidArgument);
  CHECK(code(h.rendezvous.join("g", 1 << 20, 0, "a:1", 1s)) == StatusCode::kInvalidArgument);
  CHECK(code(h.rendezvous.join("g", 2, 2, "a:1", 1s)) == StatusCode::kInvalidArgument);
  CHECK(code(h.rendezvous.join("g", 2, 0, "", 1s)) == StatusCode::kInvalidArgument);
  CHECK(code(h.rendezvous.join("g", 2, 0, "a:1", 0ms)) == StatusCode::kInvalidArgument);
  auto waiting = h.rendezvous.join("g", 2, 0, "a:1", 10s);
  auto other_size = h.rendezvous.join("g", 3, 1, "b:1", 10s).wait(h.io.waitScope);
  CHECK(other_size.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(other_size.status().message(), Catch::Contains("forming with 2 ranks"));
  auto taken = h.rendezvous.join("g", 2, 0, "b:1", 10s).wait(h.io.waitScope);
  CHECK(taken.status().code() == StatusCode::kAlreadyExists);
  CHECK_THAT(taken.status().message(), Catch::Contains("a:1"));
}

TEST_CASE("the number of groups forming at once is bounded", "[coordinator][rendezvous]") {
  Harness h;
  std::vector<kj::Promise<Result<GroupMembership>>> waiting;
  for (size_t i = 0; i < GroupRendezvous::kMaxFormingGroups; ++i) {
    waiting.push_back(h.rendezvous.join("g" + std::to_string(i), 2, 0, "a:1", 10s));
  }
  auto refused = h.rendezvous.join("one-more", 2, 0, "a:1", 10s).wait(h.io.waitScope);
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  // A forming group still takes members; once groups time out, new ones may form.
  CHECK_FALSE(h.rendezvous.join("g0", 2, 1, "b:1", 10s).wait(h.io.waitScope).status().code() ==
              StatusCode::kResourceExhausted);
  h.advance(11s);
  auto later = h.rendezvous.join("one-more", 1, 0, "a:1", 10s).wait(h.io.waitScope);
  CHECK(later.ok());
}

TEST_CASE("a member whose caller went away frees its rank", "[coordinator][rendezvous]") {
  Harness h;
  {
    auto gone = h.rendezvous.join("g", 2, 0, "a:1", 10s);
  }  // the RPC was cancelled: the promise is dropped
  auto again = h.rendezvous.join("g", 2, 0, "a:2", 10s);
  auto other = h.rendezvous.join("g", 2, 1, "b:1", 10s);
  auto r = again.wait(h.io.waitScope);
  REQUIRE(r.ok());
  CHECK(r->addresses == std::vector<std::string>{"a:2", "b:1"});
}

}  // namespace
}  // namespace capstan::coordinator
