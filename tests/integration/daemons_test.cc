// Each of the five daemons, as a real process: --help, configuration errors
// (exit 2 naming the key), /healthz and /metrics, SIGTERM/SIGINT.
#include <signal.h>

#include <catch2/catch.hpp>

#include "tests/harness/process.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;

struct Role {
  std::string program;
  std::string role;                // as capstanctl prints it
  std::vector<std::string> needs;  // flags the role requires
};

const std::vector<Role>& roles() {
  static const std::vector<Role> kRoles = {
      {"ps-server", "ps", {}},
      {"worker-server", "worker", {"--coordinator", "127.0.0.1:1"}},
      {"coordinator", "coordinator", {}},
      {"data-dispatcher", "data_dispatcher", {}},
      {"data-worker", "data_worker", {"--dispatcher", "127.0.0.1:1"}},
  };
  return kRoles;
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Expects `r` to have exited 2 (a configuration error), its output naming
// each of `parts`.
void check_refused(const RunResult& r, const std::vector<std::string>& parts) {
  CHECK(r.exit_code == 2);
  for (const std::string& part : parts) CHECK_THAT(r.output, Catch::Contains(part));
}

}  // namespace

TEST_CASE("every daemon documents its keys in --help and exits 0", "[daemons]") {
  TestCluster cluster;
  for (const auto& role : roles()) {
    INFO(role.program);
    auto r = cluster.run(role.program, {"--help"});
    CHECK(r.exit_code == 0);
    for (const char* key : {"--port", "--http-port", "--port-file", "--log-level", "--token-file",
                            "--config", "CAPSTAN_PORT", "TF_CONFIG", "--max-message-mib"}) {
      CHECK_THAT(r.output, Catch::Contains(key));
    }
    for (size_t i = 0; i + 1 < role.needs.size(); i += 2) CHECK_THAT(r.output, Catch::Contains(role.needs[i]));
  }
}

TEST_CASE("an unknown key in the config file exits 2 naming the key", "[daemons][config]") {
  TestCluster cluster;
  std::string file = cluster.write_file("bad.yaml", "log_level: info\nprot: 7000\n");
  for (const auto& role : roles()) {
    INFO(role.program);
    auto r = cluster.run(role.program, with({"--config", file}, role.needs));
    check_refused(r, {"prot", "bad.yaml"});
  }
}

TEST_CASE("a value of the wrong type exits 2 naming the key and value", "[daemons][config]") {
  TestCluster cluster;
  for (const auto& role : roles()) {
    INFO(role.program);
    auto flag = cluster.run(role.program, with({"--port", "seventy"}, role.needs));
    check_refused(flag, {"port", "seventy"});
    auto env = cluster.run(role.program, role.needs, {{"CAPSTAN_HTTP_PORT", "8o8o"}});
    check_refused(env, {"CAPSTAN_HTTP_PORT", "8o8o"});
    std::string file = cluster.write_file("type.yaml", "threads: many\n");
    auto yaml = cluster.run(role.program, with({"--config", file}, role.needs));
    check_refused(yaml, {"threads", "many"});
  }
}

TEST_CASE("out-of-range values exit 2 naming the key", "[daemons][config]") {
  TestCluster cluster;
  auto port = cluster.run("ps-server", {"--port", "70000"});
  check_refused(port, {"port: 70000"});
  auto level = cluster.run("ps-server", {"--log-level", "loud"});
  check_refused(level, {"log_level: 'loud'"});
  auto token = cluster.run("ps-server", {"--token-file", cluster.dir() + "/missing-token"});
  check_refused(token, {"token_file", "missing-token"});
}

