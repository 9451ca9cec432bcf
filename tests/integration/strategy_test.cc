// MirroredStrategy on real daemons: the worker-servers are the replicas, the
// coordinator forms their group and runs each step on all of them at once.
// Exactness against one replica, replicas bit-identical, a worker killed or
// stopped mid-step (the step fails on the others, the next goes on, the
// worker that comes back rejoins), a replica's own error, checkpoints
// between parameter-server and mirrored training, and bad requests.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <thread>

#include "capstan/data/dataset.h"
#include "capstan/strategy.h"
#include "capstan/training.h"
#include "tests/harness/process.h"
#include "tests/build_path.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;

struct Replicated {
  // `num_ps` parameter servers (0: none), `num_workers` worker-servers with
  // the training module.
  explicit Replicated(int num_workers, int num_ps = 0, std::vector<std::string> coordinator_flags = {}) {
    std::string ps_list;
    for (int i = 0; i < num_ps; ++i) {
      ps_list += (i > 0 ? "," : "") + cluster.start("ps-server", {"--task-index", std::to_string(i)}).address();
    }
    std::vector<std::string> flags = coordinator_flags;
    if (!ps_list.empty()) flags.insert(flags.end(), {"--ps", ps_list});
    coordinator = &cluster.start("coordinator", flags);
    for (int i = 0; i < num_workers; ++i) workers.push_back(&add_worker(i));
    client = ClusterCoordinator::connect(coordinator->address()).value();
    REQUIRE(wait_until([this, num_workers]() { return client->num_workers() == num_workers; }, 15s));
  }
  Daemon& add_worker(int index) {
    return cluster.start("worker-server", {"--coordinator", coordinator->address(), "--module",
                                           capstan::testing::build_path(CAPSTAN_TRAINING_MODULE), "--task-index", std::to_string(index)});
  }

  TestCluster cluster;
  Daemon* coordinator = nullptr;
  std::vector<Daemon*> workers;
  std::unique_ptr<ClusterCoordinator> client;
};

// Replicated whose coordinator journals into a work_dir on a fixed port: a
// test kills it with -9 and starts it again where the workers and the
// client find it.
struct DurableReplicated {
  explicit DurableReplicated(int num_workers)
      : flags{"--work-dir", scratch.dir() + "/coordinator", "--port", std::to_string(free_port())},
        r(num_workers, 0, flags) {}
  void restart_coordinator() { r.coordinator = &r.cluster.restart_on_port("coordinator", flags); }

  TestCluster scratch;
  const std::vector<std::string> flags;
  Replicated r;
};

std::vector<MirroredVariableSpec> linear_model(Optimizer optimizer) {
  return {{"w", Tensor::zeros(DType::kFloat32, {2}).value(), optimizer},
          {"b", Tensor::zeros(DType::kFloat32, {1}).value(), optimizer}};
}

StrategyOptions options(int min_replicas, std::chrono::milliseconds timeout = 20s) {
  StrategyOptions o;
  o.min_replicas = min_replicas;
  o.collective.timeout = timeout;
  return o;
}

Element step_args(int64_t step, int64_t global_batch, int64_t pause_ms = -1) {
  Element e{{Tensor::scalar<int64_t>(step), Tensor::scalar<int64_t>(global_batch)}, {}};
  if (pause_ms >= 0) e.components.push_back(Tensor::scalar<int64_t>(pause_ms));
  return e;
}

std::vector<float> values(const Tensor& t) { return {t.flat<float>().begin(), t.flat<float>().end()}; }

