// Parameter-server recovery and the checkpoint policy (ps_recovery.h, checkpoint_policy.h), over
// fake workers and parameter servers.
#include <catch2/catch.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "capstan/data/dataset.h"
#include "checkpoint/checkpoint.h"
#include "daemons/coordinator/coordinator.h"
#include "daemons/coordinator/test_fakes.h"
#include "data/test_util.h"

namespace capstan::coordinator {
namespace {

using testing::Harness;
using testing::WorkerRecord;

using testing::floats;
using testing::values_of;

VariableRequest partitioned(std::string name, Tensor initial, int shards) {
  VariableRequest request;
  request.name = std::move(name);
  request.initial = std::move(initial);
  request.optimizer = Optimizer::adagrad(0.1);
  request.partitioner = placement::Partitioner::fixed_shards(shards);
  return request;
}

// A config that saves checkpoints in `dir` (or keeps its journal there).
CoordinatorConfig checkpoints_in(const io::testing::TempDir& dir) {
  CoordinatorConfig config;
  config.checkpoint_dir = dir.path();
  return config;
}
CoordinatorConfig journal_in(const io::testing::TempDir& dir) {
  CoordinatorConfig config;
  config.work_dir = dir.path();
  return config;
}

// A coordinator that has replayed the journal in its config's work_dir.
struct Journaled : Harness {
  explicit Journaled(const CoordinatorConfig& config, int num_ps = 1) : Harness(config, num_ps) { open(); }
  // With a first worker (running "train_step"), `worker`, which must
  // outlive this.
  Journaled(const CoordinatorConfig& config, WorkerRecord& worker) : Harness(config) {
    open();
    add_worker(worker);
  }
  void open() { REQUIRE(coordinator->open_journal().ok()); }
};

// Checkpoint reads and writes run on the pool: polls the loop until `done`
// (or 10 s pass).
template <typename Done>
bool settle_until(Harness& h, Done done) {
  for (int i = 0; i < 1000; ++i) {
    h.settle();
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Waits until the closure records so far are in the journal; its status.
Status sync_journal(Harness& h) {
  auto synced = h.coordinator->journal_synced();
  REQUIRE(settle_until(h, [&]() { return synced.poll(h.io.waitScope); }));
  return synced.wait(h.io.waitScope);
}

// The steps of the checkpoints in `dir`, oldest first.
std::vector<int64_t> steps_in(const std::string& dir) {
  std::vector<int64_t> steps;
  std::vector<std::string> paths = checkpoint::list_checkpoints(dir).value();
  for (const auto& path : paths) {
    steps.push_back(checkpoint::checkpoint_step(std::filesystem::path(path).filename().string()).value());
  }
  return steps;
}

// A cluster of 2 fake PS with "w" (4 rows, 2 shards) checkpointed at step 7
// with values 1..4 and an accumulator, then trained on.
struct Trained {
  explicit Trained(CoordinatorConfig config = {}, bool save = true) : h(std::move(config), /*num_ps=*/2) {
    h.add_worker(worker);
    h.create_variable(partitioned("w", floats({1, 2, 3, 4}, {4}), 2));
    h.ps.tasks[0].shards.at("w/part_0").slots["accumulator"] = floats({5, 6}, {2});
    h.ps.tasks[1].shards.at("w/part_1").slots["accumulator"] = floats({7, 8}, {2});
    h.ps.tasks[0].shards.at("w/part_0").step = 7;
    h.ps.tasks[1].shards.at("w/part_1").step = 7;
    if (save) checkpoint = h.coordinator->save_checkpoint(dir.path(), 7, 3).wait(h.io.waitScope).value();
    // Training moves on.
    h.ps.tasks[0].shards.at("w/part_0").value = floats({10, 20}, {2});
    h.ps.tasks[1].shards.at("w/part_1").value = floats({30, 40}, {2});
  }

  data::testing::TempDir dir;
  WorkerRecord worker;
  Harness h;
  std::string checkpoint;
};

}  // namespace

TEST_CASE("a parameter server that restarts empty gets its shards back from the last checkpoint by itself",
          "[coordinator][recovery]") {
  Trained t;
  Harness& h = t.h;
  h.coordinator->schedule("train_step", "1").value();
  h.settle();
  REQUIRE(t.worker.runs.size() == 1);

  h.ps.restart_empty(1);
  h.settle();
  // The program pauses: join waits instead of failing.
  auto joined = h.coordinator->join();
  REQUIRE(settle_until(h, [&]() { return h.coordinator->ps_recoveries() == 1; }));
  CHECK_FALSE(joined.poll(h.io.waitScope));

  // Only the lost shard went back to the checkpoint, with its slots and step.
  const ShardContents& restored = h.ps.tasks[1].shards.at("w/part_1");
  CHECK(values_of(restored.value) == std::vector<float>{3, 4});
  CHECK(values_of(restored.slots.at("accumulator")) == std::vector<float>{7, 8});
  CHECK(restored.step == 7);
  CHECK(h.ps.tasks[1].optimizers.at("w/part_1").kind == Optimizer::Kind::kAdagrad);
  // The server read it from the checkpoint itself; the other kept its own.
  CHECK(h.ps.tasks[1].restored == std::vector<std::string>{"w/part_1"});
  CHECK(h.ps.tasks[0].restored.empty());
  CHECK(values_of(h.ps.tasks[0].shards.at("w/part_0").value) == std::vector<float>{10, 20});

  // The run that hit the empty server failed because of it: it runs again.
  t.worker.reply(0, Status::NotFound("no variable 'w/part_1' on this parameter server"));
  h.settle();
  REQUIRE(t.worker.runs.size() == 2);
  CHECK(t.worker.runs[1].run.args == "1");
  CHECK(t.worker.runs[1].run.attempt == 2);
  t.worker.reply(1, std::string("v"));
  h.settle();
  REQUIRE(joined.poll(h.io.waitScope));
  CHECK(joined.wait(h.io.waitScope).ok());
  CHECK(h.fetched(1).value() == "v");
}

TEST_CASE("a parameter server back with its shards (an outage, not a restart) is not restored",
          "[coordinator][recovery]") {
  Trained t;
  Harness& h = t.h;
  h.ps.go_down(1);
  h.settle();
  CHECK_FALSE(h.coordinator->done().value());  // paused, not failed
  CHECK(h.coordinator->schedule("train_step", "1").ok());
  h.ps.come_up(1);
  h.settle();
  CHECK(h.coordinator->ps_recoveries() == 0);
  CHECK(values_of(h.ps.tasks[1].shards.at("w/part_1").value) == std::vector<float>{30, 40});
  REQUIRE(t.worker.runs.size() == 1);  // dispatch resumed
}

TEST_CASE("while a recoverable parameter server is down, join and fetch wait up to ps_recovery_timeout",
          "[coordinator][recovery]") {
  CoordinatorConfig config;
  config.ps_recovery_timeout = std::chrono::milliseconds(2000);
  Trained t(config);
  Harness& h = t.h;
  int64_t id = h.coordinator->schedule("train_step", "1").value();
  h.settle();
  h.ps.go_down(1);
  h.settle();
  auto joined = h.coordinator->join();
  auto fetched = h.coordinator->fetch(id);
  h.advance(std::chrono::milliseconds(1500));
  CHECK_FALSE(joined.poll(h.io.waitScope));
  CHECK_FALSE(fetched.poll(h.io.waitScope));
  h.advance(std::chrono::milliseconds(700));
  Status late = joined.wait(h.io.waitScope);
  CHECK(late.code() == StatusCode::kUnavailable);
  CHECK_THAT(late.message(), Catch::Contains("ps:1") && Catch::Contains("unreachable"));
  CHECK(fetched.wait(h.io.waitScope).status().code() == StatusCode::kUnavailable);
  CHECK(h.coordinator->schedule("train_step", "2").status().code() == StatusCode::kUnavailable);
}

TEST_CASE("calls made before a parameter server is first reached wait for it, without a checkpoint",
          "[coordinator][recovery]") {
  // As after a coordinator's restart: its link to the parameter servers is
  // still being made when the program's calls arrive.
  WorkerRecord worker;
  Harness h(worker, {}, /*num_ps=*/2, /*ps_up=*/false);
  h.ps.come_up(0);
  h.settle();
  auto created = h.coordinator->create_variable(partitioned("w", floats({1, 2, 3, 4}, {4}), 2));
  REQUIRE(h.coordinator->schedule("train_step", "1").ok());
  auto joined = h.coordinator->join();
  h.advance(std::chrono::milliseconds(3000));
  CHECK_FALSE(created.poll(h.io.waitScope));
  CHECK_FALSE(joined.poll(h.io.waitScope));
  CHECK(worker.runs.empty());

  h.ps.come_up(1);
  h.settle();
  REQUIRE(created.wait(h.io.waitScope).ok());
  CHECK(h.ps.tasks[1].shards.count("w/part_1") == 1);
  REQUIRE(worker.runs.size() == 1);
  worker.reply(0, std::string("v"));
  CHECK(joined.wait(h.io.waitScope).ok());
}

TEST_CASE("a parameter server never reached fails calls after the first-contact window, saying so",
          "[coordinator][recovery]") {
  Harness h({}, /*num_ps=*/1, /*ps_up=*/false);
  auto joined = h.coordinator->join();
  auto created = h.coordinator->create_variable(partitioned("w", floats({1, 2}, {2}), 1));
  h.advance(Coordinator::kFirstContactWindow - std::chrono::milliseconds(500));
  CHECK_FALSE(joined.poll(h.io.waitScope));
  CHECK_FALSE(created.poll(h.io.waitScope));
  h.advance(std::chrono::milliseconds(700));
  Status late = joined.wait(h.io.waitScope);
  CHECK(late.code() == StatusCode::kUnavailable);
  CHECK_THAT(late.message(), Catch::Contains("ps:0 at ps0:7000") && Catch::Contains("not reached since the "
                                                                                      "coordinator started"));
  CHECK(created.wait(h.io.waitScope).status().code() == StatusCode::kUnavailable);
  // From then on, at once.
  CHECK(h.coordinator->schedule("train_step", "1").status().code() == StatusCode::kUnavailable);
  CHECK(h.joined().code() == StatusCode::kUnavailable);
}

TEST_CASE("without a checkpoint, a parameter server back empty fails calls with DataLoss saying so until a "
          "restore by hand",
          "[coordinator][recovery]") {
  Trained t({}, /*save=*/false);
  Harness& h = t.h;
  // Without a checkpoint an outage is not waited through: Unavailable at once.
  h.ps.go_down(1);
  h.settle();
  CHECK(h.joined().code() == StatusCode::kUnavailable);
  h.ps.tasks[1].shards.clear();
  h.ps.come_up(1);
  h.settle();

  Status joined = h.joined();
  CHECK(joined.code() == StatusCode::kDataLoss);
  CHECK_THAT(joined.message(), Catch::Contains("ps:1") && Catch::Contains("w/part_1") &&
                                   Catch::Contains("no checkpoint") && Catch::Contains("checkpoint_dir"));
  CHECK(h.coordinator->schedule("train_step", "1").status().code() == StatusCode::kDataLoss);
  h.settle();
  CHECK(t.worker.runs.empty());  // nothing dispatched against a server without its shards

  // A checkpoint from elsewhere (an earlier run), restored by hand.
  data::testing::TempDir other;
  VariableState w;
  w.name = "w";
  w.dtype = DType::kFloat32;
  w.shape = {4};
  w.optimizer = Optimizer::adagrad(0.1);
  w.shards.push_back({{"w/part_0", 0, 0, 2}, floats({1, 2}, {2}), {}, 3, {}, 0});
  w.shards.push_back({{"w/part_1", 1, 2, 2}, floats({3, 4}, {2}), {}, 3, {}, 0});
  REQUIRE(write_checkpoint(other.path(), 3, 3, {w}).ok());
  REQUIRE(h.coordinator->restore_checkpoint(other.path()).wait(h.io.waitScope).ok());
  // Each server read its shard itself (the one back empty creating it).
  CHECK(h.ps.tasks[1].restored == std::vector<std::string>{"w/part_1"});
  CHECK(h.ps.tasks[0].restored == std::vector<std::string>{"w/part_0"});
  CHECK(values_of(h.ps.tasks[1].shards.at("w/part_1").value) == std::vector<float>{3, 4});
  CHECK(values_of(h.ps.tasks[0].shards.at("w/part_0").value) == std::vector<float>{1, 2});
  CHECK(h.joined().ok());
  h.coordinator->schedule("train_step", "2").value();
  h.settle();
  REQUIRE(t.worker.runs.size() == 1);
  CHECK(t.worker.runs[0].run.args == "2");
}

TEST_CASE("with ps_recovery off, a parameter server back empty waits for a restore by hand", "[coordinator][recovery]") {
  CoordinatorConfig config;
  config.ps_recovery = false;
  Trained t(config);
  Harness& h = t.h;
  h.ps.restart_empty(1);
  h.settle();
  Status joined = h.joined();
  CHECK(joined.code() == StatusCode::kDataLoss);
  CHECK_THAT(joined.message(), Catch::Contains("ps_recovery is off"));
  CHECK(h.coordinator->ps_recoveries() == 0);

  auto restored = h.coordinator->restore_checkpoint(t.checkpoint).wait(h.io.waitScope);
  REQUIRE(restored.ok());
  CHECK(restored->step == 7);
  CHECK(values_of(h.ps.tasks[1].shards.at("w/part_1").value) == std::vector<float>{3, 4});
  CHECK(h.ps.tasks[1].shards.at("w/part_1").step == 7);
  CHECK(h.joined().ok());
}

TEST_CASE("a checkpoint that lacks a lost shard's variable cannot recover it: DataLoss naming both",
          "[coordinator][recovery]") {
  Trained t;
  Harness& h = t.h;
  h.create_variable(partitioned("later", floats({1, 2}, {2}), 2));
  h.ps.restart_empty(1);
  REQUIRE(settle_until(h, [&]() { return h.coordinator->done().status().code() == StatusCode::kDataLoss; }));
  Status status = h.coordinator->done().status();
  CHECK_THAT(status.message(), Catch::Contains("ps:1") && Catch::Contains("'later'") &&
                                   Catch::Contains("restore a checkpoint by hand"));
}

TEST_CASE("the checkpoint policy saves every N closures completed, a restarted coordinator goes on from the "
          "newest step",
          "[coordinator][recovery]") {
  data::testing::TempDir dir;
  CoordinatorConfig config = checkpoints_in(dir);
  config.checkpoint_every_steps = 2;
  config.checkpoint_max_to_keep = 5;
  auto run_closures = [](Harness& h, WorkerRecord& worker, int n) {
    for (int i = 0; i < n; ++i) {
      h.coordinator->schedule("train_step", std::to_string(i)).value();
      h.settle();
      h.answer(worker, worker.runs.size() - 1, std::string("v"));
    }
  };
  auto steps_saved = [&dir]() { return steps_in(dir.path()); };
  {
    WorkerRecord worker;
    Harness h(worker, config);
    h.create_variable(partitioned("w", floats({1, 2}, {2}), 1));
    run_closures(h, worker, 1);
    REQUIRE(settle_until(h, [&]() { return steps_saved().empty(); }));
    run_closures(h, worker, 1);
    REQUIRE(settle_until(h, [&]() { return steps_saved() == std::vector<int64_t>{2}; }));
    run_closures(h, worker, 2);
    REQUIRE(settle_until(h, [&]() { return steps_saved() == std::vector<int64_t>{2, 4}; }));
    // Once the save's reply is in, it is the one a lost PS is restored from.
    CHECK(settle_until(h, [&]() {
      return h.coordinator->last_checkpoint() == checkpoint::latest_checkpoint(dir.path()).value();
    }));
  }
  WorkerRecord worker;
  Harness h(worker, config);
  h.create_variable(partitioned("w", floats({1, 2}, {2}), 1));
  run_closures(h, worker, 2);
  CHECK(settle_until(h, [&]() { return steps_saved() == std::vector<int64_t>{2, 4, 6}; }));
}

TEST_CASE("checkpoint_every_seconds saves when closures completed since the last one", "[coordinator][recovery]") {
  data::testing::TempDir dir;
  CoordinatorConfig config = checkpoints_in(dir);
  config.checkpoint_every_seconds = std::chrono::seconds(10);
  WorkerRecord worker;
  Harness h(worker, config);
  h.create_variable(partitioned("w", floats({1, 2}, {2}), 1));
  auto saved = [&dir]() { return checkpoint::list_checkpoints(dir.path()).value().size(); };
  h.advance(std::chrono::milliseconds(10100));
  h.settle();
  CHECK(saved() == 0);  // nothing ran: nothing to save
  h.coordinator->schedule("train_step", "1").value();
  h.settle();
  worker.reply(0, std::string("v"));
  h.advance(std::chrono::milliseconds(10000));
  REQUIRE(settle_until(h, [&]() { return saved() == 1; }));
  h.advance(std::chrono::milliseconds(10000));
  h.settle();
  CHECK(saved() == 1);
}


// ---- Preemption -------------------------------------------------------------------------------

TEST_CASE("a leaving worker finishes its running closures, gets no more, and is then no longer counted",
          "[coordinator][preemption]") {
  data::testing::TempDir dir;
  CoordinatorConfig config = checkpoints_in(dir);
  WorkerRecord a, b;
  Harness h(config);
  int64_t id_a = h.add_worker(a);
  h.create_variable(partitioned("w", floats({1, 2}, {2}), 1));
  h.schedule_steps(3);
  REQUIRE(a.runs.size() == 1);

  auto left = h.coordinator->leave_worker(id_a, "SIGTERM");
  h.settle();
  CHECK_FALSE(left.poll(h.io.waitScope));  // its closure still runs
  a.reply(0, std::string("v0"));
  REQUIRE(settle_until(h, [&]() { return left.poll(h.io.waitScope); }));
  CHECK(left.wait(h.io.waitScope).ok());
  CHECK(a.runs.size() == 1);  // nothing more was sent to it
  CHECK_FALSE(h.coordinator->worker_alive(id_a));
  CHECK(h.fetched(1).value() == "v0");
  // The checkpoint taken on its way out, after its closure finished.
  auto saved = checkpoint::list_checkpoints(dir.path()).value();
  REQUIRE(saved.size() == 1);
  CHECK(checkpoint::CheckpointReader::open(saved[0]).value()->manifest().step == 1);

  // The queued closures go to the workers that stay.
  h.add_worker(b);
  h.settle();
  REQUIRE(b.runs.size() == 1);
  CHECK(b.runs[0].run.args == "1");
  CHECK(b.runs[0].run.attempt == 1);

  auto unknown = h.coordinator->leave_worker(12345, "SIGTERM").wait(h.io.waitScope);
  CHECK(unknown.code() == StatusCode::kNotFound);
  CHECK_THAT(unknown.message(), Catch::Contains("12345"));
}

TEST_CASE("a draining coordinator lets running closures finish, refuses new ones and checkpoints",
          "[coordinator][preemption]") {
  data::testing::TempDir dir;
  CoordinatorConfig config = checkpoints_in(dir);
  config.closures_per_worker = 2;
  WorkerRecord a;
  Harness h(a, config);
  h.create_variable(partitioned("w", floats({1, 2}, {2}), 1));
  h.schedule_steps(4);
  REQUIRE(a.runs.size() == 2);

  auto drained = h.coordinator->drain("SIGTERM");
  h.settle();
  CHECK(h.coordinator->schedule("train_step", "late").status().code() == StatusCode::kUnavailable);
  h.answer(a, 0, std::string("v0"));
  CHECK(a.runs.size() == 2);  // no new dispatch
  CHECK_FALSE(drained.poll(h.io.waitScope));
  a.reply(1, std::string("v1"));
  REQUIRE(settle_until(h, [&]() { return drained.poll(h.io.waitScope); }));
  drained.wait(h.io.waitScope);
  auto saved = checkpoint::list_checkpoints(dir.path()).value();
  REQUIRE(saved.size() == 1);
  CHECK(checkpoint::CheckpointReader::open(saved[0]).value()->manifest().step == 2);
}


// ---- The journal (work_dir) -------------------------------------------------------------------

TEST_CASE("a coordinator restarted with its work_dir knows its variables, datasets and last checkpoint again",
          "[coordinator][durable]") {
  data::testing::TempDir work, checkpoints;
  CoordinatorConfig config;
  config.work_dir = work.path();
  const std::string definition = data::Dataset::range(10).serialize();
  std::string saved;
  int64_t dataset = 0;
  Placements before;
  {
    WorkerRecord a;
    Journaled h(config, /*num_ps=*/2);
    h.add_worker(a);
    h.create_variable(partitioned("w", floats({1, 2, 3, 4}, {4}), 2));
    h.create_variable(partitioned("b", floats({1}, {1}), 1));
    dataset = h.coordinator->create_per_worker_dataset(definition, "train").wait(h.io.waitScope).value();
    saved = h.coordinator->save_checkpoint(checkpoints.path(), 5, 3).wait(h.io.waitScope).value();
    before = h.coordinator->placements();
  }
  WorkerRecord a;
  Journaled h(config, /*num_ps=*/2);
  Placements after = h.coordinator->placements();
  CHECK(after.version == before.version);
  REQUIRE(after.variables.size() == 2);
  for (size_t v = 0; v < 2; ++v) {
    CHECK(after.variables[v].name == before.variables[v].name);
    CHECK(after.variables[v].shape == before.variables[v].shape);
    REQUIRE(after.variables[v].shards.size() == before.variables[v].shards.size());
    for (size_t s = 0; s < after.variables[v].shards.size(); ++s) {
      CHECK(after.variables[v].shards[s].name == before.variables[v].shards[s].name);
      CHECK(after.variables[v].shards[s].ps_task == before.variables[v].shards[s].ps_task);
      CHECK(after.variables[v].shards[s].rows == before.variables[v].shards[s].rows);
    }
  }
  CHECK(h.coordinator->last_checkpoint() == saved);
  // Workers registering with it get the datasets under their old ids.
  h.add_worker(a);
  REQUIRE(a.datasets.size() == 1);
  CHECK(a.datasets[0].first == dataset);
  CHECK(h.coordinator->create_per_worker_dataset(definition, "train").wait(h.io.waitScope).value() == dataset);
  CHECK(h.coordinator->create_per_worker_dataset(definition).wait(h.io.waitScope).value() == dataset + 1);
  // The round robin goes on: w/part_0 on 0, w/part_1 on 1, b on 0; next on 1.
  auto next = h.create_variable(partitioned("c", floats({1}, {1}), 1));
  CHECK(next.shards.at(0).ps_task == 1);
  // A program creating a variable again finds it.
  CHECK(h.coordinator->create_variable(partitioned("w", floats({0, 0, 0, 0}, {4}), 2)).wait(h.io.waitScope).ok());
  CHECK(h.coordinator->create_variable(partitioned("w", floats({0, 0}, {2}), 2)).wait(h.io.waitScope).status().code() ==
        StatusCode::kAlreadyExists);
}

TEST_CASE("a restarted coordinator knows how its variables were filled: initializer journaled, a value awaited",
          "[coordinator][durable]") {
  data::testing::TempDir work;
  CoordinatorConfig config;
  config.work_dir = work.path();
  VariableRequest made = partitioned("w", Tensor(), 2);
  made.initializer = Initializer::glorot_normal(5);
  made.dtype = DType::kFloat32;
  made.shape = {8, 3};
  VariableRequest given = partitioned("v", Tensor(), 2);
  given.value_from_program = true;
  given.dtype = DType::kFloat32;
  given.shape = {4};
  VariableRequest written = given;
  written.name = "u";
  {
    Journaled h(config, /*num_ps=*/2);
    h.create_variable(made);
    h.create_variable(given);
    h.create_variable(written);
    REQUIRE(h.coordinator->variable_written("u").ok());
  }
  Journaled h(config, /*num_ps=*/2);
  CHECK(h.coordinator->awaiting_value("v"));  // the program had not written it: asked again
  CHECK_FALSE(h.coordinator->awaiting_value("u"));
  CHECK_FALSE(h.coordinator->awaiting_value("w"));
  REQUIRE(h.coordinator->placements().variables.size() == 3);
  // The fakes' shards outlive nothing here: the journal alone says how "w" was made.
  auto again = h.coordinator->create_variable(made).wait(h.io.waitScope);
  REQUIRE(again.ok());
  CHECK(again->shards.size() == 2);
}

TEST_CASE("a coordinator restarted with its work_dir keeps its queue, values and errors, retried schedules run once",
          "[coordinator][durable]") {
  data::testing::TempDir work;
  CoordinatorConfig config = journal_in(work);
  const uint64_t client = 77;
  {
    WorkerRecord a;
    Journaled h(config, a);
    for (int64_t seq = 1; seq <= 4; ++seq) {
      CHECK(h.coordinator->schedule("train_step", "args" + std::to_string(seq), client, seq).value() == seq);
    }
    // A retry of a request seen before: the same closure, nothing queued.
    CHECK(h.coordinator->schedule("train_step", "args2", client, 2).value() == 2);
    h.settle();
    REQUIRE(a.runs.size() == 1);
    h.answer(a, 0, std::string("v1"));
    REQUIRE(a.runs.size() == 2);  // closure 2 runs when the coordinator dies
    CHECK(sync_journal(h).ok());
  }
  {
    WorkerRecord b;
    Journaled h(config);
    CHECK(h.fetched(1).value() == "v1");
    // The retry of a schedule whose answer was lost with the old process.
    CHECK(h.coordinator->schedule("train_step", "args3", client, 3).value() == 3);
    CHECK(h.coordinator->schedule("train_step", "args5", client, 5).value() == 5);
    h.add_worker(b);
    h.settle();
    REQUIRE(b.runs.size() == 1);
    CHECK(b.runs[0].run.closure_id == 2);  // the run lost with the old coordinator, first
    CHECK(b.runs[0].run.args == "args2");
    h.answer(b, 0, Status::InvalidArgument("bad batch"));
    // The error is pending: join raises it once.
    CHECK(h.joined().code() == StatusCode::kInvalidArgument);
    (void)sync_journal(h);
  }
  WorkerRecord c;
  Journaled h(config);
  // Raised once, before the restart: not again. The closures queued when it
  // happened were cancelled, as TF does.
  CHECK(h.joined().ok());
  CHECK(h.fetched(2).status().code() == StatusCode::kInvalidArgument);
  CHECK(h.fetched(4).status().code() == StatusCode::kCancelled);
  CHECK(h.fetched(1).value() == "v1");
  REQUIRE(h.coordinator->release({1}).ok());
  (void)sync_journal(h);
  CHECK(h.fetched(1).status().code() == StatusCode::kNotFound);
  CHECK(h.coordinator->schedule("train_step", "new", client, 6).value() == 6);
}

TEST_CASE("a journal past journal_compact_records is rewritten as a snapshot with the same state",
          "[coordinator][durable]") {
  data::testing::TempDir work;
  CoordinatorConfig config = journal_in(work);
  config.journal_compact_records = 20;
  const uint64_t client = 5;
  {
    WorkerRecord a;
    Journaled h(config, a);
    h.create_variable(partitioned("w", floats({1, 2}, {2}), 1));
    for (int64_t seq = 1; seq <= 30; ++seq) h.coordinator->schedule("train_step", "a", client, seq).value();
    for (size_t run = 0; run < 20; ++run) {
      h.settle();
      REQUIRE(a.runs.size() == run + 1);
      a.reply(run, "v" + std::to_string(a.runs[run].run.closure_id));
    }
    for (int64_t id = 1; id <= 15; ++id) REQUIRE(h.coordinator->release({id}).ok());
    REQUIRE(sync_journal(h).ok());
  }
  // Compacted (more than once): CURRENT names the one journal left.
  std::string current = data::testing::read_bytes(work.file("CURRENT"));
  CHECK_THAT(current, Catch::StartsWith("journal-"));
  int journals = 0;
  for (const auto& entry : std::filesystem::directory_iterator(work.path())) {
    std::string name = entry.path().filename().string();
    CHECK_FALSE(entry.path().extension() == ".log");  // no segment of the first journal left
    if (name.rfind("journal-", 0) == 0) ++journals;
  }
  CHECK(journals == 1);

  WorkerRecord b;
  Journaled h(config);
  CHECK(h.coordinator->placements().variables.size() == 1);
  CHECK(h.fetched(16).value() == "v16");
  CHECK(h.fetched(20).value() == "v20");
  CHECK(h.fetched(3).status().code() == StatusCode::kNotFound);  // released
  CHECK(h.coordinator->schedule("train_step", "a", client, 22).value() == 22);  // a retry
  CHECK(h.coordinator->schedule("train_step", "a", client, 31).value() == 31);
  h.add_worker(b);
  h.settle();
  REQUIRE(b.runs.size() == 1);
  CHECK(b.runs[0].run.closure_id == 21);
}

TEST_CASE("released values stay released across restarts, replayed and compacted, one released as it ran is not "
          "run again",
          "[coordinator][durable][release]") {
  data::testing::TempDir work;
  CoordinatorConfig config = journal_in(work);
  const uint64_t client = 7;
  {
    WorkerRecord a;
    Journaled h(config, a);
    for (int64_t seq = 1; seq <= 4; ++seq) h.coordinator->schedule("train_step", "a", client, seq).value();
    h.settle();
    h.answer(a, 0, std::string("v1"));
    REQUIRE(a.runs.size() == 2);
    REQUIRE(h.coordinator->release({1, 2 + 1}, client).ok());  // 1 done, 3 queued
    h.answer(a, 1, std::string("v2"));
    REQUIRE(a.runs.size() == 3);
    CHECK(a.runs[2].run.closure_id == 3);
    a.reply(2, std::string("v3"));  // released: dropped as it ends
    h.settle();
    REQUIRE(a.runs.size() == 4);
    REQUIRE(h.coordinator->release({4}, client).ok());  // released while it runs; the coordinator dies first
    REQUIRE(sync_journal(h).ok());
  }
  auto check_state = [&](Harness& h, WorkerRecord& worker) {
    CHECK(h.coordinator->incarnation() == 0);  // durable: its ids outlive restarts
    for (int64_t gone : {1, 3, 4}) {
      Status fetched = h.fetched(gone).status();
      CHECK(fetched.code() == StatusCode::kNotFound);
      CHECK_THAT(fetched.message(), Catch::Contains("released"));
    }
    CHECK(h.fetched(2).value() == "v2");
    // Closure 4 had not finished: it runs again (at-least-once), and its
    // value is not kept. Closure 3 finished: it does not run again.
    h.add_worker(worker);
    h.settle();
    REQUIRE(worker.runs.size() == 1);
    CHECK(worker.runs[0].run.closure_id == 4);
  };
  {
    // Replayed record by record.
    WorkerRecord b;
    Journaled h(config);
    check_state(h, b);
  }
  // Compacted at the start (the journal is past the limit and holds more
  // than twice what is kept): the snapshot keeps closure 2, and 4 as
  // released; nothing of 1 and 3.
  config.journal_compact_records = 4;
  {
    WorkerRecord c;
    Journaled h(config);
    CHECK(std::filesystem::exists(work.file("CURRENT")));
    check_state(h, c);
  }
  {
    WorkerRecord d;
    Journaled h(config);
    check_state(h, d);
    h.answer(d, 0, std::string("v4"));
    CHECK(h.fetched(4).status().code() == StatusCode::kNotFound);
    REQUIRE(h.coordinator->release({2}, client).ok());
    REQUIRE(sync_journal(h).ok());
  }
  // Everything released and finished: the compacted journal keeps no closure.
  Journaled h(config);
  CHECK(h.fetched(2).status().code() == StatusCode::kNotFound);
  CHECK(h.coordinator->stats()->results_kept == 0);
  CHECK(h.coordinator->schedule("train_step", "a", client, 5).value() == 5);
}

TEST_CASE("a restarted coordinator gives each client of its journal client_grace from the restart to come back",
          "[coordinator][durable][release]") {
  data::testing::TempDir work;
  CoordinatorConfig config = journal_in(work);
  config.client_grace = std::chrono::milliseconds(2000);
  {
    WorkerRecord a;
    Journaled h(config, a);
    h.coordinator->schedule("train_step", "a", /*client_id=*/7, 1).value();
    h.coordinator->schedule("train_step", "b", /*client_id=*/8, 1).value();
    h.settle();
    h.answer(a, 0, std::string("v1"));
    h.answer(a, 1, std::string("v2"));
    REQUIRE(sync_journal(h).ok());
  }
  {
    Journaled h(config);
    h.advance(std::chrono::milliseconds(1500));
    // Client 7 reconnects and calls; client 8 never comes back.
    REQUIRE(h.coordinator->release({}, 7).ok());
    CHECK(h.fetched(2).value() == "v2");
    h.advance(std::chrono::milliseconds(1500));
    CHECK(h.fetched(1).value() == "v1");
    CHECK(h.fetched(2).status().code() == StatusCode::kNotFound);
    REQUIRE(sync_journal(h).ok());
  }
  // The release of client 8's value was journaled.
  Journaled again(config);
  CHECK(again.fetched(2).status().code() == StatusCode::kNotFound);
  CHECK(again.fetched(1).value() == "v1");
}

TEST_CASE("a journal naming a parameter server this coordinator lacks stops it with the reason",
          "[coordinator][durable]") {
  data::testing::TempDir work;
  CoordinatorConfig config = journal_in(work);
  {
    Journaled h(config, /*num_ps=*/2);
    h.create_variable(partitioned("w", floats({1, 2, 3, 4}, {4}), 2));
  }
  Harness h(config, /*num_ps=*/1);
  Status opened = h.coordinator->open_journal();
  CHECK(opened.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(opened.message(), Catch::Contains("ps:1") && Catch::Contains("same ps list"));
}


TEST_CASE("a policy save that comes due while another runs happens when it ends, a leave waiting for it goes on",
          "[coordinator][preemption]") {
  data::testing::TempDir dir;
  CoordinatorConfig config = checkpoints_in(dir);
  config.checkpoint_every_steps = 1;
  config.closures_per_worker = 2;
  WorkerRecord a;
  Harness h(config);
  int64_t id = h.add_worker(a);
  h.create_variable(partitioned("w", floats({1, 2}, {2}), 1));
  // The pool (one thread) is held: the first save waits in it.
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  boost::asio::post(h.pool, [gate]() { gate.wait(); });
  h.coordinator->schedule("train_step", "1").value();
  h.coordinator->schedule("train_step", "2").value();
  h.settle();
  REQUIRE(a.runs.size() == 2);
  a.reply(0, std::string("v1"));
  h.settle();  // step 1 due: its save waits for the pool
  a.reply(1, std::string("v2"));
  h.settle();  // step 2 due while step 1's save runs
  auto left = h.coordinator->leave_worker(id, "SIGTERM");
  h.settle();
  release.set_value();
  auto steps = [&dir]() { return steps_in(dir.path()); };
  CHECK(settle_until(h, [&]() { return steps() == std::vector<int64_t>{1, 2}; }));
  // The leave waited for the policy's saves and found step 2 current.
  REQUIRE(settle_until(h, [&]() { return left.poll(h.io.waitScope); }));
  CHECK(left.wait(h.io.waitScope).ok());
  CHECK(steps() == std::vector<int64_t>{1, 2});
}

}  // namespace capstan::coordinator