TEST_CASE("an integer outside its option's range exits 2 naming the key, the value and the range",
          "[daemons][config]") {
  TestCluster cluster;
  // A common key, from each source.
  auto flag = cluster.run("ps-server", {"--max-message-mib", "0"});
  check_refused(flag, {"--max-message-mib: 0 is not in 1..4096"});
  auto env = cluster.run("worker-server", {"--coordinator", "127.0.0.1:1"}, {{"CAPSTAN_THREADS", "5000"}});
  check_refused(env, {"CAPSTAN_THREADS: 5000 is not in 0..1024"});
  std::string file = cluster.write_file("range.yaml", "shutdown_grace_ms: -1\n");
  auto yaml = cluster.run("ps-server", {"--config", file});
  check_refused(yaml, {"key 'shutdown_grace_ms': -1 is below the minimum 0"});
  // A role's own keys.
  auto batch = cluster.run("coordinator", {"--closure-batch", "1025"});
  check_refused(batch, {"--closure-batch: 1025 is not in 1..1024"});
  auto ping = cluster.run("coordinator", {"--worker-ping-timeout-ms", "0"});
  check_refused(ping, {"--worker-ping-timeout-ms: 0 is below the minimum 1"});
  auto dispatcher = cluster.run("data-dispatcher", {}, {{"CAPSTAN_WORKER_TIMEOUT_MS", "0"}});
  check_refused(dispatcher, {"CAPSTAN_WORKER_TIMEOUT_MS: 0 is below the minimum 1"});
  // --help states the range next to the default.
  auto help = cluster.run("coordinator", {"--help"});
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.output, Catch::Contains("1..1024"));
}

TEST_CASE("unparsable YAML exits 2 naming the file", "[daemons][config]") {
  TestCluster cluster;
  std::string file = cluster.write_file("broken.yaml", "port: [1,\nhost: x\n");
  auto r = cluster.run("coordinator", {"--config", file});
  check_refused(r, {"broken.yaml"});
  auto missing = cluster.run("coordinator", {"--config", cluster.dir() + "/nope.yaml"});
  check_refused(missing, {"nope.yaml"});
}

TEST_CASE("a missing required peer address exits 2 naming the key", "[daemons][config]") {
  TestCluster cluster;
  auto worker = cluster.run("worker-server", {});
  check_refused(worker, {"coordinator"});
  auto data_worker = cluster.run("data-worker", {});
  check_refused(data_worker, {"dispatcher"});
  auto bad_address = cluster.run("worker-server", {"--coordinator", "nohost"});
  check_refused(bad_address, {"nohost"});
}