// Trains `steps` linear steps of global batch 16 on `n` workers; w and b after.
std::pair<std::vector<float>, std::vector<float>> train_linear(int n, int steps) {
  Replicated r(n);
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::sgd(0.1)), options(n)).value();
  float first_loss = 0, last_loss = 0;
  for (int s = 0; s < steps; ++s) {
    auto per_replica = strategy->run("linear_step", step_args(s, 16));
    REQUIRE(per_replica.ok());
    REQUIRE(per_replica->values.size() == static_cast<size_t>(n));
    CHECK(per_replica->step == s + 1);
    // Every replica saw the variables at the same step.
    for (const auto& v : per_replica->values) CHECK(v.components[3].flat<int64_t>()[0] == s);
    float loss = MirroredStrategy::reduce(ReduceOp::kMean, *per_replica).value().flat<float>()[0];
    if (s == 0) first_loss = loss;
    last_loss = loss;
  }
  CHECK(strategy->num_replicas_in_sync() == n);
  CHECK(last_loss < first_loss / 4);
  REQUIRE(strategy->verify_replicas().ok());
  auto replicas = strategy->replicas().value();
  REQUIRE(replicas.size() == static_cast<size_t>(n));
  for (const auto& replica : replicas) CHECK(replica.step == steps);
  return {values(strategy->read_variable("w").value()), values(strategy->read_variable("b").value())};
}

TEST_CASE("strategy.run on 2 workers ends where 1 worker with twice the batch does, replicas bit-identical",
          "[strategy]") {
  const int steps = 25;
  auto [w2, b2] = train_linear(2, steps);
  auto [w1, b1] = train_linear(1, steps);
  INFO("2 replicas: w " << w2[0] << " " << w2[1] << " b " << b2[0] << "; 1 replica: w " << w1[0] << " " << w1[1]
                        << " b " << b1[0]);
  for (size_t i = 0; i < 2; ++i) CHECK(std::abs(w2[i] - w1[i]) < 1e-5);
  CHECK(std::abs(b2[0] - b1[0]) < 1e-5);
  // It learned (w -> (3, -2), b -> 1).
  CHECK(std::abs(w2[0] - 3) < 1.0);
}

