// Parameter-server training with real processes: the schedule/join/fetch
// cycle, partitioned variables, closure errors, per-worker datasets, and
// failures (a worker killed mid-training, a worker joining late, a
// parameter server killed).
#include <algorithm>
#include <signal.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "capstan/data/dataset.h"
#include "capstan/data/parsing.h"
#include "capstan/data/tfrecord.h"
#include "capstan/training.h"
#include "tests/harness/process.h"
#include "tests/integration/training_cluster.h"
#include "tests/build_path.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;


Element ints(std::vector<int64_t> values) {
  Element e;
  int64_t n = static_cast<int64_t>(values.size());
  e.components.push_back(*Tensor::from_vector<int64_t>(values, {n}));
  return e;
}

Element sleep_args(int64_t millis, int64_t tag) {
  return Element{{Tensor::scalar<int64_t>(millis), Tensor::scalar<int64_t>(tag)}, {}};
}

float counter(ClusterCoordinator& client) { return client.read_variable("counter").value().flat<float>()[0]; }

}  // namespace

TEST_CASE("schedule returns at once, join waits, fetch delivers each value", "[training]") {
  Training t;
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  std::vector<RemoteValue> values;
  for (int i = 0; i < 40; ++i) values.push_back(t.client->schedule("add_one").value());
  REQUIRE(t.client->join().ok());
  CHECK(t.client->done().value());
  CHECK(counter(*t.client) == 40.0f);
  std::set<int64_t> workers_used;
  for (const auto& v : values) {
    auto element = t.client->fetch(v);
    REQUIRE(element.ok());
    workers_used.insert(element->components[0].flat<int64_t>()[0]);
  }
  CHECK(workers_used.size() >= 1);
  CHECK(*workers_used.rbegin() <= 1);
  // The coordinator's figures on /metrics.
  std::string metrics = t.coordinator->http_get("/metrics").second;
  CHECK_THAT(metrics, Catch::Contains("# TYPE capstan_coordinator_closures_scheduled_total counter"));
  CHECK_THAT(metrics, Catch::Contains("capstan_coordinator_closures_scheduled_total 40\n"));
  CHECK_THAT(metrics, Catch::Contains("capstan_coordinator_closures_succeeded_total 40\n"));
  CHECK_THAT(metrics, Catch::Contains("capstan_coordinator_closures_queued 0\n"));
  CHECK_THAT(metrics, Catch::Contains("capstan_coordinator_workers 2\n"));
}

TEST_CASE("a partitioned variable is placed round robin and gathered by id", "[training]") {
  Training t;
  Tensor initial = *random_normal_initializer(DType::kFloat32, {13, 4}, 0, 1, 11);
  auto info = t.client->create_variable({"emb", initial, Optimizer::sgd(1.0), Partitioner::fixed_shards(5)});
  REQUIRE(info.ok());
  REQUIRE(info->shards.size() == 5);
  std::vector<int64_t> rows, tasks;
  for (const auto& s : info->shards) {
    rows.push_back(s.rows);
    tasks.push_back(s.ps_task);
  }
  CHECK(rows == std::vector<int64_t>{3, 3, 3, 2, 2});
  CHECK(tasks == std::vector<int64_t>{0, 1, 0, 1, 0});
  CHECK(info->shards[4].name == "emb/part_4");
  CHECK(t.client->read_variable("emb").value().equals(initial));

  auto gathered = t.client->fetch(t.client->schedule("gather_rows", ints({12, 0, 5, 5})).value());
  REQUIRE(gathered.ok());
  const float* all = initial.flat<float>().data();
  std::vector<float> expected;
  for (int64_t id : {12, 0, 5, 5}) expected.insert(expected.end(), all + id * 4, all + id * 4 + 4);
  auto got = gathered->components[0].flat<float>();
  CHECK(std::vector<float>(got.begin(), got.end()) == expected);
  CHECK(gathered->components[0].shape() == Shape{4, 4});

  // A sparse SGD step (lr 1) with a duplicate id: the rows are summed.
  Element step = ints({7, 7});
  step.components.insert(step.components.begin(),
                         *Tensor::from_vector<float>({1, 1, 1, 1, 1, 1, 1, 1}, {2, 4}));
  REQUIRE(t.client->fetch(t.client->schedule("sparse_step", step).value()).ok());
  auto after = t.client->read_variable("emb").value();
  CHECK(after.flat<float>()[7 * 4] == Approx(all[7 * 4] - 2.0f));
  CHECK(after.flat<float>()[6 * 4] == all[6 * 4]);
}