TEST_CASE("an unparsable or mismatched TF_CONFIG exits 2", "[daemons][config]") {
  TestCluster cluster;
  auto bad = cluster.run("ps-server", {}, {{"TF_CONFIG", "{\"cluster\": {"}});
  check_refused(bad, {"TF_CONFIG"});
  auto mismatch = cluster.run(
      "ps-server", {},
      {{"TF_CONFIG", R"({"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                        "task": {"type": "worker", "index": 0}})"}});
  check_refused(mismatch, {"'worker'"});
}

TEST_CASE("a port already in use exits 2 naming the port", "[daemons][config]") {
  TestCluster cluster;
  Daemon& first = cluster.start("ps-server");
  auto rpc = cluster.run("ps-server", {"--port", std::to_string(first.rpc_port())});
  check_refused(rpc, {"port", std::to_string(first.rpc_port()), "in use"});
  auto http = cluster.run("ps-server", {"--port", "0", "--http-port", std::to_string(first.http_port())});
  check_refused(http, {"http_port", std::to_string(first.http_port())});
}

TEST_CASE("every daemon serves /healthz and /metrics and exits 0 on SIGTERM", "[daemons]") {
  TestCluster cluster;
  for (const auto& role : roles()) {
    INFO(role.program);
    Daemon& daemon = cluster.start(role.program, role.needs);
    auto health = daemon.http_get("/healthz");
    CHECK(health.first == 200);
    CHECK(health.second == "ok\n");
    // One RPC so the per-method counters have something to show.
    auto ctl = cluster.run("capstanctl", {"health", daemon.address()});
    CHECK(ctl.exit_code == 0);
    CHECK_THAT(ctl.output, Catch::Contains(role.role));
    auto metrics = daemon.http_get("/metrics");
    CHECK(metrics.first == 200);
    CHECK_THAT(metrics.second, Catch::Contains("# TYPE capstan_uptime_seconds gauge"));
    CHECK_THAT(metrics.second, Catch::Contains("capstan_rpc_calls_total{method=\"Node.info\"} 1"));
    CHECK_THAT(metrics.second, Catch::Contains("capstan_rpc_received_bytes_total"));
    CHECK_THAT(metrics.second, Catch::Contains("capstan_rpc_sent_bytes_total"));
    CHECK_THAT(metrics.second, Catch::Contains("# TYPE process_cpu_seconds_total counter"));
    CHECK_THAT(metrics.second, Catch::Contains("process_resident_memory_bytes "));
    CHECK_THAT(metrics.second, Catch::Contains("process_open_fds "));
    auto started = std::chrono::steady_clock::now();
    auto code = daemon.stop(SIGTERM, 10s);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(std::chrono::steady_clock::now() - started < 10s);
    CHECK_THAT(daemon.log(), Catch::Contains("received SIGTERM"));
  }
}

TEST_CASE("SIGINT stops a daemon with exit code 0", "[daemons]") {
  TestCluster cluster;
  Daemon& daemon = cluster.start("data-dispatcher");
  auto code = daemon.stop(SIGINT, 10s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("log lines carry the role and task index", "[daemons]") {
  TestCluster cluster;
  Daemon& daemon = cluster.start("ps-server", {"--task-index", "3"});
  CHECK_THAT(daemon.log(), Catch::Contains(" ps:3 "));
  CHECK_THAT(daemon.log(), Catch::Contains("listening: rpc=127.0.0.1:" + std::to_string(daemon.rpc_port())));
}

TEST_CASE("a TF_CONFIG cluster spec gives the task its index and port", "[daemons][config]") {
  TestCluster cluster;
  uint16_t p0 = free_port();
  uint16_t p1 = free_port();
  std::string tf_config = R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:)" +
                          std::to_string(p0) + R"(", "127.0.0.1:)" + std::to_string(p1) +
                          R"("]}, "task": {"type": "ps", "index": 1}})";
  Daemon& daemon = cluster.start("ps-server", {}, {{"TF_CONFIG", tf_config}}, true, false);
  CHECK(daemon.rpc_port() == p1);
  auto ctl = cluster.run("capstanctl", {"health", "127.0.0.1:" + std::to_string(p1)});
  CHECK(ctl.exit_code == 0);
  CHECK_THAT(ctl.output, Catch::Matches("(.|\n)*ps +1 (.|\n)*"));
}

TEST_CASE("a YAML cluster spec names the coordinator's parameter servers", "[daemons][config]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  std::string file = cluster.write_file(
      "cluster.yaml", "cluster:\n  chief: [\"127.0.0.1:1\"]\n  ps: [\"" + ps.address() +
                          "\"]\ntask:\n  type: chief\n  index: 0\n");
  Daemon& coordinator = cluster.start("coordinator", {"--config", file});
  CHECK(wait_until([&]() { return coordinator.http_get("/readyz").first == 200; }, 15s));
  CHECK_THAT(coordinator.log(), Catch::Contains("connected to ps at " + ps.address()));
}

TEST_CASE("flags override CAPSTAN_ variables, which override the file", "[daemons][config]") {
  TestCluster cluster;
  std::string file = cluster.write_file("c.yaml", "task_index: 1\n");
  auto task_of = [&cluster](Daemon& d) {
    auto r = cluster.run("capstanctl", {"health", d.address()});
    return r.output;
  };
  Daemon& from_file = cluster.start("ps-server", {"--config", file});
  CHECK_THAT(task_of(from_file), Catch::Matches("(.|\n)*ps +1 (.|\n)*"));
  Daemon& from_env = cluster.start("ps-server", {"--config", file}, {{"CAPSTAN_TASK_INDEX", "2"}});
  CHECK_THAT(task_of(from_env), Catch::Matches("(.|\n)*ps +2 (.|\n)*"));
  Daemon& from_flag = cluster.start("ps-server", {"--config", file, "--task-index", "3"},
                                    {{"CAPSTAN_TASK_INDEX", "2"}});
  CHECK_THAT(task_of(from_flag), Catch::Matches("(.|\n)*ps +3 (.|\n)*"));
}

}  // namespace capstan::testing