TEST_CASE("strategy.reduce sums and averages per-replica values", "[strategy]") {
  PerReplica p;
  p.values.push_back(Element{{Tensor::from_vector<float>({1, 2}, {2}).value()}, {}});
  p.values.push_back(Element{{Tensor::from_vector<float>({3, 6}, {2}).value()}, {}});
  CHECK(values(MirroredStrategy::reduce(ReduceOp::kSum, p).value()) == std::vector<float>{4, 8});
  CHECK(values(MirroredStrategy::reduce(ReduceOp::kMean, p).value()) == std::vector<float>{2, 4});
  CHECK(MirroredStrategy::reduce(ReduceOp::kSum, p, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(MirroredStrategy::reduce(ReduceOp::kSum, PerReplica{}).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a worker killed mid-step: the step fails naming it, training goes on, and it rejoins",
          "[strategy][fault]") {
  Replicated r(3);
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::adam(0.05)), options(1)).value();
  for (int s = 0; s < 5; ++s) REQUIRE(strategy->run("linear_step", step_args(s, 12)).ok());
  // A slow step; worker 2 dies in its pause.
  auto started = std::chrono::steady_clock::now();
  auto step = std::async(std::launch::async, [&]() { return strategy->run("slow_linear_step", step_args(5, 12, 1500)); });
  std::this_thread::sleep_for(600ms);
  r.workers[2]->kill_now();
  auto failed = step.get();
  auto took = std::chrono::steady_clock::now() - started;
  INFO(failed.status().to_string());
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(failed.status().message(), Catch::Contains("task 2") && Catch::Contains("lost"));
  CHECK(took < 15s);  // not the collective deadline (20 s)
  // The next steps run on the two survivors, from the last step all of
  // them finished.
  for (int s = 6; s < 9; ++s) {
    auto per_replica = strategy->run("linear_step", step_args(s, 12));
    REQUIRE(per_replica.ok());
    CHECK(per_replica->values.size() == 2);
    CHECK(per_replica->task_indexes == std::vector<int>{0, 1});
  }
  REQUIRE(strategy->verify_replicas().ok());
  const int64_t after_survivors = strategy->replicas().value().at(0).step;
  // Worker 2 comes back (a new process, holding nothing): it joins at the
  // next step and receives the variables.
  r.workers[2] = &r.add_worker(2);
  REQUIRE(wait_until([&]() { return r.client->num_workers() == 3; }, 15s));
  auto rejoined = strategy->run("linear_step", step_args(9, 12));
  REQUIRE(rejoined.ok());
  CHECK(rejoined->values.size() == 3);
  // Each replica saw the same step before this one.
  for (const auto& v : rejoined->values) CHECK(v.components[3].flat<int64_t>()[0] == after_survivors);
  REQUIRE(strategy->verify_replicas().ok());
  auto replicas = strategy->replicas().value();
  REQUIRE(replicas.size() == 3);
  for (const auto& replica : replicas) {
    CHECK(replica.step == after_survivors + 1);
    CHECK(replica.checksum == replicas[0].checksum);
  }
  // The operator's view of the same.
  auto shown = r.cluster.run("capstanctl", {"replicas", r.coordinator->address(), "mirrored"});
  INFO(shown.output);
  CHECK(shown.exit_code == 0);
  CHECK_THAT(shown.output, Catch::Contains("3 replica(s)") && Catch::Contains("replicas identical"));
  auto unknown = r.cluster.run("capstanctl", {"replicas", r.coordinator->address(), "no-such-strategy"});
  CHECK(unknown.exit_code == 1);
  CHECK_THAT(unknown.output, Catch::Contains("no strategy named 'no-such-strategy'"));
}

TEST_CASE("a worker stopped mid-step (SIGSTOP): the step fails within the deadline, the others go on",
          "[strategy][fault]") {
  Replicated r(3, 0, {"--worker-ping-interval-ms", "300", "--worker-ping-timeout-ms", "1000"});
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::sgd(0.05)), options(1, 6s)).value();
  for (int s = 0; s < 3; ++s) REQUIRE(strategy->run("linear_step", step_args(s, 12)).ok());
  auto started = std::chrono::steady_clock::now();
  auto step = std::async(std::launch::async, [&]() { return strategy->run("slow_linear_step", step_args(3, 12, 1000)); });
  std::this_thread::sleep_for(400ms);
  kill(r.workers[1]->pid(), SIGSTOP);
  auto failed = step.get();
  auto took = std::chrono::steady_clock::now() - started;
  INFO(failed.status().to_string());
  CHECK(failed.status().code() == StatusCode::kUnavailable);
  CHECK(took < 12s);
  auto next = strategy->run("linear_step", step_args(4, 12));
  INFO(next.status().to_string());
  REQUIRE(next.ok());
  CHECK(next->task_indexes == std::vector<int>{0, 2});
  REQUIRE(strategy->verify_replicas().ok());
  kill(r.workers[1]->pid(), SIGCONT);
}

TEST_CASE("a replica's own error fails the step at once with that error, the next step re-forms",
          "[strategy]") {
  Replicated r(2);
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::sgd(0.1)), options(2, 30s)).value();
  REQUIRE(strategy->run("linear_step", step_args(0, 8)).ok());
  auto started = std::chrono::steady_clock::now();
  auto failed = strategy->run("fail_on_replica", Element{{Tensor::scalar<int64_t>(1)}, {}});
  CHECK(std::chrono::steady_clock::now() - started < 10s);  // not the 30 s deadline
  INFO(failed.status().to_string());
  CHECK(failed.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(failed.status().message(), Catch::Contains("refuses its batch"));
  auto next = strategy->run("linear_step", step_args(1, 8));
  REQUIRE(next.ok());
  REQUIRE(strategy->verify_replicas().ok());
  // Replica 0 may have applied the failed step's update before it heard of
  // replica 1's error; the group took the state both had finished.
  for (const auto& v : next->values) CHECK(v.components[3].flat<int64_t>()[0] == 1);
}

