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
  explicit Fixture(CoordinatorConfig c = {}, int num_ps = 1)
      : CoordinatorParts(num_ps, /*ps_up=*/false, 10 * kj::SECONDS), config(std::move(c)) {
    // A variable with its one shard on ps:0, which holds it (and with two
    // servers, "v" on ps:1).
    restore_variable("w", 2, 0);
    ps.tasks[0].shards["w/part_0"].value = testing::floats({1, 2}, {2});
    if (num_ps > 1) {
      restore_variable("v", 1, 1);
      ps.tasks[1].shards["v/part_0"].value = testing::floats({7}, {1});
    }
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

CoordinatorConfig peer_config() {
  CoordinatorConfig config;
  config.peer_snapshot_every_seconds = std::chrono::seconds(1);
  return config;
}

TEST_CASE("with peer snapshots each parameter server sends its buddy its shards every interval",
          "[coordinator][ps_recovery][peer]") {
  Fixture f(peer_config(), 2);
  f.ps.come_up(0);
  f.ps.come_up(1);
  f.ws.poll();
  CHECK(f.recovery.buddy(0) == 1);
  CHECK(f.recovery.buddy(1) == 0);
  CHECK(f.ps.tasks[0].peer_sends.empty());
  f.advance(1 * kj::SECONDS);
  CHECK(f.ps.tasks[0].peer_sends.size() == 1);
  CHECK(f.ps.tasks[1].peer_sends.size() == 1);
  CHECK(f.ps.tasks[1].peer_copies.at(0).count("w/part_0") == 1);
  CHECK(f.ps.tasks[0].peer_copies.at(1).count("v/part_0") == 1);
  CHECK(f.stats.peer_snapshots == 2);
  // A holder that is down is not sent to.
  f.ps.go_down(1);
  f.ws.poll();
  f.advance(1 * kj::SECONDS);
  CHECK(f.ps.tasks[0].peer_sends.size() == 1);
}

TEST_CASE("a holder that lost its copy is sent a full peer snapshot at once", "[coordinator][ps_recovery][peer]") {
  Fixture f(peer_config(), 2);
  f.ps.come_up(0);
  f.ps.come_up(1);
  f.ws.poll();
  f.advance(1 * kj::SECONDS);
  REQUIRE(f.ps.tasks[0].peer_sends == std::vector<bool>{false});
  f.ps.tasks[1].peer_copies.clear();  // ps:1 restarted between two snapshots
  f.advance(1 * kj::SECONDS);
  CHECK(f.ps.tasks[0].peer_sends == std::vector<bool>{false, true});
  CHECK(f.ps.tasks[1].peer_copies.count(0) == 1);
  CHECK(f.stats.peer_snapshot_failures == 1);
}

TEST_CASE("peer snapshots are off by default and with one parameter server", "[coordinator][ps_recovery][peer]") {
  {
    Fixture off({}, 2);
    CHECK(off.recovery.buddy(0) == -1);
  }
  Fixture one(peer_config(), 1);
  CHECK(one.recovery.buddy(0) == -1);
}

TEST_CASE("a parameter server that restarted empty gets its shards from its buddy's copy, without a checkpoint",
          "[coordinator][ps_recovery][peer]") {
  Fixture f(peer_config(), 2);
  f.ps.come_up(0);
  f.ps.come_up(1);
  f.ws.poll();
  // Calls wait through an outage: the buddy's copy can bring it back.
  f.advance(1 * kj::SECONDS);
  // An update after the snapshot: what the recovery loses.
  f.ps.tasks[0].shards["w/part_0"].value = testing::floats({5, 6}, {2});
  f.ps.go_down(0);
  f.ws.poll();
  CHECK(f.health.state(0) == State::kDown);
  CHECK(f.recovery.pause_deadline().has_value());
  f.ps.tasks[0].shards.clear();  // it restarted empty
  f.ps.come_up(0);
  f.ws.poll();
  CHECK(f.health.state(0) == State::kUp);
  CHECK(f.ps.tasks[0].restored_from_peer == std::vector<std::string>{"w/part_0"});
  CHECK(f.ps.tasks[0].restored.empty());  // not from disk
  CHECK(testing::values_of(f.ps.tasks[0].shards["w/part_0"].value) == std::vector<float>{1, 2});
  CHECK(f.recovery.recoveries() == 1);
  CHECK(f.recovery.peer_recoveries() == 1);
  CHECK(f.stats.ps_peer_recoveries == 1);
}

TEST_CASE("a parameter server whose buddy holds no copy of it falls back to the checkpoint, and is lost without one",
          "[coordinator][ps_recovery][peer]") {
  Fixture f(peer_config(), 2);
  f.ps.come_up(0);
  f.ps.come_up(1);
  f.ws.poll();
  f.ps.restart_empty(0);  // before the first snapshot
  f.ws.poll();
  CHECK(f.health.state(0) == State::kLost);
  CHECK_THAT(f.health.lost(0).message(), Catch::Contains("nor a peer snapshot on its buddy"));
  CHECK(f.recovery.peer_recoveries() == 0);
}

}  // namespace
}  // namespace capstan::coordinator
