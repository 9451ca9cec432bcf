// The autotuner's control rule: knobs grow while their op is the
// bottleneck and shrink when it has slack.
#include <catch2/catch.hpp>

#include "data/autotune.h"

namespace capstan::data {

using std::chrono::milliseconds;

TEST_CASE("a parallelism knob grows while the consumer waits, up to its max", "[data][autotune]") {
  Knob knob(Knob::Kind::kParallelism, 1, 1, 3);
  knob.record_wait(milliseconds(5));  // 20% of a 25 ms period
  CHECK(knob.tune(milliseconds(25)));
  CHECK(knob.value() == 2);
  knob.record_wait(milliseconds(5));
  knob.tune(milliseconds(25));
  knob.record_wait(milliseconds(5));
  CHECK_FALSE(knob.tune(milliseconds(25)));  // at max
  CHECK(knob.value() == 3);
}

TEST_CASE("a knob whose consumer never waits shrinks after a second", "[data][autotune]") {
  Knob knob(Knob::Kind::kParallelism, 4, 1, 8);
  for (int i = 0; i < 39; ++i) CHECK_FALSE(knob.tune(milliseconds(25)));
  CHECK(knob.tune(milliseconds(25)));
  CHECK(knob.value() == 3);
}

TEST_CASE("short waits below 5% do not move a knob", "[data][autotune]") {
  Knob knob(Knob::Kind::kBufferSize, 2, 1, 64);
  knob.record_wait(milliseconds(1));  // 4%
  CHECK_FALSE(knob.tune(milliseconds(25)));
  CHECK(knob.value() == 2);
}

TEST_CASE("buffer knobs double and respect a lowered maximum", "[data][autotune]") {
  Knob knob(Knob::Kind::kBufferSize, 2, 1, 64);
  knob.record_wait(milliseconds(10));
  knob.tune(milliseconds(25));
  CHECK(knob.value() == 4);
  knob.set_max(3);  // the RAM budget allows only 3 elements of this size
  CHECK(knob.value() == 3);
}

TEST_CASE("an autotuner tunes registered knobs in the background", "[data][autotune]") {
  Autotuner tuner(true, 4, 1 << 30);
  auto knob = tuner.add(Knob::Kind::kParallelism, 1, 1, 4);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (knob->value() < 4 && std::chrono::steady_clock::now() < deadline) {
    knob->record_wait(milliseconds(20));  // a consumer that is always starved
    std::this_thread::sleep_for(milliseconds(5));
  }
  CHECK(knob->value() == 4);
  Autotuner off(false, 4, 1 << 30);
  auto fixed = off.add(Knob::Kind::kParallelism, 1, 1, 4);
  fixed->record_wait(milliseconds(20));
  std::this_thread::sleep_for(milliseconds(60));
  CHECK(fixed->value() == 1);
}

}  // namespace capstan::data