TEST_CASE("a parameter-server checkpoint restores into mirrored training, and back, with identical values",
          "[strategy][checkpoint]") {
  TestCluster scratch;
  const std::string dir = scratch.dir() + "/ckpt";
  Tensor trained_on_ps;
  {
    Replicated ps_training(0, 1);
    auto& client = *ps_training.client;
    REQUIRE(client.create_variable({"w", Tensor::from_vector<float>({0.5f, -1.0f}, {2}).value(), Optimizer::adam(0.1)}).ok());
    REQUIRE(client.create_variable({"b", Tensor::zeros(DType::kFloat32, {1}).value(), Optimizer::adam(0.1)}).ok());
    for (int i = 0; i < 3; ++i) {
      REQUIRE(client.apply_gradients("w", Tensor::from_vector<float>({1.0f, 0.25f}, {2}).value()).ok());
    }
    trained_on_ps = client.read_variable("w").value();
    REQUIRE(client.save_checkpoint(dir, 3).ok());
  }
  Tensor trained_mirrored;
  std::string mirrored_checkpoint;
  {
    Replicated mirrored(2);
    auto strategy = MirroredStrategy::create(*mirrored.client, linear_model(Optimizer::adam(0.1)), options(2)).value();
    CHECK(strategy->restore_checkpoint(dir).value() == 3);
    CHECK(strategy->read_variable("w").value().equals(trained_on_ps));
    // The first step starts from it on both replicas (and from Adam's step 3).
    auto first = strategy->run("linear_step", step_args(0, 8));
    REQUIRE(first.ok());
    for (const auto& v : first->values) CHECK(v.components[3].flat<int64_t>()[0] == 3);
    REQUIRE(strategy->run("linear_step", step_args(1, 8)).ok());
    REQUIRE(strategy->verify_replicas().ok());
    trained_mirrored = strategy->read_variable("w").value();
    CHECK_FALSE(trained_mirrored.equals(trained_on_ps));
    mirrored_checkpoint = strategy->save_checkpoint(dir, 5).value();
  }
  {
    Replicated ps_again(0, 2);
    CHECK(ps_again.client->restore_checkpoint(mirrored_checkpoint).value() == 5);
    CHECK(ps_again.client->read_variable("w").value().equals(trained_mirrored));
  }
  auto inspect = scratch.run("capstanctl", {"checkpoint", "inspect", mirrored_checkpoint});
  INFO(inspect.output);
  CHECK(inspect.exit_code == 0);
  CHECK_THAT(inspect.output, Catch::Contains("adam"));
}

TEST_CASE("kill -9 the coordinator with its work_dir between and during steps, the strategy survives and its steps "
          "go on from the replicas",
          "[strategy][fault][durable]") {
  DurableReplicated durable(2);
  Replicated& r = durable.r;
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::adam(0.05)), options(2)).value();
  for (int s = 0; s < 5; ++s) REQUIRE(strategy->run("linear_step", step_args(s, 12)).ok());
  REQUIRE(strategy->verify_replicas().ok());

  // Between steps: the next run() waits for the coordinator, which forms the
  // group again from the replicas, at their step.
  r.coordinator->kill_now();
  durable.restart_coordinator();
  CHECK_THAT(r.coordinator->log(), Catch::Contains("replayed the journal") && Catch::Contains("1 strategy"));
  // Before any step: the replicas the workers kept, at step 5.
  REQUIRE(wait_until([&]() { return r.client->num_workers() == 2; }, 20s));
  REQUIRE(strategy->verify_replicas().ok());
  auto kept = strategy->replicas().value();
  REQUIRE(kept.size() == 2);
  for (const auto& replica : kept) CHECK(replica.step == 5);
  // The same program object goes on; its create() (a program starting
  // again) finds the strategy too.
  for (int s = 5; s < 8; ++s) {
    auto per_replica = strategy->run("linear_step", step_args(s, 12));
    INFO(per_replica.status().to_string());
    REQUIRE(per_replica.ok());
    CHECK(per_replica->step == s + 1);
    REQUIRE(per_replica->values.size() == 2);
    for (const auto& v : per_replica->values) CHECK(v.components[3].flat<int64_t>()[0] == s);
  }
  REQUIRE(MirroredStrategy::create(*r.client, linear_model(Optimizer::adam(0.05)), options(2)).ok());
  REQUIRE(strategy->verify_replicas().ok());

  // During a step: that run() fails Unavailable (its outcome went with the
  // coordinator), the next ones go on, never from an earlier step.
  auto step = std::async(std::launch::async, [&]() { return strategy->run("slow_linear_step", step_args(8, 12, 1500)); });
  std::this_thread::sleep_for(600ms);
  r.coordinator->kill_now();
  durable.restart_coordinator();
  auto cut = step.get();
  INFO(cut.status().to_string());
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(cut.status().message(), Catch::Contains("outcome was lost"));
  int unavailable = 0;
  int64_t last = 0;
  for (int s = 9; s < 12; ++s) {
    auto per_replica = strategy->run("linear_step", step_args(s, 12));
    if (!per_replica.ok() && per_replica.status().code() == StatusCode::kUnavailable && unavailable++ == 0) {
      --s;  // at most one more (the link may have broken under it too)
      continue;
    }
    INFO(per_replica.status().to_string());
    REQUIRE(per_replica.ok());
    // 8 steps before the cut one; it was applied on every replica or on none.
    CHECK(per_replica->step >= 9);
    CHECK((last == 0 || per_replica->step == last + 1));
    for (const auto& v : per_replica->values) CHECK(v.components[3].flat<int64_t>()[0] == per_replica->step - 1);
    last = per_replica->step;
  }
  REQUIRE(strategy->verify_replicas().ok());
  auto replicas = strategy->replicas().value();
  REQUIRE(replicas.size() == 2);
  for (const auto& replica : replicas) CHECK(replica.step == last);
}

