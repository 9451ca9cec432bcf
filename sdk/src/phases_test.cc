#include "capstan/phases.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

namespace capstan {
namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST_CASE("A recorder counts each marked phase and leaves the rest to compute", "[phases]") {
  PhaseRecorder recorder;
  {
    PhaseScope input(Phase::kInput);
    sleep_ms(30);
  }
  {
    PhaseScope ps(Phase::kPs);
    sleep_ms(20);
  }
  sleep_ms(40);  // compute
  PhaseTimes times = recorder.stop();
  CHECK(times.input >= 0.029);
  CHECK(times.ps >= 0.019);
  CHECK(times.collective == 0);
  CHECK(times.compute() >= 0.039);
  CHECK(times.total >= times.input + times.ps + 0.039);
}

TEST_CASE("Nested scopes count once, for the outermost phase", "[phases]") {
  PhaseRecorder recorder;
  {
    PhaseScope input(Phase::kInput);
    PhaseScope ps(Phase::kPs);  // a pipeline that reads a parameter server
    sleep_ms(20);
  }
  PhaseTimes times = recorder.stop();
  CHECK(times.input >= 0.019);
  CHECK(times.ps == 0);
}

TEST_CASE("Scopes without a recorder, or on another thread, count nothing", "[phases]") {
  { PhaseScope lone(Phase::kCollective); }
  PhaseRecorder recorder;
  std::thread other([] {
    PhaseScope elsewhere(Phase::kCollective);
    sleep_ms(20);
  });
  other.join();
  CHECK(recorder.stop().collective == 0);
}

TEST_CASE("An inner recorder takes over the thread until it is gone", "[phases]") {
  PhaseRecorder outer;
  {
    PhaseRecorder inner;
    {
      PhaseScope scope(Phase::kCollective);
      sleep_ms(20);
    }
    CHECK(inner.stop().collective >= 0.019);
  }
  CHECK(outer.stop().collective == 0);
  {
    PhaseScope scope(Phase::kCollective);
    sleep_ms(10);
  }
  CHECK(outer.stop().collective >= 0.009);
}

TEST_CASE("format_phases gives each phase's share of the whole", "[phases]") {
  PhaseTimes times;
  times.input = 1.2;
  times.ps = 3;
  times.collective = 0.8;
  times.total = 10;
  CHECK(format_phases(times) == "input 12%, ps 30%, compute 50%, all-reduce 8%");
  times.queued = 10;
  CHECK(format_phases(times) == "queued 50%, input 6%, ps 15%, compute 25%, all-reduce 4%");
  PhaseTimes sum;
  sum += times;
  sum += times;
  CHECK(sum.total == 20);
  CHECK(sum.queued == 20);
  CHECK(format_phases(PhaseTimes{}) == "no steps timed");
}

}  // namespace
}  // namespace capstan
