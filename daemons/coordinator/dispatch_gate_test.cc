#include "daemons/coordinator/dispatch_gate.h"

#include <catch2/catch.hpp>

namespace capstan::coordinator {
namespace {

TEST_CASE("the dispatch gate stays paused while any pause guard lives, and says when it opens",
          "[coordinator][gate]") {
  DispatchGate gate;
  int resumed = 0;
  CHECK_FALSE(gate.paused());
  auto first = gate.pause([&]() { ++resumed; });
  auto second = gate.pause([&]() { ++resumed; });
  CHECK(gate.paused());
  first.reset();
  CHECK(gate.paused());
  CHECK(resumed == 1);
  second.reset();
  CHECK_FALSE(gate.paused());
  CHECK(resumed == 2);
}

TEST_CASE("draining closes the gate for good, paused or not", "[coordinator][gate]") {
  DispatchGate gate;
  CHECK_FALSE(gate.draining());
  gate.drain();
  CHECK(gate.draining());
  { auto guard = gate.pause(nullptr); }
  CHECK(gate.draining());
  CHECK_FALSE(gate.paused());
}

}  // namespace
}  // namespace capstan::coordinator