TEST_CASE("strategy requests that cannot be served say why", "[strategy]") {
  Replicated r(1, 1);
  auto& client = *r.client;
  REQUIRE(client.create_variable({"table", Tensor::zeros(DType::kFloat32, {4, 2}).value(), Optimizer::sgd(0.1)}).ok());
  auto clash = MirroredStrategy::create(client, {{"table", Tensor::zeros(DType::kFloat32, {4, 2}).value(),
                                                  Optimizer::sgd(0.1)}});
  CHECK(clash.status().code() == StatusCode::kAlreadyExists);
  CHECK_THAT(clash.status().message(), Catch::Contains("parameter-server variable"));
  auto ints = MirroredStrategy::create(client, {{"n", Tensor::zeros(DType::kInt32, {2}).value(), Optimizer::sgd(0.1)}});
  CHECK(ints.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(ints.status().message(), Catch::Contains("float32 or float64"));
  auto strategy = MirroredStrategy::create(client, linear_model(Optimizer::sgd(0.1))).value();
  // Created again by a reconnecting program: the same one.
  CHECK(MirroredStrategy::create(client, linear_model(Optimizer::sgd(0.1))).ok());
  auto other = MirroredStrategy::create(client, linear_model(Optimizer::adam(0.1)));
  CHECK(other.status().code() == StatusCode::kAlreadyExists);
  CHECK(client.create_variable({"w", Tensor::zeros(DType::kFloat32, {2}).value(), Optimizer::sgd(0.1)}).status().code() ==
        StatusCode::kAlreadyExists);
  auto unknown = strategy->run("no_such_closure");
  CHECK(unknown.status().code() == StatusCode::kNotFound);
  REQUIRE(strategy->run("linear_step", step_args(0, 4)).ok());
  CHECK(strategy->read_variable("nope").status().code() == StatusCode::kNotFound);
  StrategyOptions missing;
  missing.name = "lonely";
  missing.min_replicas = 3;
  missing.collective.timeout = 1500ms;
  auto lonely = MirroredStrategy::create(client, {{"v", Tensor::zeros(DType::kFloat32, {1}).value(), Optimizer::sgd(0.1)}},
                                         missing)
                    .value();
  auto waited = lonely->run("linear_step", step_args(0, 4));
  CHECK(waited.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(waited.status().message(), Catch::Contains("needs 3 worker(s)"));
}

// ---- Exactly-once input ------------------------------------------------------------------

constexpr int64_t kInputExamples = 60;
constexpr int64_t kInputBatch = 10;  // uneven among 3 replicas: 4, 3, 3

StepInputOptions input_options() {
  StepInputOptions o;
  o.global_batch = kInputBatch;
  o.seed = 11;
  return o;
}

// The ids a committed step trained on, by the epoch of its positions.
void count_ids(const PerReplica& step, std::map<int64_t, std::map<int64_t, int>>& seen) {
  int64_t examples = 0;
  for (size_t r = 0; r < step.values.size(); ++r) {
    const Tensor& ids = step.values[r].components.at(1);
    CHECK(ids.num_elements() == step.examples.at(r));
    examples += ids.num_elements();
    const int64_t epoch = (step.input_position - 1) / kInputExamples;
    for (int64_t id : ids.flat<int64_t>()) ++seen[epoch][id];
  }
  CHECK(examples == kInputBatch);  // a constant global batch, whatever the replicas
}

// `steps` committed steps of the step input on one worker: w and b after.
std::pair<std::vector<float>, std::vector<float>> train_input_alone(int64_t steps) {
  Replicated r(1);
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::sgd(0.1)), options(1)).value();
  auto input = strategy->distribute_step_input(data::Dataset::range(kInputExamples), input_options()).value();
  for (int64_t s = 0; s < steps; ++s) REQUIRE(strategy->run("input_linear_step", Element{{input.arg()}, {}}).ok());
  return {values(strategy->read_variable("w").value()), values(strategy->read_variable("b").value())};
}

