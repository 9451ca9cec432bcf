// Liveness vs readiness: a daemon answers /healthz at once, and /readyz only
// while it has the peers it needs, reconnecting with backoff.
#include <signal.h>

#include <catch2/catch.hpp>

#include "tests/harness/process.h"

namespace capstan::testing {
namespace {
using namespace std::chrono_literals;
}  // namespace

TEST_CASE("a worker is live at once but ready only while its coordinator is up", "[readiness]") {
  TestCluster cluster;
  uint16_t port = free_port();
  std::string coordinator_address = "127.0.0.1:" + std::to_string(port);
  Daemon& worker = cluster.start("worker-server", {"--coordinator", coordinator_address});

  CHECK(worker.http_get("/healthz").first == 200);
  auto not_ready = worker.http_get("/readyz");
  CHECK(not_ready.first == 503);
  CHECK_THAT(not_ready.second, Catch::Contains("waiting for coordinator at " + coordinator_address));
  CHECK(wait_until([&]() { return worker.log().find("waiting for coordinator") != std::string::npos; }, 5s));

  Daemon& coordinator = cluster.start("coordinator", {"--port", std::to_string(port)});
  CHECK(wait_until([&]() { return worker.http_get("/readyz").first == 200; }, 15s));
  CHECK_THAT(worker.log(), Catch::Contains("connected to coordinator at " + coordinator_address));

  coordinator.kill_now();
  CHECK(wait_until([&]() { return worker.http_get("/readyz").first == 503; }, 10s));
  CHECK(wait_until([&]() { return worker.log().find("lost coordinator") != std::string::npos; }, 5s));
  CHECK(worker.http_get("/healthz").first == 200);

  // And back again when the coordinator returns.
  cluster.start("coordinator", {"--port", std::to_string(port)});
  CHECK(wait_until([&]() { return worker.http_get("/readyz").first == 200; }, 15s));
}

TEST_CASE("a peer of the wrong role does not make a daemon ready", "[readiness]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  Daemon& worker = cluster.start("worker-server", {"--coordinator", ps.address()});
  CHECK(wait_until([&]() { return worker.log().find("is a ps, expected a coordinator") != std::string::npos; }, 10s));
  CHECK(worker.http_get("/readyz").first == 503);
}

TEST_CASE("a coordinator is ready once every parameter server is reachable", "[readiness]") {
  TestCluster cluster;
  Daemon& ps0 = cluster.start("ps-server");
  uint16_t late_port = free_port();
  std::string late = "127.0.0.1:" + std::to_string(late_port);
  Daemon& coordinator = cluster.start("coordinator", {"--ps", ps0.address() + "," + late});
  CHECK(wait_until([&]() { return coordinator.log().find("connected to ps at " + ps0.address()) != std::string::npos; }, 10s));
  auto waiting = coordinator.http_get("/readyz");
  CHECK(waiting.first == 503);
  CHECK_THAT(waiting.second, Catch::Contains("ps at " + late));
  CHECK_THAT(waiting.second, !Catch::Contains("ps at " + ps0.address()));
  cluster.start("ps-server", {"--port", std::to_string(late_port)});
  CHECK(wait_until([&]() { return coordinator.http_get("/readyz").first == 200; }, 15s));
}

TEST_CASE("a coordinator without parameter servers is ready but says so, in /readyz and its log", "[readiness]") {
  TestCluster cluster;
  Daemon& coordinator = cluster.start("coordinator");
  auto ready = coordinator.http_get("/readyz");
  CHECK(ready.first == 200);
  CHECK_THAT(ready.second, Catch::StartsWith("ready\n"));
  CHECK_THAT(ready.second, Catch::Contains("caution: no parameter servers configured"));
  CHECK(wait_until([&]() { return coordinator.log().find("no parameter servers configured") != std::string::npos; },
                   10s));
}

TEST_CASE("a data worker is ready once its dispatcher is reachable", "[readiness]") {
  TestCluster cluster;
  Daemon& dispatcher = cluster.start("data-dispatcher");
  Daemon& worker = cluster.start("data-worker", {"--dispatcher", dispatcher.address()});
  CHECK(wait_until([&]() { return worker.http_get("/readyz").first == 200; }, 15s));
  CHECK(worker.http_get("/metrics").second.find("capstan_ready 1") != std::string::npos);
}

}  // namespace capstan::testing
