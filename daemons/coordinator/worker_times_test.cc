#include "daemons/coordinator/worker_times.h"

#include <spdlog/sinks/ostream_sink.h>

#include <catch2/catch.hpp>
#include <sstream>

namespace capstan::coordinator {
namespace {

using Clock = WorkerTimes::Clock;
using std::chrono::milliseconds;

struct Fixture {
  std::ostringstream logged;
  std::shared_ptr<spdlog::logger> log =
      std::make_shared<spdlog::logger>("worker_times_test", std::make_shared<spdlog::sinks::ostream_sink_st>(logged));
  WorkerTimes times{log};
  Clock::time_point now = Clock::now();

  // A run of `function` on `task` that takes `ms` at the coordinator, of
  // which `collective_ms` in collectives.
  void run(int task, int ms, int collective_ms = 0, const std::string& function = "train_step") {
    int64_t ticket = times.begin(task, 1, 0.001, now);
    PhaseTimes phases;
    phases.total = ms / 1000.0;
    phases.input = ms / 10000.0;
    phases.collective = collective_ms / 1000.0;
    times.end(ticket, function, phases, now + milliseconds(ms));
  }
  const WorkerTimes::Row& row(const std::vector<WorkerTimes::Row>& rows, int task) {
    for (const auto& r : rows) {
      if (r.task == task) return r;
    }
    FAIL("no row for worker " << task);
    return rows.front();
  }
};

TEST_CASE("The slow worker of three scores highest, and is named once after a while", "[coordinator][times]") {
  Fixture f;
  for (int i = 0; i < 10; ++i) {
    f.run(0, 100);
    f.run(1, 110);
    f.run(2, 400);
  }
  auto rows = f.times.rows(f.now);
  REQUIRE(rows.size() == 3);
  REQUIRE(f.row(rows, 2).score.has_value());
  CHECK(*f.row(rows, 2).score > 3.0);
  CHECK(*f.row(rows, 0).score < 1.0);
  CHECK(*f.row(rows, 1).score == Approx(1.0));
  CHECK(f.row(rows, 2).runs == 10);
  CHECK(f.row(rows, 2).totals.queued == Approx(0.01));
  CHECK(f.logged.str().empty());  // slow, but not for long enough yet
  f.times.rows(f.now + milliseconds(6000));
  CHECK(f.logged.str().find("worker 2 is a straggler") != std::string::npos);
  CHECK(f.logged.str().find("train_step") != std::string::npos);
  const std::string once = f.logged.str();
  f.times.rows(f.now + milliseconds(9000));
  CHECK(f.logged.str() == once);
  CHECK(f.times.rows(f.now + milliseconds(9000))[2].straggler);
  // Back to speed a minute later: said so once it stays fast for 10 s.
  f.now += std::chrono::seconds(60);
  for (int i = 0; i < 30; ++i) f.run(2, 100);
  f.times.rows(f.now);
  CHECK(f.logged.str() == once);
  CHECK(f.times.rows(f.now + milliseconds(9000))[2].straggler);
  f.times.rows(f.now + milliseconds(10000));
  CHECK(f.logged.str().find("worker 2 is no longer a straggler") != std::string::npos);
}

TEST_CASE("A worker stopped in bursts stays slow between them: the average is over time", "[coordinator][times]") {
  Fixture f;
  // Every half second: worker 2 runs ten fast runs and one held up 300 ms.
  for (int cycle = 0; cycle < 20; ++cycle) {
    for (int i = 0; i < 11; ++i) {
      f.run(0, 10);
      f.run(1, 10);
      f.run(2, i == 0 ? 310 : 10);
    }
    f.now += milliseconds(500);
  }
  auto rows = f.times.rows(f.now);
  CHECK(*f.row(rows, 2).score > 2.5);
  CHECK(*f.row(rows, 0).score < 1.01);
}

TEST_CASE("A synchronous step's wait in the collectives is not busy time", "[coordinator][times]") {
  Fixture f;
  // Every replica's step takes 300 ms; replicas 0 and 1 spend 200 of it
  // waiting for replica 2 in the all-reduce.
  for (int i = 0; i < 5; ++i) {
    f.run(0, 300, 200);
    f.run(1, 300, 205);
    f.run(2, 300, 5);
  }
  auto rows = f.times.rows(f.now);
  CHECK(*f.row(rows, 2).score > 2.5);
  CHECK(f.row(rows, 2).busy == Approx(0.295));
}

TEST_CASE("A run in flight longer than its worker's average raises its score", "[coordinator][times]") {
  Fixture f;
  for (int i = 0; i < 5; ++i) {
    f.run(0, 100);
    f.run(1, 100);
    f.run(2, 100);
  }
  f.times.begin(1, 1, 0, f.now);  // stopped mid-run
  auto rows = f.times.rows(f.now + milliseconds(1000));
  CHECK(*f.row(rows, 1).score > 5);
  CHECK(*f.row(rows, 0).score == Approx(1.0));
  // Not a synchronous step's: every replica waits for the slowest.
  f.times.begin(0, 1, 0, f.now, /*step=*/true);
  rows = f.times.rows(f.now + milliseconds(1000));
  CHECK(*f.row(rows, 0).score < 1.01);
}

TEST_CASE("Scores need runs of the main function on two workers", "[coordinator][times]") {
  Fixture f;
  f.run(0, 100);
  f.run(1, 500);
  auto rows = f.times.rows(f.now);
  CHECK_FALSE(f.row(rows, 0).score.has_value());  // too few runs
  for (int i = 0; i < 20; ++i) f.run(0, 100, 0, "evaluate");
  for (int i = 0; i < 5; ++i) f.run(0, 100);
  rows = f.times.rows(f.now);
  CHECK_FALSE(f.row(rows, 0).score.has_value());  // one worker with enough runs of "evaluate"
  // A failed run, or a worker that left, counts nothing.
  int64_t ticket = f.times.begin(1, 1, 0, f.now);
  f.times.abandon(ticket);
  f.times.forget(1);
  rows = f.times.rows(f.now + milliseconds(100000));
  CHECK(rows.size() == 1);
  CHECK(f.times.totals().total > 2.6);
}

TEST_CASE("A batch's values are timed at once, its wait shared among its runs", "[coordinator][times]") {
  Fixture f;
  const std::string step = "train_step";
  PhaseTimes phases;
  phases.total = 0.01;
  int64_t ticket = f.times.begin(0, 4, 0.4, f.now);
  // Three values; the fourth run failed.
  f.times.end_batch(ticket, {{&step, phases}, {&step, phases}, {&step, phases}}, f.now + milliseconds(400));
  auto rows = f.times.rows(f.now + milliseconds(400));
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].runs == 3);
  CHECK(rows[0].totals.queued == Approx(0.3));
  CHECK(rows[0].busy == Approx(0.1));
  // The ticket is closed: a late end counts nothing.
  f.times.end(ticket, step, phases, f.now + milliseconds(500));
  CHECK(f.times.rows(f.now)[0].runs == 3);
}

TEST_CASE("The status page's series: a score and a busy time per worker", "[coordinator][times]") {
  Fixture f;
  for (int i = 0; i < 4; ++i) {
    f.run(0, 100);
    f.run(1, 300);
  }
  auto series = f.times.sample(f.now);
  REQUIRE(series.size() == 2);  // no rate before a second sample
  CHECK(series[0].title == "straggler score by worker");
  CHECK(series[1].title == "busy s/step by worker");
  REQUIRE(series[0].lines.size() == 2);
  CHECK(series[0].lines[1].label == "worker 1");
  REQUIRE(series[0].lines[1].points.size() == 1);
  CHECK(series[0].lines[1].points[0].second == Approx(1.5));  // 300 against the median 200
  for (int i = 0; i < 6; ++i) f.run(1, 100);
  series = f.times.sample(f.now + std::chrono::seconds(2));
  REQUIRE(series.size() == 3);
  CHECK(series[2].title == "closures+steps/s by worker");
  REQUIRE(series[2].lines.size() == 2);
  CHECK(series[2].lines[1].points.back().second == Approx(3.0));  // 6 runs in 2 s
}

}  // namespace
}  // namespace capstan::coordinator
