// What operators look at: the status page at `/` (and the /status.json it
// reads), rendered by a real browser (headless Chromium), the figures a
// program reports for it, advertise_address as peers see it, and /metrics
// of every daemon through Prometheus' own checker (promtool).
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/data/service.h"
#include "capstan/training.h"
#include "tests/harness/process.h"
#include "tests/build_path.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

json status_of(const Daemon& daemon) {
  auto [code, body] = daemon.http_get("/status.json");
  REQUIRE(code == 200);
  return json::parse(body);
}

const json* table(const json& status, const std::string& title) {
  for (const json& t : status["tables"]) {
    if (t["title"] == title) return &t;
  }
  return nullptr;
}

const json* plot(const json& status, const std::string& title) {
  for (const json& p : status["plots"]) {
    if (p["title"] == title) return &p;
  }
  return nullptr;
}

// /status.json once `ready` holds for it (the board samples once a second),
// or the last one read after 15 s.
json status_when(const Daemon& daemon, const std::function<bool(const json&)>& ready) {
  json status;
  wait_until([&]() {
    status = status_of(daemon);
    return ready(status);
  }, 15s);
  return status;
}

// Runs `command`, returning its exit status and output (stdout and stderr).
std::pair<int, std::string> run(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

bool have(const std::string& program) { return run("command -v " + program).first == 0; }

// A fresh directory, removed at the end of the test.
struct TempDir {
  TempDir() {
    char pattern[] = "/tmp/capstan-status-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    dir = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  const std::string& path() const { return dir; }
  std::string dir;
};

struct Cluster {
  Cluster() {
    ps.push_back(&cluster.start("ps-server", {"--task-index", "0"}));
    ps.push_back(&cluster.start("ps-server", {"--task-index", "1"}));
    coordinator = &cluster.start("coordinator", {"--ps", ps[0]->address() + "," + ps[1]->address()});
    // The worker advertises a name rather than the bind address.
    worker = &cluster.start("worker-server", {"--coordinator", coordinator->address(), "--advertise-address",
                                              "localhost", "--module", capstan::testing::build_path(CAPSTAN_TRAINING_MODULE)});
    client = ClusterCoordinator::connect(coordinator->address()).value();
    REQUIRE(wait_until([this]() { return client->num_workers() == 1; }, 15s));
    Tensor initial = Tensor::zeros(DType::kFloat32, {10, 4}).value();
    REQUIRE(client->create_variable({"emb", initial, Optimizer::sgd(0.1), Partitioner::fixed_shards(2)}).ok());
  }
  TestCluster cluster;
  std::vector<Daemon*> ps;
  Daemon* coordinator = nullptr;
  Daemon* worker = nullptr;
  std::unique_ptr<ClusterCoordinator> client;
};

TEST_CASE("the coordinator's status page lists members, placement and the program's reported figures",
          "[status]") {
  Cluster c;
  for (int step = 1; step <= 5; ++step) {
    REQUIRE(c.client->report_scalar("loss", 1.0 / step, step).ok());
  }
  json status = status_when(*c.coordinator, [](const json& s) {
    const json* loss = plot(s, "loss (reported)");
    const json* variables = table(s, "Variables");
    return loss != nullptr && loss->at("points").size() == 5 && variables != nullptr &&
           variables->at("rows").size() == 1;
  });

  const json* workers = table(status, "Workers");
  REQUIRE(workers != nullptr);
  REQUIRE(workers->at("rows").size() == 1);
  CHECK(workers->at("rows")[0][2] == "localhost:" + std::to_string(c.worker->rpc_port()));
  CHECK(workers->at("rows")[0][3] == "up");

  const json* ps = table(status, "Parameter servers");
  REQUIRE(ps != nullptr);
  REQUIRE(ps->at("rows").size() == 2);
  for (int task = 0; task < 2; ++task) {
    CHECK(ps->at("rows")[task][1] == c.ps[task]->address());
    CHECK(ps->at("rows")[task][2] == "up");
    CHECK(ps->at("rows")[task][3] == "1");  // one shard of emb each
  }

  const json* variables = table(status, "Variables");
  REQUIRE(variables != nullptr);
  REQUIRE(variables->at("rows").size() == 1);
  CHECK(variables->at("rows")[0][0] == "emb");
  CHECK(variables->at("rows")[0][2] == "[10, 4]");
  CHECK_THAT(variables->at("rows")[0][3].get<std::string>(),
             Catch::Contains("emb/part_0: ps 0, 0+5") && Catch::Contains("emb/part_1: ps 1, 5+5"));

  const json* loss = plot(status, "loss (reported)");
  REQUIRE(loss != nullptr);
  REQUIRE(loss->at("points").size() == 5);
  CHECK(loss->at("points")[4][1].get<double>() == Approx(0.2));
  CHECK(plot(status, "closures/s (completed)") != nullptr);

  // The page itself is static HTML that reads status.json.
  auto [code, page] = c.coordinator->http_get("/");
  CHECK(code == 200);
  CHECK_THAT(page, Catch::Contains("status.json"));
}

TEST_CASE("the coordinator's status page shows each worker's runs, phases and a line per worker", "[status]") {
  Cluster c;
  for (int i = 0; i < 4; ++i) REQUIRE(c.client->fetch(c.client->schedule("noop").value()).ok());
  json status = status_when(*c.coordinator, [](const json& s) {
    const json* rate = plot(s, "closures+steps/s by worker");
    const json* workers = table(s, "Workers");
    return rate != nullptr && workers != nullptr && workers->at("rows").size() == 1 &&
           workers->at("rows")[0][4] == "4";
  });
  const json* workers = table(status, "Workers");
  REQUIRE(workers != nullptr);
  CHECK(workers->at("columns")[4] == "runs");
  CHECK(workers->at("columns")[6] == "straggler score");
  REQUIRE(workers->at("rows").size() == 1);
  CHECK(workers->at("rows")[0][4] == "4");
  CHECK(workers->at("rows")[0][6] == "-");  // one worker: no median to compare with
  CHECK_THAT(workers->at("rows")[0][7].get<std::string>(), Catch::Contains("queued ") && Catch::Contains("compute "));
  const json* rate = plot(status, "closures+steps/s by worker");
  REQUIRE(rate != nullptr);
  REQUIRE(rate->contains("lines"));
  REQUIRE(rate->at("lines").size() == 1);
  CHECK(rate->at("lines")[0]["label"] == "worker 0");
  CHECK_FALSE(rate->at("lines")[0]["points"].empty());
}

TEST_CASE("report_scalar refuses what the page cannot show, naming it", "[status]") {
  Cluster c;
  Status empty = c.client->report_scalar("", 1.0, 1);
  CHECK(empty.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(empty.message(), Catch::Contains("1 to 128 bytes"));
  Status nan = c.client->report_scalar("loss", std::nan(""), 1);
  CHECK(nan.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(nan.message(), Catch::Contains("'loss'") && Catch::Contains("not finite"));
  for (int i = 0; i < 32; ++i) REQUIRE(c.client->report_scalar("tag" + std::to_string(i), i, 1).ok());
  Status too_many = c.client->report_scalar("one-more", 1.0, 1);
  CHECK(too_many.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(too_many.message(), Catch::Contains("at most 32"));
  CHECK(c.client->report_scalar("tag3", 3.5, 2).ok());  // a known tag still takes points
}

TEST_CASE("the dispatcher's status page lists its data workers and datasets", "[status]") {
  TestCluster cluster;
  Daemon& dispatcher = cluster.start("data-dispatcher");
  Daemon& worker = cluster.start("data-worker", {"--dispatcher", dispatcher.address(), "--advertise-address",
                                                 "localhost"});
  const std::string advertised = "localhost:" + std::to_string(worker.rpc_port());
  REQUIRE(wait_until([&]() {
    const json status = status_of(dispatcher);
    const json* workers = table(status, "Data workers");
    return workers != nullptr && workers->at("rows").size() == 1 && workers->at("rows")[0][0] == advertised &&
           workers->at("rows")[0][3] == "up";
  }, 15s));
  auto id = data::service::register_dataset(dispatcher.address(), data::Dataset::range(100));
  REQUIRE(id.ok());
  json status = status_when(dispatcher, [](const json& s) {
    const json* datasets = table(s, "Datasets");
    return datasets != nullptr && !datasets->at("rows").empty();
  });
  const json* datasets = table(status, "Datasets");
  REQUIRE(datasets != nullptr);
  REQUIRE(datasets->at("rows").size() == 1);
  CHECK(datasets->at("rows")[0][0] == *id);
  CHECK(plot(status, "data workers") != nullptr);
}

TEST_CASE("headless Chromium renders the coordinator's status page: members, placement, plots", "[status][browser]") {
  const std::string chromium = have("chromium") ? "chromium" : have("chromium-browser") ? "chromium-browser" : "";
  REQUIRE_FALSE(chromium.empty());  // scripts/setup.sh --test installs it (Debian's chromium)
  Cluster c;
  for (int step = 1; step <= 3; ++step) REQUIRE(c.client->report_scalar("loss", 0.7 / step, step).ok());
  std::this_thread::sleep_for(2500ms);  // a few samples for the sampled plots
  TempDir profile;
  auto [code, dom] = run("timeout 60 " + chromium + " --headless --no-sandbox --disable-gpu --no-first-run " +
                         "--user-data-dir=" + profile.path() + " --virtual-time-budget=5000 --dump-dom " +
                         "http://127.0.0.1:" + std::to_string(c.coordinator->http_port()) + "/");
  INFO(dom.substr(0, 4000));
  REQUIRE(code == 0);
  CHECK_THAT(dom, Catch::Contains("data-loaded=\"yes\""));  // the script read status.json
  CHECK_THAT(dom, Catch::Contains("Capstan coordinator"));
  CHECK_THAT(dom, Catch::Contains("Workers (1)") && Catch::Contains("Parameter servers (2)") &&
                      Catch::Contains("Variables (1)"));
  CHECK_THAT(dom, Catch::Contains("localhost:" + std::to_string(c.worker->rpc_port())));
  CHECK_THAT(dom, Catch::Contains("emb/part_1: ps 1, 5+5"));
  CHECK_THAT(dom, Catch::Contains("data-title=\"loss (reported)\"") && Catch::Contains("<polyline"));
  CHECK_THAT(dom, Catch::Contains("data-title=\"closures/s (completed)\""));
}

TEST_CASE("every daemon's /metrics passes promtool check metrics, RPC latency histograms included",
          "[status][metrics]") {
  REQUIRE(have("promtool"));  // Debian's prometheus package (scripts/setup.sh --test)
  Cluster c;
  Daemon& dispatcher = c.cluster.start("data-dispatcher");
  Daemon& data_worker = c.cluster.start("data-worker", {"--dispatcher", dispatcher.address()});
  // Some traffic, so every family has series: updates, gathers, closures.
  REQUIRE(c.client->read_variable("emb").ok());
  for (int i = 0; i < 5; ++i) REQUIRE(c.client->fetch(c.client->schedule("noop").value()).ok());
  // The straggler gauge is set by the status page's sampler (once a second).
  REQUIRE(wait_until([&]() {
    return c.coordinator->http_get("/metrics").second.find("capstan_coordinator_straggler_score{worker=\"0\"}") !=
           std::string::npos;
  }, 15s));
  REQUIRE(c.client->gather("emb", Tensor::from_vector<int64_t>({1, 7}, {2}).value()).ok());
  REQUIRE(wait_until([&]() { return data_worker.http_get("/readyz").first == 200; }, 15s));
  auto id = data::service::register_dataset(dispatcher.address(), data::Dataset::range(10));
  REQUIRE(id.ok());
  auto it = data::service::from_dataset_id(dispatcher.address(), *id).make_iterator();
  REQUIRE(it.ok());
  int64_t read = 0;
  for (auto next = (*it)->get_next(); next.ok() && next->has_value(); next = (*it)->get_next()) ++read;
  REQUIRE(read == 10);
  TempDir dir;
  for (Daemon* daemon : {c.coordinator, c.ps[0], c.worker, &dispatcher, &data_worker}) {
    auto [code, text] = daemon->http_get("/metrics");
    REQUIRE(code == 200);
    INFO(daemon->name());
    CHECK_THAT(text, Catch::Contains("process_resident_memory_bytes"));
    const std::string file = dir.path() + "/" + daemon->name() + ".txt";
    std::ofstream(file) << text;
    auto [status, output] = run("promtool check metrics < " + file);
    INFO(output);
    CHECK(status == 0);
    CHECK(output.empty());
  }
  CHECK_THAT(data_worker.http_get("/metrics").second,
             Catch::Contains("capstan_data_worker_job_elements_served_total{job=\"") &&
                 Catch::Contains("capstan_data_worker_elements_served_total 10"));
  CHECK_THAT(dispatcher.http_get("/metrics").second, Catch::Contains("# TYPE capstan_data_dispatcher_workers gauge"));
  const std::string ps_metrics = c.ps[0]->http_get("/metrics").second;
  CHECK_THAT(ps_metrics, Catch::Contains("capstan_ps_gathered_rows_total 1"));  // id 1 lives on ps 0
  CHECK_THAT(ps_metrics, Catch::Contains("# TYPE capstan_rpc_duration_seconds histogram") &&
                             Catch::Contains("capstan_rpc_duration_seconds_count{method=\"ParameterServer.gather\"} 1"));
  // A method's histogram appears with its first answer.
  CHECK_THAT(ps_metrics, !Catch::Contains("capstan_rpc_duration_seconds_count{method=\"ParameterServer.applySparse\"}"));
  const std::string coordinator_metrics = c.coordinator->http_get("/metrics").second;
  CHECK_THAT(coordinator_metrics,
             Catch::Contains("capstan_rpc_duration_seconds_bucket{method=\"Coordinator.createVariable\",le=\"+Inf\"} 1"));
  // Where the closures' time went, by worker and phase; the worker's own.
  CHECK_THAT(coordinator_metrics,
             Catch::Contains("capstan_coordinator_worker_phase_seconds_count{phase=\"queued\",worker=\"0\"} 5") &&
                 Catch::Contains("capstan_coordinator_worker_phase_seconds_count{phase=\"all-reduce\",worker=\"0\"} 5"));
  CHECK_THAT(c.worker->http_get("/metrics").second,
             Catch::Contains("capstan_worker_phase_seconds_count{phase=\"compute\"} 5"));
}

}  // namespace
}  // namespace capstan::testing
