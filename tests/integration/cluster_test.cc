// A whole local cluster: capstanctl health sees every role; a cluster token
// keeps out clients that lack it.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "tests/harness/process.h"

namespace capstan::testing {
namespace {
using namespace std::chrono_literals;

std::string read_cmdline(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("capstanctl health lists all five roles of a local cluster", "[cluster]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  Daemon& coordinator = cluster.start("coordinator", {"--ps", ps.address()});
  Daemon& worker = cluster.start("worker-server", {"--coordinator", coordinator.address()});
  Daemon& dispatcher = cluster.start("data-dispatcher");
  Daemon& data_worker = cluster.start("data-worker", {"--dispatcher", dispatcher.address()});
  std::vector<Daemon*> all = {&coordinator, &ps, &worker, &dispatcher, &data_worker};
  for (Daemon* d : all) {
    CHECK(wait_until([d]() { return d->http_get("/readyz").first == 200; }, 15s));
  }
  std::vector<std::string> args = {"health"};
  for (Daemon* d : all) args.push_back(d->address());
  auto r = cluster.run("capstanctl", args);
  CHECK(r.exit_code == 0);
  for (const char* role : {"coordinator", "ps", "worker", "data_dispatcher", "data_worker"}) {
    CHECK_THAT(r.output, Catch::Matches("(.|\n)* " + std::string(role) + " +- +0\\.1\\.0 +[0-9]+m[0-9]+s +yes (.|\n)*"));
  }
}

TEST_CASE("capstanctl health fails for an unreachable daemon", "[cluster]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  std::string dead = "127.0.0.1:" + std::to_string(free_port());
  auto r = cluster.run("capstanctl", {"--timeout-ms", "500", "health", ps.address(), dead});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Matches("(.|\n)*" + dead + " +ERROR UNAVAILABLE(.|\n)*"));
  CHECK_THAT(r.output, Catch::Contains(ps.address()));
}

TEST_CASE("capstanctl pointed at a URL or an HTTP port says what it wants, without a stack trace", "[cluster]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  const std::string url = "http://127.0.0.1:" + std::to_string(ps.http_port());
  auto given_url = cluster.run("capstanctl", {"health", url});
  CHECK(given_url.exit_code == 1);
  CHECK_THAT(given_url.output, Catch::Contains("is a URL; RPC addresses are host:port"));
  const std::string http_port = "127.0.0.1:" + std::to_string(ps.http_port());
  auto given_http_port = cluster.run("capstanctl", {"--timeout-ms", "3000", "health", http_port});
  CHECK(given_http_port.exit_code == 1);
  CHECK_THAT(given_http_port.output, Catch::Contains(http_port + " answers HTTP"));
  for (const auto* r : {&given_url, &given_http_port}) {
    CHECK_THAT(r->output, !Catch::Contains("terminate called") && !Catch::Contains("what()") &&
                              !Catch::Contains("stack trace"));
  }
}

TEST_CASE("with a cluster token set, a client without it is refused", "[cluster][token]") {
  TestCluster cluster;
  const std::string token = "tok-3f9a1c";
  std::string token_file = cluster.write_file("token", token + "\n");
  Daemon& coordinator = cluster.start("coordinator", {"--token-file", token_file});
  Daemon& ps = cluster.start("ps-server", {}, {{"CAPSTAN_TOKEN", token}});

  auto anonymous = cluster.run("capstanctl", {"health", coordinator.address(), ps.address()});
  CHECK(anonymous.exit_code == 1);
  CHECK_THAT(anonymous.output, Catch::Contains("UNAUTHENTICATED"));
  CHECK_THAT(anonymous.output, Catch::Contains("no cluster token was sent"));
  CHECK_THAT(anonymous.output, Catch::Contains("set CAPSTAN_TOKEN or --token-file"));
  CHECK_THAT(coordinator.log(), Catch::Contains("refused login from 127.0.0.1"));
  CHECK_THAT(coordinator.http_get("/metrics").second,
             Catch::Contains("capstan_rpc_logins_refused_total 1"));

  auto wrong = cluster.run("capstanctl", {"health", ps.address()}, {{"CAPSTAN_TOKEN", "nope"}});
  CHECK(wrong.exit_code == 1);
  CHECK_THAT(wrong.output, Catch::Contains("UNAUTHENTICATED"));
  CHECK_THAT(wrong.output, Catch::Contains("wrong cluster token"));

  auto with_env = cluster.run("capstanctl", {"health", coordinator.address(), ps.address()},
                              {{"CAPSTAN_TOKEN", token}});
  CHECK(with_env.exit_code == 0);
  auto with_file = cluster.run("capstanctl", {"--token-file", token_file, "health", ps.address()});
  CHECK(with_file.exit_code == 0);

  // Peers present the token too: a worker that has it becomes ready, one
  // that doesn't is refused and stays not ready.
  Daemon& good = cluster.start("worker-server", {"--coordinator", coordinator.address(),
                                                 "--token-file", token_file});
  Daemon& bad = cluster.start("worker-server", {"--coordinator", coordinator.address()},
                              {{"CAPSTAN_TOKEN", "stale"}});
  CHECK(wait_until([&]() { return good.http_get("/readyz").first == 200; }, 15s));
  CHECK(wait_until([&]() { return bad.log().find("wrong cluster token") != std::string::npos; }, 10s));
  CHECK(bad.http_get("/readyz").first == 503);

  // The token is never on a command line (`ps` would show it).
  for (Daemon* d : {&coordinator, &ps, &good}) CHECK(read_cmdline(d->pid()).find(token) == std::string::npos);
}

}  // namespace capstan::testing
