#include "capstan/trace.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <thread>

#include "capstan/phases.h"

namespace capstan::trace {
namespace {

// The recorder is the process's: each case starts from a clean ring.
Recorder& fresh(size_t capacity = Recorder::kDefaultFlightCapacity) {
  Recorder& recorder = Recorder::get();
  (void)recorder.stop_trace();
  recorder.set_flight_capacity(capacity);
  return recorder;
}

TEST_CASE("The flight recorder keeps the last spans with their state, oldest first", "[trace]") {
  Recorder& recorder = fresh(16);
  for (int i = 0; i < 40; ++i) Span(Kind::kClosure, "step " + std::to_string(i));
  Span failed(Kind::kCollective, "all_reduce", "generation 1, rank 0 of 3, seq 7, 64 bytes");
  failed.fail("rank(s) 2 stopped responding or died");
  failed.finish();
  Span running(Kind::kRpc, "Worker.runClosure");
  std::vector<FlightRecord> records = recorder.flight();
  REQUIRE(records.size() == 16);  // bounded: the oldest went
  CHECK(records.front().name == "step 26");
  CHECK(records.front().state == State::kFinished);
  CHECK(records.front().end_ns >= records.front().start_ns);
  const FlightRecord& all_reduce = records[records.size() - 2];
  CHECK(all_reduce.state == State::kFailed);
  CHECK(all_reduce.detail == "generation 1, rank 0 of 3, seq 7, 64 bytes: rank(s) 2 stopped responding or died");
  CHECK(records.back().name == "Worker.runClosure");
  CHECK(records.back().state == State::kStarted);
  CHECK(records.back().end_ns == 0);
  const std::string text = format_records(records, now_ns());
  CHECK(text.find("collective all_reduce  failed in") != std::string::npos);
  CHECK(text.find("rpc Worker.runClosure  started, running for") != std::string::npos);
}

TEST_CASE("A trace keeps the spans that end while it records, up to its bound, and no more", "[trace]") {
  Recorder& recorder = fresh();
  Span(Kind::kClosure, "before");  // not traced
  REQUIRE(recorder.start_trace(3).ok());
  CHECK(recorder.tracing());
  CHECK(recorder.start_trace(3).code() == StatusCode::kFailedPrecondition);
  {
    Span outer(Kind::kStep, "train_step", "closure 9");
    outer.set_flow_in(9);
    Span inner(Kind::kCollective, "all_reduce");
  }
  Span(Kind::kClosure, "third");
  Span(Kind::kClosure, "fourth");  // past the bound
  TraceCapture capture = recorder.stop_trace();
  CHECK_FALSE(recorder.tracing());
  Span(Kind::kClosure, "after");  // not traced
  REQUIRE(capture.events.size() == 3);
  CHECK(capture.dropped == 1);
  // Kept as each ended: the inner span first, inside the outer one.
  CHECK(capture.events[0].name == "all_reduce");
  CHECK(capture.events[1].name == "train_step");
  CHECK(capture.events[1].flow_in == 9);
  CHECK(capture.events[0].start_ns >= capture.events[1].start_ns);
  CHECK(capture.events[0].end_ns <= capture.events[1].end_ns);
  CHECK(capture.events[0].thread == capture.events[1].thread);
  CHECK(capture.threads.size() > capture.events[0].thread);
  CHECK(capture.end_ns >= capture.start_ns);
  CHECK(recorder.stop_trace().events.empty());  // nothing recording now
  CHECK(recorder.start_trace(0).code() == StatusCode::kInvalidArgument);
  CHECK(recorder.start_trace(Recorder::kMaxTraceEvents + 1).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("A flow whose id comes later is bound to its span, and phases are traced inside their step", "[trace]") {
  Recorder& recorder = fresh();
  REQUIRE(recorder.start_trace(100).ok());
  const uint64_t key = recorder.new_flow_key();
  {
    Span schedule(Kind::kSchedule, "train_step");
    schedule.set_flow_key(key);
  }
  recorder.bind_flow(key, 42);  // the coordinator's answer
  {
    PhaseRecorder phases;
    Span step(Kind::kClosure, "train_step");
    PhaseScope input(Phase::kInput);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  TraceCapture capture = recorder.stop_trace();
  REQUIRE(capture.events.size() == 3);
  CHECK(capture.events[0].kind == Kind::kSchedule);
  CHECK(capture.events[0].flow_out == 42);
  CHECK(capture.events[1].kind == Kind::kPhase);
  CHECK(capture.events[1].name == "input");
  CHECK(capture.events[1].end_ns - capture.events[1].start_ns >= 2'000'000);
  CHECK(capture.events[2].kind == Kind::kClosure);
  CHECK(capture.events[1].start_ns >= capture.events[2].start_ns);
  CHECK(capture.events[1].end_ns <= capture.events[2].end_ns);
}

TEST_CASE("Spans from several threads are all recorded, each on its own thread", "[trace]") {
  Recorder& recorder = fresh(1024);
  REQUIRE(recorder.start_trace(10000).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([]() {
      for (int i = 0; i < 100; ++i) Span(Kind::kRpc, "call");
    });
  }
  for (auto& t : threads) t.join();
  TraceCapture capture = recorder.stop_trace();
  CHECK(capture.events.size() == 400);
  std::set<uint32_t> seen;
  for (const auto& e : capture.events) seen.insert(e.thread);
  CHECK(seen.size() == 4);
  CHECK(recorder.flight().size() == 400);
}

}  // namespace
}  // namespace capstan::trace