TEST_CASE("exactly-once input: a worker killed mid-step takes nothing, every example once per epoch, the model one "
          "worker trains",
          "[strategy][fault][input]") {
  Replicated r(3);
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::sgd(0.1)), options(1)).value();
  auto input = strategy->distribute_step_input(data::Dataset::range(kInputExamples), input_options()).value();
  std::map<int64_t, std::map<int64_t, int>> seen;  // epoch -> id -> times trained
  int64_t committed = 0;
  auto run = [&](int64_t pause_ms) { return strategy->run("input_linear_step", Element{{input.arg(), Tensor::scalar<int64_t>(pause_ms)}, {}}); };
  for (int s = 0; s < 4; ++s) {
    auto step = run(0);
    REQUIRE(step.ok());
    CHECK(step->examples == std::vector<int64_t>{4, 3, 3});
    count_ids(*step, seen);
    ++committed;
  }
  // Worker 2 dies while the step computes, before any replica applied it.
  auto slow = std::async(std::launch::async, [&]() { return run(1500); });
  std::this_thread::sleep_for(600ms);
  r.workers[2]->kill_now();
  auto failed = slow.get();
  INFO(failed.status().to_string());
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == StatusCode::kUnavailable);
  // The survivors read the failed step's positions again, five each.
  auto retried = run(0);
  REQUIRE(retried.ok());
  CHECK(retried->examples == std::vector<int64_t>{5, 5});
  CHECK(retried->input_position == 5 * kInputBatch);
  count_ids(*retried, seen);
  ++committed;
  for (int s = 0; s < 3; ++s) {
    auto step = run(0);
    REQUIRE(step.ok());
    count_ids(*step, seen);
    ++committed;
    // A step that reads no input between them takes none of it.
    auto evaluation = strategy->run("mirrored_step");
    REQUIRE(evaluation.ok());
    CHECK(evaluation->examples.empty());
    CHECK(evaluation->input_position == step->input_position);
  }
  // Worker 2 comes back holding nothing, not even an input position.
  r.workers[2] = &r.add_worker(2);
  REQUIRE(wait_until([&]() { return r.client->num_workers() == 3; }, 15s));
  while (committed < 3 * kInputExamples / kInputBatch) {
    auto step = run(0);
    REQUIRE(step.ok());
    CHECK(step->examples.size() == 3);
    count_ids(*step, seen);
    ++committed;
  }
  REQUIRE(strategy->verify_replicas().ok());
  // The coordinator's metrics say the same: the examples committed, the
  // failed step, and how many replicas the last step had.
  CHECK(metric(*r.coordinator, "capstan_coordinator_step_examples_total") == committed * kInputBatch);
  CHECK(metric(*r.coordinator, "capstan_coordinator_steps_failed_total") == 1);
  CHECK(metric(*r.coordinator, "capstan_coordinator_step_replicas") == 3);
  // Three epochs, each every example exactly once.
  REQUIRE(seen.size() == 3);
  for (const auto& [epoch, ids] : seen) {
    INFO("epoch " << epoch);
    CHECK(ids.size() == static_cast<size_t>(kInputExamples));
    for (const auto& [id, times] : ids) CHECK(times == 1);
  }
  // Constant global batch: the same optimizer steps one worker takes with
  // the whole batch, through 3, 2 and 3 replicas of uneven shares.
  auto w = values(strategy->read_variable("w").value());
  auto b = values(strategy->read_variable("b").value());
  auto [w1, b1] = train_input_alone(committed);
  INFO("3/2/3 replicas: w " << w[0] << " " << w[1] << " b " << b[0] << "; 1 replica: w " << w1[0] << " " << w1[1]
                            << " b " << b1[0]);
  for (size_t i = 0; i < 2; ++i) CHECK(std::abs(w[i] - w1[i]) < 1e-5);
  CHECK(std::abs(b[0] - b1[0]) < 1e-5);
  CHECK(std::abs(w[0] - 3) < 1.0);  // it learned
}