TEST_CASE("the first closure error is raised by join, queued and running closures are cancelled, then cleared",
          "[training]") {
  Training t(1, 2);  // the slow closure and the failing one run at once
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  auto slow = t.client->schedule("sleep_then_tag", sleep_args(5000, 1)).value();
  // The failure comes after the add_ones are queued behind it (a schedule
  // after it would raise it instead, as TF's does).
  auto failing = t.client->schedule("fail", Element{{Tensor::scalar<int64_t>(1500)}, {}}).value();
  std::vector<RemoteValue> pending;
  for (int i = 0; i < 5; ++i) pending.push_back(t.client->schedule("add_one").value());
  Status joined = t.client->join();
  CHECK(joined.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(joined.message(), Catch::Contains("this closure always fails"));
  // TF cancels the closure still running too: its fetch raises Cancelled and
  // it stopped early (it checks ctx.cancelled()), leaving the counter alone.
  CHECK(t.client->fetch(slow).status().code() == StatusCode::kCancelled);
  CHECK(t.client->fetch(failing).status().code() == StatusCode::kInvalidArgument);
  for (const auto& p : pending) CHECK(t.client->fetch(p).status().code() == StatusCode::kCancelled);
  // Cleared: new work runs.
  CHECK(t.client->join().ok());
  REQUIRE(t.client->schedule("add_one").ok());
  CHECK(t.client->join().ok());
  CHECK(counter(*t.client) == 1.0f);  // the last add_one only
}

TEST_CASE("a closure past closure_timeout_ms fails with DeadlineExceeded and stops early", "[training]") {
  Training t(1, 1, {"--closure-timeout-ms", "500"});
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  auto slow = t.client->schedule("sleep_then_tag", sleep_args(20000, 1)).value();
  Status joined = t.client->join();
  CHECK(joined.code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(joined.message(), Catch::Contains("closure_timeout_ms 500"));
  CHECK(t.client->fetch(slow).status().code() == StatusCode::kDeadlineExceeded);
  // Cleared: the next closure runs; the timed-out run left the counter alone.
  REQUIRE(t.client->schedule("add_one").ok());
  CHECK(t.client->join().ok());
  CHECK(counter(*t.client) == 1.0f);
}

TEST_CASE("scheduling a closure no worker has fails at schedule", "[training]") {
  Training t(1, 1);
  auto missing = t.client->schedule("no_such_closure");
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("'no_such_closure'"));
  CHECK_THAT(missing.status().message(), Catch::Contains("add_one"));
}

TEST_CASE("killing one of two workers mid-training: every closure's result arrives once",
          "[training][fault]") {
  Training t;
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  std::vector<RemoteValue> values;
  for (int64_t i = 0; i < 30; ++i) values.push_back(t.client->schedule("sleep_then_tag", sleep_args(100, 1000 + i)).value());
  REQUIRE(wait_until([&t]() { return counter(*t.client) >= 4.0f; }, 20s));
  t.workers[1]->kill_now();
  REQUIRE(t.client->join().ok());
  for (int64_t i = 0; i < 30; ++i) {
    auto value = t.client->fetch(values[static_cast<size_t>(i)]);
    REQUIRE(value.ok());
    CHECK(value->components[0].flat<int64_t>()[0] == 1000 + i);
  }
  // At-least-once: a closure cut off by the kill may have run twice.
  CHECK(counter(*t.client) >= 30.0f);
  CHECK(t.client->num_workers() == 1);
  CHECK_THAT(t.coordinator->log(), Catch::Contains("lost"));
}

TEST_CASE("a closure sees the number of workers and its attempt, a re-run after a worker dies is attempt 2",
          "[training][fault]") {
  Training t(1, 2);
  REQUIRE(t.client->create_variable({"started", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  Element args{{Tensor::scalar<int64_t>(1500)}, {}};
  RemoteValue first = t.client->schedule("context_after_sleep", args).value();
  RemoteValue second = t.client->schedule("context_after_sleep", args).value();
  // One closure per worker (TF's default): both are running once "started" is 2.
  REQUIRE(wait_until([&t]() { return t.client->read_variable("started").value().flat<float>()[0] >= 2.0f; }, 20s));
  t.workers[1]->kill_now();
  REQUIRE(t.client->join().ok());
  std::vector<int64_t> attempts;
  for (const RemoteValue& value : {first, second}) {
    Element result = t.client->fetch(value).value();
    attempts.push_back(result.components[0].flat<int64_t>()[0]);
    CHECK(result.components[2].flat<int64_t>()[0] == 0);  // both finished on the survivor
    int64_t num_workers = result.components[1].flat<int64_t>()[0];
    CHECK((num_workers == 1 || num_workers == 2));
  }
  std::sort(attempts.begin(), attempts.end());
  CHECK(attempts == std::vector<int64_t>{1, 2});
}

TEST_CASE("a closure sees how many workers the cluster has", "[training]") {
  Training t(1, 2);
  REQUIRE(t.client->create_variable({"started", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  Element result = t.client->fetch(t.client->schedule("context_after_sleep", Element{{Tensor::scalar<int64_t>(0)}, {}}).value()).value();
  CHECK(result.components[0].flat<int64_t>()[0] == 1);
  CHECK(result.components[1].flat<int64_t>()[0] == 2);
}

TEST_CASE("a worker started mid-training receives closures", "[training][fault]") {
  Training t(1, 1);
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  std::vector<RemoteValue> values;
  for (int i = 0; i < 30; ++i) values.push_back(t.client->schedule("sleep_then_tag", sleep_args(100, i)).value());
  t.add_worker(1);
  REQUIRE(wait_until([&t]() { return t.client->num_workers() == 2; }, 15s));
  REQUIRE(t.client->join().ok());
  CHECK(counter(*t.client) == 30.0f);
  // The late worker ran some of the queued closures.
  // (The line is looked up, not matched with a regex over the whole text:
  // std::regex recurses per character and /metrics is long.)
  const std::string metrics = t.workers[1]->http_get("/metrics").second;
  const std::string line = "\ncapstan_rpc_calls_total{method=\"Worker.runClosure\"} ";
  const size_t at = metrics.find(line);
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(metrics.substr(at + line.size())) >= 1);
  CHECK_THAT(t.workers[1]->log(), Catch::Contains("registered with the coordinator"));
}

TEST_CASE("killing a parameter server makes join fail with Unavailable within seconds",
          "[training][fault]") {
  Training t;
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  for (int i = 0; i < 50; ++i) REQUIRE(t.client->schedule("sleep_then_tag", sleep_args(100, i)).ok());
  t.ps[1]->kill_now();
  auto started = std::chrono::steady_clock::now();
  Status joined = t.client->join();
  CHECK(joined.code() == StatusCode::kUnavailable);
  CHECK_THAT(joined.message(), Catch::Contains("ps:1"));
  CHECK(std::chrono::steady_clock::now() - started < 10s);
  // schedule() is pipelined: the refusal shows when the value is fetched
  // (and at the next schedule/join).
  auto refused = t.client->schedule("add_one");
  if (refused.ok()) {
    CHECK(t.client->fetch(*refused).status().code() == StatusCode::kUnavailable);
  } else {
    CHECK(refused.status().code() == StatusCode::kUnavailable);
  }
  CHECK(t.client->join().code() == StatusCode::kUnavailable);
}

// ---- Parameter-server recovery ---------------------------------------------------------

namespace {

// Which PS task holds the scalar variable `name`.
int ps_task_of(ClusterCoordinator& client, const std::string& name) {
  std::vector<VariableInfo> all = client.variables().value();
  for (const auto& v : all) {
    if (v.name == name) return v.shards.at(0).ps_task;
  }
  FAIL("no variable " << name);
  return -1;
}

// Runs next_element `n` times on `dataset`; the values read (the end, -1,
// left out).
std::vector<int64_t> read_elements(ClusterCoordinator& client, const PerWorkerDataset& dataset, int n) {
  std::vector<RemoteValue> values;
  for (int i = 0; i < n; ++i) values.push_back(client.schedule("next_element", Element{{dataset.arg()}, {}}).value());
  REQUIRE(client.join().ok());
  std::vector<int64_t> got;
  for (const auto& v : values) {
    int64_t value = client.fetch(v).value().components[0].flat<int64_t>()[0];
    if (value >= 0) got.push_back(value);
  }
  return got;
}

// Reads on (up to 10 rounds of 20) until `seen` holds `total` values;
// returns them sorted.
std::vector<int64_t> read_rest(ClusterCoordinator& client, const PerWorkerDataset& dataset,
                               std::vector<int64_t> seen, size_t total) {
  for (int round = 0; round < 10 && seen.size() < total; ++round) {
    auto more = read_elements(client, dataset, 20);
    seen.insert(seen.end(), more.begin(), more.end());
  }
  std::sort(seen.begin(), seen.end());
  return seen;
}

// 0, 1, ..., n - 1.
std::vector<int64_t> first_integers(int64_t n) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  return all;
}

// join() until it answers DataLoss (a PS back without its shards and no
// recovery), for up to 20 s; its last answer.
Status join_until_data_loss(ClusterCoordinator& client) {
  Status joined;
  wait_until([&]() {
    joined = client.join();
    return joined.code() == StatusCode::kDataLoss;
  }, 20s);
  return joined;
}

// Starts `t`'s coordinator again (after a kill) with its parameter servers
// and `flags` (its --work-dir and --port).
void restart_coordinator(Training& t, const std::vector<std::string>& flags) {
  std::string ps_list;
  for (Daemon* ps : t.ps) ps_list += (ps_list.empty() ? "" : ",") + ps->address();
  std::vector<std::string> args = {"--ps", ps_list};
  args.insert(args.end(), flags.begin(), flags.end());
  t.coordinator = &t.cluster.restart_on_port("coordinator", args);
}


}  // namespace

TEST_CASE("kill -9 a parameter server mid-training: it is restored from the last checkpoint and training goes on "
          "by itself",
          "[training][fault][recovery]") {
  TestCluster scratch;
  const std::string dir = scratch.dir() + "/ckpt";
  Training t(2, 2, {"--checkpoint-dir", dir, "--checkpoint-every-steps", "10"});
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  const int task = ps_task_of(*t.client, "counter");
  constexpr int kClosures = 150;
  std::vector<RemoteValue> values;
  for (int i = 0; i < kClosures; ++i) values.push_back(t.client->schedule("sleep_then_tag", sleep_args(20, i)).value());
  REQUIRE(wait_until([&]() { return counter(*t.client) >= 40; }, 30s));
  // A checkpoint to restore from (a save may still be running when the
  // counter gets there on a loaded machine).
  REQUIRE(wait_until([&]() { return metric(*t.coordinator, "capstan_coordinator_checkpoints_saved_total") >= 1; }, 30s));

  auto killed = std::chrono::steady_clock::now();
  restart_ps(t, task);
  // No error reaches the program: join waits through the outage.
  REQUIRE(t.client->join().ok());
  auto joined = std::chrono::steady_clock::now();
  for (int i = 0; i < kClosures; ++i) {
    auto value = t.client->fetch(values[static_cast<size_t>(i)]);
    REQUIRE(value.ok());
    CHECK(value->components.at(0).flat<int64_t>()[0] == i);  // each value once, its own
  }
  CHECK_THAT(t.coordinator->log(), Catch::Contains("restored 1 shard(s) from checkpoint") &&
                                       Catch::Contains("dispatch resumes"));
  // The increments since the last checkpoint (every 10 closures) were lost
  // with the server; no closure counted twice.
  float total = counter(*t.client);
  CHECK(total <= kClosures);
  CHECK(total >= kClosures - 30);
  std::printf("kill -9 of ps:%d to the end of join: %lld ms; counter %.0f of %d\n", task,
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(joined - killed).count()),
              static_cast<double>(total), kClosures);
}

TEST_CASE("the CTR example reaches its target with a parameter server killed -9 and restarted mid-training",
          "[training][fault][recovery][long]") {
  TestCluster scratch;
  const std::string dir = scratch.dir() + "/ckpt";
  Training t(2, 2, {"--checkpoint-dir", dir, "--checkpoint-every-steps", "300"}, true, capstan::testing::build_path(CAPSTAN_CTR_MODULE));
  // 8000 steps end at a gap of ~2.0% to the planted model without a failure
  // (measured: 2.00%, 2.01%; with the kill: 2.02%); 2.5% leaves room for
  // the steps lost since the last checkpoint and for noise.
  RunResult ctr = run_ctr_with_a_ps_restart(t, {"--steps", "8000", "--eval-steps", "100", "--min-workers", "2",
                                                "--log-every", "1000", "--max-gap", "2.5"});
  INFO(ctr.output);
  CHECK(ctr.exit_code == 0);
  CHECK_THAT(ctr.output, Catch::Contains("PASS"));
  CHECK_THAT(t.coordinator->log(), Catch::Contains("restored 1 shard(s) from checkpoint"));
}

TEST_CASE("kill -9 a parameter server mid-training with peer snapshots every 1 s and no checkpoint, and it is "
          "restored from its buddy's memory losing at most the updates since the last snapshot",
          "[training][fault][recovery][peer]") {
  // No checkpoint_dir: only the buddy's copy can bring the counter back.
  Training t(2, 2, {"--peer-snapshot-every-seconds", "1"});
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  const int task = ps_task_of(*t.client, "counter");
  constexpr int kClosures = 400;
  std::vector<RemoteValue> values;
  for (int i = 0; i < kClosures; ++i) values.push_back(t.client->schedule("sleep_then_tag", sleep_args(20, i)).value());
  REQUIRE(wait_until([&]() { return counter(*t.client) >= 40; }, 30s));
  // The update rate, to bound what one interval holds.
  auto t0 = std::chrono::steady_clock::now();
  float c0 = counter(*t.client);
  REQUIRE(wait_until([&]() { return std::chrono::steady_clock::now() - t0 >= 1500ms; }, 5s));
  float c1 = counter(*t.client);
  const double per_second =
      (c1 - c0) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(c1 < kClosures);  // still training when killed

  auto killed = std::chrono::steady_clock::now();
  restart_ps(t, task);
  REQUIRE(t.client->join().ok());
  auto joined = std::chrono::steady_clock::now();
  for (int i = 0; i < kClosures; ++i) {
    auto value = t.client->fetch(values[static_cast<size_t>(i)]);
    REQUIRE(value.ok());
    CHECK(value->components.at(0).flat<int64_t>()[0] == i);
  }
  std::string log = t.coordinator->log();
  CHECK_THAT(log, Catch::Contains("restored 1 shard(s) from the in-memory copy on ps:" + std::to_string(1 - task)) &&
                      Catch::Contains("dispatch resumes"));
  CHECK_THAT(log, !Catch::Contains("from checkpoint"));
  // The increments since the last peer snapshot were lost with the server
  // (an interval of 1 s, plus sending it and noticing the kill: 3 s of
  // updates is generous); none counted twice.
  const float total = counter(*t.client);
  const double lost = kClosures - total;
  CHECK(total <= kClosures);
  CHECK(lost <= 3 * per_second + 5);
  std::string recovered_in = "?";
  if (size_t at = log.find(" ms after it was lost"); at != std::string::npos) {
    size_t from = log.rfind(' ', at - 1);
    recovered_in = log.substr(from + 1, at - from - 1);
  }
  std::printf("peer recovery: kill -9 of ps:%d to the end of join %lld ms, coordinator: restored %s ms after it was "
              "lost; %.0f updates lost of %d (%.0f updates/s)\n",
              task,
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(joined - killed).count()),
              recovered_in.c_str(), lost, kClosures, per_second);
}

TEST_CASE("the CTR example with peer snapshots every 1 s reaches its target with a parameter server killed -9 and "
          "restored from its buddy's memory",
          "[training][fault][recovery][peer][long]") {
  Training t(2, 2, {"--peer-snapshot-every-seconds", "1"}, true, capstan::testing::build_path(CAPSTAN_CTR_MODULE));
  RunResult ctr;
  const int64_t steps = 8000;
  std::thread program([&]() {
    ctr = t.cluster.run("ctr",
                        {"--coordinator", t.coordinator->address(), "--steps", std::to_string(steps), "--eval-steps",
                         "100", "--min-workers", "2", "--log-every", "1000", "--max-gap", "2.5", "--count-updates"},
                        {}, std::chrono::seconds(300));
  });
  // Well into training, and past a few peer snapshots.
  bool training = wait_until([&]() {
    auto counted = t.client->read_variable("ctr_updates");
    return counted.ok() && counted->flat<float>()[1] >= 1500;
  }, std::chrono::seconds(200));
  if (training) restart_ps(t, 1);
  program.join();
  REQUIRE(training);
  INFO(ctr.output);
  CHECK(ctr.exit_code == 0);
  CHECK_THAT(ctr.output, Catch::Contains("PASS"));
  CHECK_THAT(t.coordinator->log(), Catch::Contains("from the in-memory copy on ps:0"));
  // "updates counted: A and B": B, on the killed server, lost those since
  // its last peer snapshot.
  size_t at = ctr.output.find("updates counted: ");
  REQUIRE(at != std::string::npos);
  double a = 0, b = 0;
  REQUIRE(std::sscanf(ctr.output.c_str() + at, "updates counted: %lf and %lf", &a, &b) == 2);
  std::printf("CTR with a peer recovery: %.0f of %lld updates lost on the killed server\n",
              static_cast<double>(steps) - std::min(a, b), static_cast<long long>(steps));
  CHECK(std::min(a, b) <= steps);
  CHECK(std::min(a, b) >= steps / 2);
}

TEST_CASE("without a checkpoint a parameter server that restarted empty is DataLoss saying so", "[training][fault][recovery]") {
  Training t;
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  for (int i = 0; i < 5; ++i) REQUIRE(t.client->schedule("add_one").ok());
  REQUIRE(t.client->join().ok());
  const int task = ps_task_of(*t.client, "counter");
  restart_ps(t, task);
  Status joined = join_until_data_loss(*t.client);
  REQUIRE(joined.code() == StatusCode::kDataLoss);
  CHECK_THAT(joined.message(), Catch::Contains("ps:" + std::to_string(task)) && Catch::Contains("counter") &&
                                   Catch::Contains("no checkpoint"));
}

TEST_CASE("restoring by hand after a parameter server restarted empty recreates its shards", "[training][fault][recovery]") {
  Training t(2, 2, {"--ps-recovery", "false"});
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  REQUIRE(t.client->create_variable({"other", Tensor::scalar<float>(5), Optimizer::sgd(0.1)}).ok());
  for (int i = 0; i < 20; ++i) REQUIRE(t.client->schedule("add_one").ok());
  REQUIRE(t.client->join().ok());
  CheckpointManager manager(*t.client, t.cluster.dir() + "/ckpt", 3);
  REQUIRE(manager.save(20).ok());
  for (int i = 0; i < 10; ++i) REQUIRE(t.client->schedule("add_one").ok());
  REQUIRE(t.client->join().ok());
  const int task = ps_task_of(*t.client, "counter");
  restart_ps(t, task);
  Status joined = join_until_data_loss(*t.client);
  REQUIRE(joined.code() == StatusCode::kDataLoss);
  CHECK_THAT(joined.message(), Catch::Contains("ps_recovery is off"));

  REQUIRE(manager.restore_latest().value() == 20);
  CHECK(counter(*t.client) == 20.0f);
  CHECK(t.client->read_variable("other").value().flat<float>()[0] == 5.0f);
  REQUIRE(t.client->schedule("add_one").ok());
  REQUIRE(t.client->join().ok());
  CHECK(counter(*t.client) == 21.0f);
}

TEST_CASE("kill -9 the coordinator and restart it with its work_dir: the program goes on, no variable lost",
          "[training][fault][durable]") {
  TestCluster scratch;
  const std::string work_dir = scratch.dir() + "/coordinator";
  const uint16_t port = free_port();
  Training t(2, 2, {"--work-dir", work_dir, "--port", std::to_string(port)});
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  auto placed = t.client->variables().value();
  for (int i = 0; i < 20; ++i) REQUIRE(t.client->schedule("add_one").ok());
  REQUIRE(t.client->join().ok());
  const auto numbers = data::Dataset::range(60).shard(data::kShardHint, data::kShardHint);
  auto dataset = t.client->create_per_worker_dataset(numbers, "numbers");
  REQUIRE(dataset.ok());
  std::vector<int64_t> seen = read_elements(*t.client, *dataset, 20);
  REQUIRE(seen.size() == 20);

  t.coordinator->kill_now();
  restart_coordinator(t, {"--work-dir", work_dir, "--port", std::to_string(port)});
  CHECK_THAT(t.coordinator->log(), Catch::Contains("replayed the journal") && Catch::Contains("1 variable(s)"));
  // The same program object carries on: its variable is known, with its value.
  REQUIRE(wait_until([&]() { return t.client->num_workers() == 2; }, 20s));
  auto again = t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)});
  REQUIRE(again.ok());
  CHECK(again->shards.at(0).ps_task == placed.at(0).shards.at(0).ps_task);
  CHECK(counter(*t.client) == 20.0f);
  for (int i = 0; i < 10; ++i) REQUIRE(t.client->schedule("add_one").ok());
  REQUIRE(t.client->join().ok());
  CHECK(counter(*t.client) == 30.0f);
  // The workers kept their iterators: the input goes on where it was.
  auto again_dataset = t.client->create_per_worker_dataset(numbers, "numbers");
  REQUIRE(again_dataset.ok());
  CHECK(again_dataset->id == dataset->id);
  CHECK(read_rest(*t.client, *dataset, seen, 60) == first_integers(60));
}

