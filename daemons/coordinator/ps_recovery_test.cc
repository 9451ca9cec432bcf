// PsRecovery alone: fake parameter servers whose links the test breaks and
// restores, a variable table and checkpoint policy of its own, a manual
// clock. (Recovering shards from a real checkpoint: recovery_test.cc.)
#include "daemons/coordinator/ps_recovery.h"

#include <catch2/catch.hpp>

#include "daemons/coordinator/test_fakes.h"

namespace capstan::coordinator {
namespace {

using State = PsHealth::State;

struct Fixture : testing::CoordinatorParts {
  explicit Fixture(CoordinatorConfig c = {})
      : CoordinatorParts(1, /*ps_up=*/false, 10 * kj::SECONDS), config(std::move(c)) {
    // A variable with its one shard on ps:0, which holds it.
    restore_variable("w", 2, 0);
    ps.tasks[0].shards["w/part_0"].value = testing::floats({1, 2}, {2});
    recovery.start();
    ws.poll();
  }
  ~Fixture() { pool.join(); }  // before the parts below go

  CoordinatorConfig config;
  CoordinatorJournal journal;  // closed
  CheckpointPolicy policy{config, context, health, journal,
                          [](std::string, int64_t, int) { return Result<std::string>(Status::Unimplemented("save")); }};
  PsRecovery recovery{config, ps, health, variables, policy, pool, context};
};

TEST_CASE("a parameter server that comes back with its shards is up, one that restarted empty, with nothing to "
          "restore from, is lost saying so",
          "[coordinator][ps_recovery]") {
  Fixture f;
  CHECK(f.health.state(0) == State::kDown);
  f.ps.come_up(0);
  f.ws.poll();
  CHECK(f.health.state(0) == State::kUp);
  CHECK(f.notified == 1);
  f.ps.go_down(0);
  f.ws.poll();
  CHECK(f.health.state(0) == State::kDown);
  f.ps.tasks[0].shards.clear();
  f.ps.come_up(0);
  f.ws.poll();
  CHECK(f.health.state(0) == State::kLost);
  CHECK(f.health.lost(0).code() == StatusCode::kDataLoss);
  CHECK_THAT(f.health.lost(0).message(),
             Catch::StartsWith("parameter server ps:0 at ps0:7000 came back without 1 shard(s) (w/part_0) and there "
                               "is no checkpoint to restore them from"));
  CHECK(f.recovery.recoveries() == 0);
  // A restore by hand brings it back.
  f.recovery.restored_by_hand();
  CHECK(f.health.state(0) == State::kUp);
}

TEST_CASE("with ps_recovery off, a parameter server that comes back empty is lost at once",
          "[coordinator][ps_recovery]") {
  CoordinatorConfig config;
  config.ps_recovery = false;
  config.checkpoint_dir = "/ckpt";
  Fixture f(config);
  f.ps.tasks[0].shards.clear();
  f.ps.come_up(0);
  f.ws.poll();
  CHECK(f.health.state(0) == State::kLost);
  CHECK_THAT(f.health.lost(0).message(), Catch::Contains("ps_recovery is off"));
}

TEST_CASE("calls wait through an outage only while there is a checkpoint to recover from",
          "[coordinator][ps_recovery]") {
  {
    CoordinatorConfig none;
    Fixture without(none);
    without.ps.come_up(0);
    without.ws.poll();
    without.ps.go_down(0);
    without.ws.poll();
    CHECK_FALSE(without.recovery.pause_deadline());
  }

  CoordinatorConfig config;
  config.checkpoint_dir = "/ckpt";
  Fixture f(config);
  f.ps.come_up(0);
  f.ws.poll();
  f.timer.advanceTo(f.timer.now() + 20 * kj::SECONDS);
  f.ps.go_down(0);
  f.ws.poll();
  auto until = f.recovery.pause_deadline();
  REQUIRE(until.has_value());
  CHECK(*until == f.timer.now() + 30 * kj::SECONDS);
}

}  // namespace
}  // namespace capstan::coordinator
