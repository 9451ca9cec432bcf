// The checkpoint policy alone: a save function that records its calls and
// answers when the test says, on a manual clock.
#include "daemons/coordinator/checkpoint_policy.h"

#include <kj/async.h>
#include <kj/timer.h>
#include <spdlog/sinks/null_sink.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "daemons/coordinator/test_fakes.h"
#include "data/test_util.h"

namespace capstan::coordinator {
namespace {

struct Save {
  std::string directory;
  int64_t step = 0;
  int max_to_keep = 0;
  kj::Own<kj::PromiseFulfiller<Result<std::string>>> answer;
};

struct Fixture : private kj::TaskSet::ErrorHandler {
  explicit Fixture(CoordinatorConfig c) : config(std::move(c)) {
    health.set(0, PsHealth::State::kUp, Status::Ok(), kj::origin<kj::TimePoint>());
    policy.start();
  }
  void taskFailed(kj::Exception&& exception) override { FAIL(exception.getDescription().cStr()); }

  // Answers save `i` with its path ("dir/ckpt-<step>").
  void finish(size_t i) {
    REQUIRE(i < saves.size());
    saves[i].answer->fulfill(Result<std::string>(saves[i].directory + "/ckpt-" + std::to_string(saves[i].step)));
    ws.poll();
  }
  void advance(kj::Duration d) {
    timer.advanceTo(timer.now() + d);
    ws.poll();
  }

  CoordinatorConfig config;
  kj::EventLoop loop;
  kj::WaitScope ws{loop};
  kj::TimerImpl timer{kj::origin<kj::TimePoint>()};
  kj::TaskSet tasks{*this};
  ChangeSignal changes{timer};
  CoordinatorStats stats;
  testing::FakeParameterServers ps{1};
  PsHealth health{ps, kj::origin<kj::TimePoint>(), std::chrono::milliseconds(30000)};
  CoordinatorJournal journal;  // closed
  std::vector<Save> saves;
  CheckpointPolicy policy{config,
                          LoopContext{timer, tasks, changes, stats,
                                      std::make_shared<spdlog::logger>(
                                          "checkpoint_policy_test", std::make_shared<spdlog::sinks::null_sink_mt>())},
                          health, journal, [this](std::string directory, int64_t step, int max_to_keep) {
                            auto paf = kj::newPromiseAndFulfiller<Result<std::string>>();
                            saves.push_back({std::move(directory), step, max_to_keep, kj::mv(paf.fulfiller)});
                            return kj::mv(paf.promise);
                          }};
};

CoordinatorConfig every_steps(const std::string& dir, int64_t steps) {
  CoordinatorConfig config;
  config.checkpoint_dir = dir;
  config.checkpoint_every_steps = steps;
  config.checkpoint_max_to_keep = 2;
  return config;
}

TEST_CASE("the policy saves every checkpoint_every_steps closures, numbered by closures completed",
          "[coordinator][policy]") {
  io::testing::TempDir dir;
  Fixture f(every_steps(dir.path(), 2));
  f.policy.closure_succeeded();
  CHECK(f.saves.empty());
  f.policy.closure_succeeded();
  REQUIRE(f.saves.size() == 1);
  CHECK(f.saves[0].directory == dir.path());
  CHECK(f.saves[0].step == 2);
  CHECK(f.saves[0].max_to_keep == 2);
  f.finish(0);
  f.policy.closure_succeeded();
  CHECK(f.saves.size() == 1);
  f.policy.closure_succeeded();
  REQUIRE(f.saves.size() == 2);
  CHECK(f.saves[1].step == 4);
  f.finish(1);
}

TEST_CASE("a save that comes due while one runs starts when it ends", "[coordinator][policy]") {
  io::testing::TempDir dir;
  Fixture f(every_steps(dir.path(), 1));
  f.policy.closure_succeeded();
  f.policy.closure_succeeded();
  f.policy.closure_succeeded();
  REQUIRE(f.saves.size() == 1);
  CHECK(f.saves[0].step == 1);
  f.finish(0);
  REQUIRE(f.saves.size() == 2);
  CHECK(f.saves[1].step == 3);
  f.finish(1);
}

TEST_CASE("no policy save while a parameter server is not up", "[coordinator][policy]") {
  io::testing::TempDir dir;
  Fixture f(every_steps(dir.path(), 1));
  f.health.set(0, PsHealth::State::kDown, Status::Ok(), f.timer.now());
  f.policy.closure_succeeded();
  CHECK(f.saves.empty());
  f.health.set(0, PsHealth::State::kUp, Status::Ok(), f.timer.now());
  f.policy.closure_succeeded();
  REQUIRE(f.saves.size() == 1);
  CHECK(f.saves[0].step == 2);
  f.finish(0);
}

TEST_CASE("policy steps go on from the newest checkpoint in checkpoint_dir", "[coordinator][policy]") {
  io::testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/ckpt-40");
  Fixture f(every_steps(dir.path(), 1));
  f.policy.closure_succeeded();
  REQUIRE(f.saves.size() == 1);
  CHECK(f.saves[0].step == 41);
  f.finish(0);
}

TEST_CASE("the timer saves only when closures completed since the last save", "[coordinator][policy]") {
  io::testing::TempDir dir;
  CoordinatorConfig config;
  config.checkpoint_dir = dir.path();
  config.checkpoint_every_seconds = std::chrono::seconds(10);
  Fixture f(config);
  f.advance(10 * kj::SECONDS);
  CHECK(f.saves.empty());
  f.policy.closure_succeeded();
  CHECK(f.saves.empty());  // not by steps
  f.advance(10 * kj::SECONDS);
  REQUIRE(f.saves.size() == 1);
  CHECK(f.saves[0].step == 1);
  f.finish(0);
  f.advance(10 * kj::SECONDS);
  CHECK(f.saves.size() == 1);
}

TEST_CASE("leaving saves a checkpoint unless the last policy save is current", "[coordinator][policy]") {
  io::testing::TempDir dir;
  CoordinatorConfig config;
  config.checkpoint_dir = dir.path();
  {
    Fixture f(config);
    f.policy.closure_succeeded();
    bool left = false;
    auto leaving =
        f.policy.before_leaving("worker 1 leaving").then([&]() { left = true; }).eagerlyEvaluate(nullptr);
    f.ws.poll();
    REQUIRE(f.saves.size() == 1);
    CHECK(f.saves[0].step == 1);
    CHECK_FALSE(left);
    f.finish(0);
    CHECK(left);
    // Nothing completed since: the same checkpoint stands.
    f.policy.set_last(f.saves[0].directory + "/ckpt-1");
    CHECK(f.policy.before_leaving("draining").poll(f.ws));
    CHECK(f.saves.size() == 1);
  }
  config.checkpoint_on_preemption = false;
  Fixture off(config);
  off.policy.closure_succeeded();
  CHECK(off.policy.before_leaving("draining").poll(off.ws));
  CHECK(off.saves.empty());
}

TEST_CASE("a lost parameter server is restored from the last checkpoint, else checkpoint_dir",
          "[coordinator][policy]") {
  CoordinatorConfig config;
  {
    Fixture none(config);
    CHECK(none.policy.recovery_source().empty());
  }
  config.checkpoint_dir = "/ckpt";
  Fixture f(config);
  CHECK(f.policy.recovery_source() == "/ckpt");
  f.policy.set_last("/elsewhere/ckpt-3");
  CHECK(f.policy.last() == "/elsewhere/ckpt-3");
  CHECK(f.policy.recovery_source() == "/elsewhere/ckpt-3");
}

}  // namespace
}  // namespace capstan::coordinator