TEST_CASE("kill -9 the coordinator while closures run and wait: every RemoteValue from before the restart is fetched",
          "[training][fault][durable]") {
  TestCluster scratch;
  const std::string work_dir = scratch.dir() + "/coordinator";
  const uint16_t port = free_port();
  Training t(1, 2, {"--work-dir", work_dir, "--port", std::to_string(port)});
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  REQUIRE(t.client->create_variable({"runs", Tensor::zeros(DType::kFloat32, {64}).value(), Optimizer::sgd(0.1)}).ok());
  // Closure k (tag 1000 + k before the kill, 2000 + k while no coordinator
  // answers) adds 1 to runs[slot]: each closure's runs are counted.
  struct Scheduled {
    RemoteValue value;
    int64_t tag;
    int64_t slot;
  };
  std::vector<Scheduled> values;
  auto schedule = [&](int64_t millis, int64_t tag) {
    const int64_t slot = static_cast<int64_t>(values.size());
    Element args{{Tensor::scalar<int64_t>(millis), Tensor::scalar<int64_t>(tag), Tensor::scalar<int64_t>(slot)}, {}};
    values.push_back({t.client->schedule("sleep_then_count", args).value(), tag, slot});
  };
  for (int64_t i = 0; i < 30; ++i) schedule(100, 1000 + i);
  REQUIRE(t.client->fetch(values[0].value).ok());  // some ran; the rest are queued or running
  t.coordinator->kill_now();
  // Scheduled while no coordinator answers: sent once it is back.
  for (int64_t i = 0; i < 5; ++i) schedule(10, 2000 + i);
  restart_coordinator(t, {"--work-dir", work_dir, "--port", std::to_string(port)});
  CHECK_THAT(t.coordinator->log(), Catch::Contains("closure(s) queued again"));
  // The closures the journal had not seen end: queued, running, or ended
  // within the last group commit at the kill.
  int64_t requeued = -1;
  {
    const std::string log = t.coordinator->log();
    const auto at = log.find(" closure(s) queued again");
    REQUIRE(at != std::string::npos);
    const auto from = log.find_last_of(' ', at - 1);
    requeued = std::stoll(log.substr(from + 1, at - from - 1));
  }
  // The same program object: join waits for the closures the journal kept,
  // and each value arrives, from before the restart and after.
  const Status joined = t.client->join();
  INFO("join: " << joined.to_string());
  REQUIRE(joined.ok());
  for (const auto& scheduled : values) {
    auto got = t.client->fetch(scheduled.value);
    REQUIRE(got.ok());
    CHECK(got->components[0].flat<int64_t>()[0] == scheduled.tag);
  }
  // Every closure ran at least once; the 5 scheduled during the outage
  // exactly once (a retried schedule never queues twice, and none of them
  // was in flight at the kill). A closure runs again only when the kill cut
  // its run short or came before its end was journaled: the duplicates are
  // at most the closures the restarted coordinator queued again, each one
  // ran at most twice (one kill), and the counter saw every run once.
  auto runs = t.client->read_variable("runs");
  REQUIRE(runs.ok());
  int64_t duplicates = 0;
  for (const auto& scheduled : values) {
    const float n = runs->flat<float>()[scheduled.slot];
    INFO("closure tag " << scheduled.tag << " ran " << n << " time(s)");
    CHECK(n >= 1.0f);
    CHECK(n <= 2.0f);
    if (scheduled.tag >= 2000) CHECK(n == 1.0f);
    duplicates += static_cast<int64_t>(n) - 1;
  }
  INFO(duplicates << " closure(s) ran twice; " << requeued << " were queued again at the restart");
  CHECK(duplicates <= requeued);
  CHECK(counter(*t.client) == static_cast<float>(35 + duplicates));
}