TEST_CASE("a step input with per-replica batches grows the step with the replicas, and bad options are refused",
          "[strategy][input]") {
  Replicated r(2);
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::sgd(0.1)), options(2)).value();
  StepInputOptions both;
  both.global_batch = 8;
  both.per_replica_batch = 4;
  auto refused = strategy->distribute_step_input(data::Dataset::range(20), both);
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("exactly one of global_batch"));
  StepInputOptions each;
  each.per_replica_batch = 3;
  each.shuffle = false;
  auto input = strategy->distribute_step_input(data::Dataset::range(20), each).value();
  auto step = strategy->run("input_linear_step", Element{{input.arg()}, {}});
  REQUIRE(step.ok());
  CHECK(step->examples == std::vector<int64_t>{3, 3});
  CHECK(step->input_position == 6);
  // Without shuffle: the dataset's order, replica 0 first.
  auto ids = step->values[0].components.at(1).flat<int64_t>();
  CHECK(std::vector<int64_t>(ids.begin(), ids.end()) == std::vector<int64_t>{0, 1, 2});
}

TEST_CASE("the step input survives kill -9 of the coordinator: the next steps read on from the replicas' position",
          "[strategy][fault][durable][input]") {
  DurableReplicated durable(2);
  Replicated& r = durable.r;
  auto strategy = MirroredStrategy::create(*r.client, linear_model(Optimizer::sgd(0.1)), options(2)).value();
  auto input = strategy->distribute_step_input(data::Dataset::range(kInputExamples), input_options()).value();
  std::map<int64_t, std::map<int64_t, int>> seen;
  const Element args{{input.arg()}, {}};
  for (int s = 0; s < 4; ++s) {
    auto step = strategy->run("input_linear_step", args);
    REQUIRE(step.ok());
    count_ids(*step, seen);
  }
  r.coordinator->kill_now();
  durable.restart_coordinator();
  REQUIRE(wait_until([&]() { return r.client->num_workers() == 2; }, 20s));
  int64_t position = 4 * kInputBatch;
  while (position < 2 * kInputExamples) {
    auto step = strategy->run("input_linear_step", args);
    INFO(step.status().to_string());
    REQUIRE(step.ok());
    // The replicas' position, not a fresh input: the restarted coordinator
    // knew the input from its journal and the position from the group.
    CHECK(step->input_position == position + kInputBatch);
    position = step->input_position;
    count_ids(*step, seen);
  }
  REQUIRE(seen.size() == 2);
  for (const auto& [epoch, ids] : seen) {
    INFO("epoch " << epoch);
    CHECK(ids.size() == static_cast<size_t>(kInputExamples));
    for (const auto& [id, times] : ids) CHECK(times == 1);
  }
}

}  // namespace
}  // namespace capstan::testing
