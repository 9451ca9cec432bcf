#include "daemons/coordinator/loop_context.h"

#include <catch2/catch.hpp>

#include "daemons/coordinator/test_fakes.h"

namespace capstan::coordinator {
namespace {

using Loop = testing::CoordinatorParts;  // `notified` counts the refreshes

TEST_CASE("notify wakes every waiter once, after the refresh", "[coordinator][loop]") {
  Loop l;
  int woken = 0;
  auto a = l.changes.changed().then([&]() { ++woken; }).eagerlyEvaluate(nullptr);
  auto b = l.changes.changed().then([&]() { ++woken; }).eagerlyEvaluate(nullptr);
  l.ws.poll();
  CHECK(woken == 0);
  l.changes.notify();
  l.ws.poll();
  CHECK(woken == 2);
  CHECK(l.notified == 1);
  // A later notify has nobody left to wake.
  l.changes.notify();
  l.ws.poll();
  CHECK(woken == 2);
  CHECK(l.notified == 2);
}

TEST_CASE("changed_or resolves at the deadline when nothing changes", "[coordinator][loop]") {
  Loop l;
  bool woken = false;
  auto w = l.changes.changed_or(l.timer.now() + 500 * kj::MILLISECONDS)
               .then([&]() { woken = true; })
               .eagerlyEvaluate(nullptr);
  l.timer.advanceTo(l.timer.now() + 499 * kj::MILLISECONDS);
  l.ws.poll();
  CHECK_FALSE(woken);
  l.timer.advanceTo(l.timer.now() + 1 * kj::MILLISECONDS);
  l.ws.poll();
  CHECK(woken);
}

TEST_CASE("until resolves at once when its condition holds, else at the notify that makes it hold",
          "[coordinator][loop]") {
  Loop l;
  CHECK(l.changes.until([]() { return true; }).poll(l.ws));
  int running = 2;
  bool idle = false;
  auto w = l.changes.until([&]() { return running == 0; }).then([&]() { idle = true; }).eagerlyEvaluate(nullptr);
  running = 1;
  l.changes.notify();
  l.ws.poll();
  CHECK_FALSE(idle);
  running = 0;
  l.ws.poll();
  CHECK_FALSE(idle);  // not looked at again until a notify
  l.changes.notify();
  l.ws.poll();
  CHECK(idle);
}

}  // namespace
}  // namespace capstan::coordinator
