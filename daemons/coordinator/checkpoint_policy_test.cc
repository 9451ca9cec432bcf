// The checkpoint policy alone: a save function that records its calls and
// answers when the test says, on a manual clock.
#include "daemons/coordinator/checkpoint_policy.h"

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

struct Fixture : testing::CoordinatorParts {
  explicit Fixture(CoordinatorConfig c) : config(std::move(c)) { policy.start(); }

  // `n` closures succeed.
  void succeed(int n = 1) {
    for (int i = 0; i < n; ++i) policy.closure_succeeded();
  }
  // The policy asked for save `i`, the last so far, at `step`: answers it.
  void saved(size_t i, int64_t step) {
    REQUIRE(saves.size() == i + 1);
    CHECK(saves[i].step == step);
    finish(i);
  }
  // Answers save `i` with its path ("dir/ckpt-<step>").
  void finish(size_t i) {
    REQUIRE(i < saves.size());
    saves[i].answer->fulfill(Result<std::string>(saves[i].directory + "/ckpt-" + std::to_string(saves[i].step)));
    ws.poll();
  }

  CoordinatorConfig config;
  CoordinatorJournal journal;  // closed
  std::vector<Save> saves;
  CheckpointPolicy policy{config, context, health, journal,
                          [this](std::string directory, int64_t step, int max_to_keep) {
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
  f.succeed();
  CHECK(f.saves.empty());
  f.succeed();
  REQUIRE(f.saves.size() == 1);
  CHECK(f.saves[0].directory == dir.path());
  CHECK(f.saves[0].max_to_keep == 2);
  f.saved(0, 2);
  f.succeed();
  CHECK(f.saves.size() == 1);
  f.succeed();
  f.saved(1, 4);
}

TEST_CASE("a save that comes due while one runs starts when it ends", "[coordinator][policy]") {
  io::testing::TempDir dir;
  Fixture f(every_steps(dir.path(), 1));
  f.succeed(3);
  f.saved(0, 1);
  f.saved(1, 3);
}

TEST_CASE("no policy save while a parameter server is not up", "[coordinator][policy]") {
  io::testing::TempDir dir;
  Fixture f(every_steps(dir.path(), 1));
  f.health.set(0, PsHealth::State::kDown, Status::Ok(), f.timer.now());
  f.succeed();
  CHECK(f.saves.empty());
  f.health.set(0, PsHealth::State::kUp, Status::Ok(), f.timer.now());
  f.succeed();
  f.saved(0, 2);
}

TEST_CASE("policy steps go on from the newest checkpoint in checkpoint_dir", "[coordinator][policy]") {
  io::testing::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/ckpt-40");
  Fixture f(every_steps(dir.path(), 1));
  f.succeed();
  f.saved(0, 41);
}

TEST_CASE("the timer saves only when closures completed since the last save", "[coordinator][policy]") {
  io::testing::TempDir dir;
  CoordinatorConfig config;
  config.checkpoint_dir = dir.path();
  config.checkpoint_every_seconds = std::chrono::seconds(10);
  Fixture f(config);
  f.advance(10 * kj::SECONDS);
  CHECK(f.saves.empty());
  f.succeed();
  CHECK(f.saves.empty());  // not by steps
  f.advance(10 * kj::SECONDS);
  f.saved(0, 1);
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