// ---- Preemption (SIGTERM) ----------------------------------------------------------------

TEST_CASE("SIGTERM to a worker: its running closures finish, it leaves cleanly, nothing runs twice",
          "[training][fault][preemption]") {
  TestCluster scratch;
  const std::string dir = scratch.dir() + "/ckpt";
  Training t(1, 2, {"--checkpoint-dir", dir});
  REQUIRE(t.client->create_variable({"started", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  constexpr int kClosures = 24;
  std::vector<RemoteValue> values;
  for (int i = 0; i < kClosures; ++i) {
    values.push_back(t.client->schedule("context_after_sleep", Element{{Tensor::scalar<int64_t>(150)}, {}}).value());
  }
  REQUIRE(wait_until([&]() { return t.client->read_variable("started").value().flat<float>()[0] >= 4; }, 20s));
  // Mid-closure: it finishes the one it runs, then exits 0.
  CHECK(t.workers[1]->stop(SIGTERM, 15s) == std::optional<int>(0));
  REQUIRE(t.client->join().ok());
  for (const auto& value : values) {
    auto got = t.client->fetch(value);
    REQUIRE(got.ok());
    CHECK(got->components.at(0).flat<int64_t>()[0] == 1);  // attempt 1: no run was lost and redone
  }
  CHECK(t.client->read_variable("started").value().flat<float>()[0] == kClosures);
  CHECK_THAT(t.workers[1]->log(), Catch::Contains("left the coordinator"));
  CHECK_THAT(t.coordinator->log(), Catch::Contains("left (SIGTERM); its closures finished") &&
                                       Catch::Contains("leaving: saved checkpoint"));
  CHECK(t.client->num_workers() == 1);
}

TEST_CASE("SIGTERM to the coordinator: running closures finish, then a checkpoint holds all of them",
          "[training][fault][preemption]") {
  TestCluster scratch;
  const std::string dir = scratch.dir() + "/ckpt";
  Training t(1, 2, {"--checkpoint-dir", dir});
  REQUIRE(t.client->create_variable({"started", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  for (int i = 0; i < 20; ++i) {
    REQUIRE(t.client->schedule("context_after_sleep", Element{{Tensor::scalar<int64_t>(300)}, {}}).ok());
  }
  REQUIRE(wait_until([&]() { return t.client->read_variable("started").value().flat<float>()[0] >= 2; }, 20s));
  CHECK(t.coordinator->stop(SIGTERM, 15s) == std::optional<int>(0));
  CHECK_THAT(t.coordinator->log(), Catch::Contains("SIGTERM: no more dispatch; waiting for") &&
                                       Catch::Contains("SIGTERM: saved checkpoint"));
  // Every closure that started finished before the checkpoint: its step
  // (closures completed) is the number started, read from the PS itself.
  int started = static_cast<int>(t.client->read_variable("started").value().flat<float>()[0]);
  CHECK(started >= 2);
  CHECK(started < 20);
  CHECK(std::filesystem::exists(dir + "/ckpt-" + std::to_string(started)));
}

TEST_CASE("per-worker datasets give each worker its own shard", "[training][datasets]") {
  // Workers started with --task-index, and without (the coordinator assigns
  // 0 and 1; TF would need them given).
  bool indexed = GENERATE(true, false);
  INFO("workers started with --task-index: " << indexed);
  Training t(1, 2, {"--num-workers", "2"}, indexed);
  bool from_function = GENERATE(false, true);
  INFO("from a dataset function: " << from_function);
  auto dataset = from_function ? t.client->create_per_worker_dataset(std::string("sharded_range"))
                               : t.client->create_per_worker_dataset(
                                     data::Dataset::range(20).shard(data::kShardHint, data::kShardHint));
  REQUIRE(dataset.ok());
  std::vector<RemoteValue> values;
  for (int i = 0; i < 24; ++i) values.push_back(t.client->schedule("next_element", Element{{dataset->arg()}, {}}).value());
  REQUIRE(t.client->join().ok());
  std::multiset<int64_t> seen;
  for (const auto& v : values) {
    auto e = t.client->fetch(v).value();
    int64_t value = e.components[0].flat<int64_t>()[0];
    int64_t worker = e.components[1].flat<int64_t>()[0];
    if (value < 0) continue;
    CHECK(value % 2 == worker);  // shard(2, worker)
    seen.insert(value);
  }
  CHECK(!seen.empty());
  for (int64_t v : seen) CHECK(seen.count(v) == 1);
}

TEST_CASE("a program that restarts finds its named per-worker dataset where it left it", "[training][datasets][recovery]") {
  Training t(1, 2, {"--num-workers", "2"});
  const auto numbers = data::Dataset::range(60).shard(data::kShardHint, data::kShardHint);
  auto first = t.client->create_per_worker_dataset(numbers, "numbers");
  REQUIRE(first.ok());
  std::vector<int64_t> seen = read_elements(*t.client, *first, 20);
  REQUIRE(seen.size() == 20);

  // The program dies (its connection drops, as with kill -9) and starts again.
  t.client.reset();
  t.client = ClusterCoordinator::connect(t.coordinator->address()).value();
  auto again = t.client->create_per_worker_dataset(numbers, "numbers");
  REQUIRE(again.ok());
  CHECK(again->id == first->id);
  // Every element once: none read again, none skipped.
  CHECK(read_rest(*t.client, *again, seen, 60) == first_integers(60));
  CHECK_THAT(t.coordinator->log(), Catch::Contains("per-worker dataset 'numbers' found again"));

  auto other = t.client->create_per_worker_dataset(data::Dataset::range(5), "numbers");
  CHECK(other.status().code() == StatusCode::kAlreadyExists);
  CHECK_THAT(other.status().message(), Catch::Contains("'numbers'"));
}

// Runs next_element `n` times; the ids of the batches each worker handed
// out, per worker, in the order it handed them out (ends left out).
std::map<int64_t, std::vector<int64_t>> read_batches(ClusterCoordinator& client, const PerWorkerDataset& dataset,
                                                     int n) {
  std::vector<RemoteValue> values;
  for (int i = 0; i < n; ++i) values.push_back(client.schedule("next_element", Element{{dataset.arg()}, {}}).value());
  REQUIRE(client.join().ok());
  std::map<int64_t, std::vector<int64_t>> ids;
  for (const auto& v : values) {
    Element e = client.fetch(v).value();
    if (e.components[0].rank() == 0) continue;  // this worker's input ended
    auto batch = e.components[0].flat<int64_t>();
    auto& seen = ids[e.components[1].flat<int64_t>()[0]];
    seen.insert(seen.end(), batch.begin(), batch.end());
  }
  return ids;
}

std::vector<int64_t> all_ids(const std::map<int64_t, std::vector<int64_t>>& by_worker) {
  std::vector<int64_t> all;
  for (const auto& [worker, ids] : by_worker) all.insert(all.end(), ids.begin(), ids.end());
  return all;
}

TEST_CASE("save, restart everything, restore: each worker's shuffled, batched TFRecord input continues exactly",
          "[training][datasets][checkpoint][recovery]") {
  TestCluster keep;  // holds the data and the checkpoint directory
  const std::string dir = keep.dir() + "/ckpts";
  // 4 TFRecord files of 15 records, ids 0..59 as text.
  for (int f = 0; f < 4; ++f) {
    auto writer = data::TFRecordWriter::open(keep.dir() + "/ids-" + std::to_string(f) + ".tfrecord");
    REQUIRE(writer.ok());
    for (int i = 0; i < 15; ++i) REQUIRE((*writer)->write(std::to_string(f * 15 + i)).ok());
    REQUIRE((*writer)->close().ok());
  }
  data::CsvSpec ids;
  ids.record_defaults = {Tensor::scalar<int64_t>(-1)};
  // Each worker reads its 2 files interleaved; what is saved holds file
  // positions, interleave cycles, a shuffle buffer with its random state, a
  // partial batch being built, and prefetched batches.
  const auto pipeline = data::Dataset::list_files({keep.dir() + "/ids-*.tfrecord"}, /*shuffle=*/false)
                            .shard(data::kShardHint, data::kShardHint)
                            .interleave(data::Fn::tfrecord_dataset(), 2, 3)
                            .map(data::Fn::decode_csv(ids))
                            .shuffle(7, 17)
                            .batch(4)
                            .prefetch(2);
  std::map<int64_t, std::vector<int64_t>> before, lost;  // lost: read after the checkpoint
  {
    Training t(1, 2, {"--num-workers", "2"});
    REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
    auto dataset = t.client->create_per_worker_dataset(pipeline, "ids");
    REQUIRE(dataset.ok());
    // 3 batches of 4 before the save and 3 after: fewer than the 8 batches
    // of a worker, however the closures fall on the workers.
    before = read_batches(*t.client, *dataset, 3);
    for (int i = 0; i < 20; ++i) REQUIRE(t.client->schedule("add_one").ok());
    REQUIRE(t.client->join().ok());
    REQUIRE(t.client->save_checkpoint(dir, 20, 3).ok());
    CHECK(std::filesystem::exists(dir + "/ckpt-20/iterators.safetensors"));
    lost = read_batches(*t.client, *dataset, 3);
    REQUIRE(all_ids(lost).size() == 12);
  }
  // Every process is gone. A new cluster, the same program code.
  Training t(1, 2, {"--num-workers", "2"});
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  auto dataset = t.client->create_per_worker_dataset(pipeline, "ids");
  REQUIRE(dataset.ok());
  auto step = t.client->restore_checkpoint(dir);
  REQUIRE(step.ok());
  CHECK(*step == 20);
  CHECK(counter(*t.client) == 20.0f);
  CHECK_THAT(t.coordinator->log(), Catch::Contains("2 per-worker iterator position(s)"));
  std::map<int64_t, std::vector<int64_t>> after;
  for (int round = 0; round < 10 && all_ids(before).size() + all_ids(after).size() < 60; ++round) {
    for (auto& [worker, more] : read_batches(*t.client, *dataset, 4)) {
      after[worker].insert(after[worker].end(), more.begin(), more.end());
    }
  }
  // Across the whole run every id once: none missing, none repeated.
  std::vector<int64_t> all = all_ids(before);
  for (int64_t id : all_ids(after)) all.push_back(id);
  std::sort(all.begin(), all.end());
  CHECK(all == first_integers(60));
  // Each worker's sequence goes on exactly as it went on after the save the
  // first time (the same shuffle draws, the same batches).
  for (const auto& [worker, was] : lost) {
    INFO("worker " << worker);
    const auto& now = after[worker];
    size_t n = std::min(was.size(), now.size());
    CHECK(n > 0);
    CHECK(std::vector<int64_t>(now.begin(), now.begin() + static_cast<std::ptrdiff_t>(n)) ==
          std::vector<int64_t>(was.begin(), was.begin() + static_cast<std::ptrdiff_t>(n)));
  }
}

// The "id <value> worker <index>" lines input_program printed: value by worker.
std::map<int64_t, std::vector<int64_t>> printed_ids(const std::string& output) {
  std::map<int64_t, std::vector<int64_t>> ids;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    long long id = 0, worker = 0;
    if (std::sscanf(line.c_str(), "id %lld worker %lld", &id, &worker) == 2) ids[worker].push_back(id);
  }
  return ids;
}

TEST_CASE("kill -9 the training program and start it again: it reads on from the workers' iterator positions",
          "[training][datasets][recovery]") {
  Training t(1, 2, {"--num-workers", "2"});
  std::vector<std::string> args = {"--coordinator", t.coordinator->address(), "--pause-ms", "100"};
  Daemon& first = t.cluster.start("input_program", args, {}, /*wait_healthy=*/false, /*pick_port=*/false);
  REQUIRE(wait_until([&]() { return all_ids(printed_ids(first.log())).size() >= 20; }, 30s));
  first.kill_now();
  auto before = printed_ids(first.log());
  // What the killed program's closures took: each one the coordinator ran
  // (none fails or is cancelled here), once the ones it left queued or
  // running have ended.
  REQUIRE(wait_until([&]() {
    return metric(*t.coordinator, "capstan_coordinator_closures_queued") +
               metric(*t.coordinator, "capstan_coordinator_closures_running") == 0;
  }, 30s));
  const double scheduled = metric(*t.coordinator, "capstan_coordinator_closures_scheduled_total");
  const double taken = metric(*t.coordinator, "capstan_coordinator_closures_succeeded_total");
  CHECK(taken == scheduled);
  // The same program again: it creates its named dataset again and reads to
  // the end.
  args.back() = "0";
  auto second = t.cluster.run("input_program", args, {}, 60s);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  auto after = printed_ids(second.output);
  CHECK_THAT(t.coordinator->log(), Catch::Contains("per-worker dataset 'numbers' found again"));
  // The workers' iterators neither repeat nor skip: every element is either
  // printed once (by one run or the other) or was taken by a closure of the
  // killed run whose value it never fetched (TF's iterators lose those too).
  // Exactly those are missing: the closures of the one round in flight at
  // the kill (4 at most: a round is fetched before the next is scheduled).
  const int64_t unfetched = static_cast<int64_t>(taken) - static_cast<int64_t>(all_ids(before).size());
  INFO("closures the killed run had run: " << taken << "; it printed " << all_ids(before).size());
  CHECK(unfetched >= 0);
  CHECK(unfetched <= 4);
  std::vector<int64_t> all = all_ids(before);
  for (int64_t id : all_ids(after)) all.push_back(id);
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  const std::vector<int64_t> every = first_integers(60);
  std::vector<int64_t> missing;
  std::set_difference(every.begin(), every.end(), all.begin(), all.end(), std::back_inserter(missing));
  CHECK(static_cast<int64_t>(missing.size()) == unfetched);
  CHECK(all_ids(before).size() < 40);  // killed midway
  // Each worker goes on right after the elements the killed run took: a
  // missing id lies between one worker's last printed id of the first run
  // and its first of the second.
  for (const auto& [worker, ids] : before) {
    INFO("worker " << worker);
    if (!after[worker].empty()) CHECK(after[worker].front() > ids.back());
  }
  for (int64_t id : missing) {
    INFO("missing id " << id);
    bool in_a_gap = false;
    for (const auto& [worker, ids] : before) {
      const bool after_first = ids.back() < id;
      const bool before_second = after[worker].empty() || id < after[worker].front();
      in_a_gap = in_a_gap || (after_first && before_second);
    }
    CHECK(in_a_gap);
  }
}

TEST_CASE("a training program that crashes with a round in flight: the restarted one reads on after exactly that round",
          "[training][datasets][recovery]") {
  Training t(1, 2, {"--num-workers", "2"});
  std::vector<std::string> args = {"--coordinator", t.coordinator->address(), "--crash-after", "20"};
  auto first = t.cluster.run("input_program", args, {}, 60s);
  INFO(first.output);
  REQUIRE(first.exit_code == -1);  // SIGKILL
  REQUIRE_THAT(first.output, Catch::Contains("crashing with 4 closure(s) in flight"));
  auto before = printed_ids(first.output);
  REQUIRE(all_ids(before).size() == 20);
  // The round the crash left: the coordinator runs it all the same, and its
  // values are never fetched.
  REQUIRE(wait_until([&]() {
    return metric(*t.coordinator, "capstan_coordinator_closures_succeeded_total") == 24;
  }, 30s));
  args = {"--coordinator", t.coordinator->address()};
  auto second = t.cluster.run("input_program", args, {}, 60s);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  auto after = printed_ids(second.output);
  // Exactly the 4 elements of the round in flight are missing; every other
  // one is read once, and each worker goes on right after its part of that
  // round.
  std::vector<int64_t> all = all_ids(before);
  for (int64_t id : all_ids(after)) all.push_back(id);
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  CHECK(all.size() == 56);
  int64_t skipped = 0;
  for (const auto& [worker, ids] : before) {
    INFO("worker " << worker);
    REQUIRE_FALSE(after[worker].empty());
    // A worker's shard is every other id: the round took the ones between.
    CHECK(after[worker].front() > ids.back());
    skipped += (after[worker].front() - ids.back()) / 2 - 1;
  }
  CHECK(skipped == 4);
}

TEST_CASE("pointed at another daemon or at an HTTP port, a client says so at once", "[training][errors]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  // A minute to connect: a client that kept retrying would take two, one
  // that fails at once milliseconds (7 s on a loaded CI machine once).
  ClientOptions options;
  options.connect_timeout = 60s;
  auto started = std::chrono::steady_clock::now();
  auto wrong_role = ClusterCoordinator::connect(ps.address(), options);
  REQUIRE_FALSE(wrong_role.ok());
  CHECK(wrong_role.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(wrong_role.status().message(), Catch::Contains(ps.address() + " is a ps, expected a coordinator"));

  std::string http = "127.0.0.1:" + std::to_string(ps.http_port());
  auto web = ClusterCoordinator::connect(http, options);
  REQUIRE_FALSE(web.ok());
  CHECK(web.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(web.status().message(), Catch::Contains(http + " answers HTTP"));
  CHECK_THAT(web.status().message(), Catch::Contains("give its RPC port"));
  // No retrying until the connect timeout.
  CHECK(std::chrono::steady_clock::now() - started < 30s);

  auto ctl = cluster.run("capstanctl", {"health", http});
  CHECK(ctl.exit_code == 1);
  CHECK_THAT(ctl.output, Catch::Contains("answers HTTP"));
  CHECK_THAT(ctl.output, !Catch::Contains("segment"));
}

TEST_CASE("an unknown per-worker dataset function is refused", "[training][datasets]") {
  Training t(1, 1);
  auto missing = t.client->create_per_worker_dataset(std::string("no_such_function"));
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("no_such_function"));
}

}  // namespace capstan::testing

namespace capstan::testing {

TEST_CASE("a training program that crashes can reconnect: variables stay on the PS", "[training]") {
  Training t(2, 1);
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  for (int i = 0; i < 5; ++i) REQUIRE(t.client->schedule("add_one").ok());
  REQUIRE(t.client->join().ok());
  t.client.reset();  // the program goes away

  auto again = ClusterCoordinator::connect(t.coordinator->address());
  REQUIRE(again.ok());
  auto variables = (*again)->variables();
  REQUIRE(variables.ok());
  REQUIRE(variables->size() == 1);
  CHECK(variables->at(0).name == "counter");
  // Creating it again (as a restarted program does) keeps the trained value.
  REQUIRE((*again)->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  CHECK((*again)->read_variable("counter").value().flat<float>()[0] == 5.0f);
  auto clash = (*again)->create_variable({"counter", *Tensor::zeros(DType::kFloat32, {2}), Optimizer::sgd(0.1)});
  CHECK(clash.status().code() == StatusCode::kAlreadyExists);
}

}  // namespace capstan::testing

namespace capstan::testing {

TEST_CASE("a checkpoint restores into a cluster with 3 PS instead of 2, values identical",
          "[training][checkpoint]") {
  TestCluster keep;  // outlives both clusters: holds the checkpoint directory
  std::string dir = keep.dir() + "/ckpts";
  Tensor emb, dense, accumulator_probe;
  {
    Training t(2, 1);
    REQUIRE(t.client->create_variable({"emb", *random_normal_initializer(DType::kFloat32, {13, 4}, 0, 1, 5),
                                       Optimizer::adagrad(0.5), Partitioner::fixed_shards(5)}).ok());
    REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
    // Train a little so values and optimizer slots move.
    Element step = ints({1, 12});
    step.components.insert(step.components.begin(), *Tensor::from_vector<float>(std::vector<float>(8, 0.5f), {2, 4}));
    for (int i = 0; i < 3; ++i) REQUIRE(t.client->schedule("sparse_step", step).ok());
    for (int i = 0; i < 7; ++i) REQUIRE(t.client->schedule("add_one").ok());
    REQUIRE(t.client->join().ok());
    emb = t.client->read_variable("emb").value();
    auto saved = t.client->save_checkpoint(dir, 42, 2);
    REQUIRE(saved.ok());
    CHECK_THAT(*saved, Catch::EndsWith("ckpt-42"));
    // A second, later checkpoint; max_to_keep 2 keeps both.
    REQUIRE(t.client->save_checkpoint(dir, 43, 2).ok());
    auto inspect = t.cluster.run("capstanctl", {"checkpoint", "inspect", dir});
    CHECK(inspect.exit_code == 0);
    CHECK_THAT(inspect.output, Catch::Contains("emb"));
    CHECK_THAT(inspect.output, Catch::Contains("adagrad"));
    CHECK_THAT(inspect.output, Catch::Contains("43"));
  }
  // A whole new cluster, with three parameter servers and a different partitioner.
  Training t(3, 1);
  REQUIRE(t.client->create_variable({"emb", *Tensor::zeros(DType::kFloat32, {13, 4}), Optimizer::adagrad(0.5),
                                     Partitioner::fixed_shards(3)}).ok());
  auto step = t.client->restore_checkpoint(dir + "/ckpt-42");
  REQUIRE(step.ok());
  CHECK(*step == 42);
  CHECK(t.client->read_variable("emb").value().equals(emb));
  // "counter" was not created by the new program: restore created it.
  CHECK(counter(*t.client) == 7.0f);
  auto info = t.client->variables().value();
  for (const auto& v : info) {
    if (v.name == "emb") CHECK(v.shards.size() == 3);
  }
  // Restored slots: the same sparse step gives the same result as it would
  // have in the old cluster (Adagrad's accumulator came back too), i.e. not
  // what a fresh accumulator would give. Check one row moved by less than a
  // fresh-accumulator step would move it.
  Element again = ints({1});
  again.components.insert(again.components.begin(), *Tensor::from_vector<float>(std::vector<float>(4, 0.5f), {1, 4}));
  REQUIRE(t.client->fetch(t.client->schedule("sparse_step", again).value()).ok());
  float before = emb.flat<float>()[4];
  float after = t.client->read_variable("emb").value().flat<float>()[4];
  // Accumulator after 3 steps of g=1.0 (two ids, summed 0.5+0.5? no: one id each) is 0.1+3*0.25;
  // the 4th step moves by 0.5*0.5/sqrt(0.1+4*0.25) ~ 0.238, a fresh one by 0.5*0.5/sqrt(0.35) ~ 0.423.
  CHECK(before - after == Approx(0.5 * 0.5 / std::sqrt(0.1 + 4 * 0.25)).epsilon(0.01));
}

TEST_CASE("a checkpoint with a damaged or missing file is refused, naming the file",
          "[training][checkpoint]") {
  Training t(2, 1);
  REQUIRE(t.client->create_variable({"emb", *random_normal_initializer(DType::kFloat32, {8, 2}, 0, 1, 3),
                                     Optimizer::sgd(0.1), Partitioner::fixed_shards(2)}).ok());
  std::string dir = t.cluster.dir() + "/ckpts";
  auto path = t.client->save_checkpoint(dir, 1, 5);
  REQUIRE(path.ok());
  {
    std::fstream f(*path + "/ps-1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto damaged = t.client->restore_checkpoint(*path);
  CHECK(damaged.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(damaged.status().message(), Catch::Contains("ps-1.safetensors"));
  std::filesystem::remove(*path + "/ps-0.safetensors");
  auto missing = t.client->restore_checkpoint(*path);
  CHECK(missing.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(missing.status().message(), Catch::Contains("ps-0.safetensors"));
  auto inspect = t.cluster.run("capstanctl", {"checkpoint", "inspect", *path});
  CHECK(inspect.exit_code == 1);
  CHECK_THAT(inspect.output, Catch::Contains("ps-0.safetensors"));
}

TEST_CASE("a changed byte in a checkpoint's manifest is DataLoss naming it, not a missing variable",
          "[training][checkpoint]") {
  Training t(1, 1);
  REQUIRE(t.client->create_variable({"emb", *random_normal_initializer(DType::kFloat32, {8, 2}, 0, 1, 3),
                                     Optimizer::sgd(0.1)}).ok());
  auto path = t.client->save_checkpoint(t.cluster.dir() + "/ckpts", 1, 5);
  REQUIRE(path.ok());
  std::string manifest;
  {
    std::ifstream in(*path + "/manifest.json");
    manifest.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto at = manifest.find("\"name\": \"emb\"");
  REQUIRE(at != std::string::npos);
  manifest[at + 10] = 'f';  // "emb" -> "fmb"
  std::ofstream(*path + "/manifest.json", std::ios::trunc) << manifest;
  auto restored = t.client->restore_checkpoint(*path);
  CHECK(restored.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(restored.status().message(), Catch::Contains("manifest.json") && Catch::Contains("checksum"));
}

TEST_CASE("restoring a checkpoint older than a variable: TF's default restores the rest, strict refuses",
          "[training][checkpoint]") {
  Training t(1, 1);
  Tensor saved = Tensor::from_vector<float>({1, 2}, {2}).value();
  REQUIRE(t.client->create_variable({"w", saved, Optimizer::sgd(0.1)}).ok());
  auto path = t.client->save_checkpoint(t.cluster.dir() + "/ckpts", 7, 5);
  REQUIRE(path.ok());
  Tensor later = Tensor::from_vector<float>({5, 5}, {2}).value();
  REQUIRE(t.client->create_variable({"later", later, Optimizer::sgd(0.1)}).ok());
  REQUIRE(t.client->assign_variable("w", Tensor::from_vector<float>({0, 0}, {2}).value()).ok());

  auto strict = t.client->restore_checkpoint(*path, /*strict=*/true);
  CHECK(strict.status().code() == StatusCode::kNotFound);
  CHECK_THAT(strict.status().message(), Catch::Contains("'later'"));
  auto lenient = t.client->restore_checkpoint(*path, /*strict=*/false);
  REQUIRE(lenient.ok());
  CHECK(lenient->step == 7);
  CHECK(lenient->not_in_checkpoint == std::vector<std::string>{"later"});
  CHECK(t.client->read_variable("w").value().equals(saved));
  CHECK(t.client->read_variable("later").value().equals(later));
  CHECK(t.client->restore_checkpoint(*path).value() == 7);
}

}  // namespace capstan::testing

namespace capstan::testing {

TEST_CASE("bad requests get clear errors and the cluster keeps serving", "[training][bad-input]") {
  Training t(1, 1);
  auto bad_lr = t.client->create_variable({"w", *Tensor::zeros(DType::kFloat32, {3}), Optimizer::adagrad(-1.0)});
  CHECK(bad_lr.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad_lr.status().message(), Catch::Contains("learning_rate"));
  auto no_name = t.client->create_variable({"", Tensor::scalar<float>(0), Optimizer::sgd(0.1)});
  CHECK(no_name.status().code() == StatusCode::kInvalidArgument);
  // A kind the enum does not have reaches the coordinator as an unknown name.
  Optimizer unknown = Optimizer::sgd(0.1);
  unknown.kind = static_cast<Optimizer::Kind>(42);
  auto bad_kind = t.client->create_variable({"w2", Tensor::scalar<float>(0), unknown});
  CHECK(bad_kind.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad_kind.status().message(), Catch::Contains("unknown optimizer"));
  Partitioner zero = Partitioner::fixed_shards(0);
  auto bad_partitioner = t.client->create_variable({"w3", *Tensor::zeros(DType::kFloat32, {4}), Optimizer::sgd(0.1), zero});
  CHECK(bad_partitioner.status().code() == StatusCode::kInvalidArgument);
  CHECK(t.client->read_variable("nope").status().code() == StatusCode::kNotFound);
  CHECK(t.client->restore_checkpoint(t.cluster.dir() + "/no-such-checkpoint").status().code() == StatusCode::kNotFound);
  CHECK(t.client->fetch(RemoteValue{987654}).status().code() == StatusCode::kNotFound);
  // Gathering out of range is refused by the closure's router.
  REQUIRE(t.client->create_variable({"emb", *Tensor::zeros(DType::kFloat32, {4, 2}), Optimizer::sgd(0.1)}).ok());
  auto out_of_range = t.client->fetch(t.client->schedule("gather_rows", ints({9})).value());
  CHECK(out_of_range.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(out_of_range.status().message(), Catch::Contains("id 9 is out of range"));
  (void)t.client->join();  // clears that closure's error
  // Still serving.
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  REQUIRE(t.client->schedule("add_one").ok());
  CHECK(t.client->join().ok());
  CHECK(counter(*t.client) == 1.0f);
}

}  // namespace capstan::testing

namespace capstan::testing {

TEST_CASE("a worker that stops answering is dropped, its closures re-run elsewhere, and it rejoins",
          "[training][fault]") {
  Training t(1, 2, {"--worker-ping-interval-ms", "200", "--worker-ping-timeout-ms", "500"});
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  std::vector<RemoteValue> values;
  for (int64_t i = 0; i < 20; ++i) values.push_back(t.client->schedule("sleep_then_tag", sleep_args(100, 500 + i)).value());
  REQUIRE(wait_until([&t]() { return counter(*t.client) >= 2.0f; }, 20s));
  ::kill(t.workers[1]->pid(), SIGSTOP);  // hung: the TCP link stays up
  REQUIRE(t.client->join().ok());
  for (int64_t i = 0; i < 20; ++i) {
    CHECK(t.client->fetch(values[static_cast<size_t>(i)]).value().components[0].flat<int64_t>()[0] == 500 + i);
  }
  CHECK_THAT(t.coordinator->log(), Catch::Contains("no answer to a ping"));
  ::kill(t.workers[1]->pid(), SIGCONT);
  CHECK(wait_until([&t]() { return t.client->num_workers() == 2; }, 20s));
  CHECK(wait_until([&t]() { return t.workers[1]->log().find("registering again") != std::string::npos; }, 10s));
}

}  // namespace capstan::testing
