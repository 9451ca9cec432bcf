// The coordinator's synchronous training over fake workers: who forms the
// group, which member is the source of the state, what a step sends, and
// what happens when a member is lost.
#include "daemons/coordinator/strategies.h"

#include <catch2/catch.hpp>

#include <filesystem>

#include "capstan/data/dataset.h"
#include "daemons/coordinator/coordinator.h"
#include "daemons/coordinator/test_fakes.h"
#include "data/test_util.h"

namespace capstan::coordinator {
namespace {

using testing::Harness;
using testing::WorkerRecord;

std::vector<MirroredVariableInit> model() {
  return {{"w", Tensor::zeros(DType::kFloat32, {2}).value(), Optimizer::sgd(0.1)}};
}

// A worker's report of a replica it holds.
training::ReplicaReport holding(int64_t step, uint64_t checksum) {
  training::ReplicaReport report;
  report.holds = true;
  report.step = step;
  report.checksum = checksum;
  return report;
}

StrategyConfig config(int min_replicas = 1) {
  StrategyConfig c;
  c.min_replicas = min_replicas;
  c.settings.timeout = std::chrono::milliseconds(5000);
  return c;
}

// Starts a step; returns its promise (run the loop to make progress).
kj::Promise<Result<StepOutcome>> step(Harness& h, const std::string& args = "args") {
  return h.coordinator->run_step("s", "sync_step", args);
}

TEST_CASE("a strategy's first step forms the group by task index, seeds rank 0 and runs on every member",
          "[coordinator][strategy]") {
  WorkerRecord a, b;
  Harness h;
  // Registered out of task order: ranks follow task indexes.
  h.add_worker(b, {"sync_step"}, 1);
  h.add_worker(a, {"sync_step"}, 0);
  REQUIRE(h.coordinator->create_strategy("s", model(), config(2)).ok());
  auto running = step(h);
  h.settle();
  REQUIRE(a.forms.size() == 1);
  REQUIRE(b.forms.size() == 1);
  CHECK(a.forms[0].rank == 0);
  CHECK(b.forms[0].rank == 1);
  CHECK(a.forms[0].source == 0);
  CHECK(a.forms[0].seed.has_value());  // the initial values, to the source only
  CHECK_FALSE(b.forms[0].seed.has_value());
  CHECK(a.forms[0].addresses == std::vector<std::string>{"fake:1", "fake:1"});
  CHECK(a.forms[0].epoch == 1);
  REQUIRE(a.runs.size() == 1);
  REQUIRE(b.runs.size() == 1);
  CHECK(a.runs[0].run.strategy == "s");
  CHECK(a.runs[0].run.epoch == 1);
  CHECK(a.runs[0].run.num_workers == 2);
  a.reply(0, std::string("from a"));
  b.reply(0, std::string("from b"));
  auto outcome = running.wait(h.io.waitScope);
  REQUIRE(outcome.ok());
  CHECK(outcome->values == std::vector<std::string>{"from a", "from b"});
  CHECK(outcome->task_indexes == std::vector<int>{0, 1});
  CHECK(outcome->steps == 1);
  // The next step runs in the same group: no formation.
  auto second = step(h);
  h.settle();
  CHECK(a.forms.size() == 1);
  a.reply(1, std::string("a"));
  b.reply(1, std::string("b"));
  CHECK(second.wait(h.io.waitScope)->steps == 2);
}

TEST_CASE("a member lost mid-step: the others' group is aborted, the step fails naming it, the next re-forms",
          "[coordinator][strategy]") {
  WorkerRecord a, b, c;
  Harness h;
  h.add_worker(a, {"sync_step"}, 0);
  h.add_worker(b, {"sync_step"}, 1);
  int64_t id_c = h.add_worker(c, {"sync_step"}, 2);
  REQUIRE(h.coordinator->create_strategy("s", model(), config()).ok());
  auto first = step(h);
  h.settle();
  for (WorkerRecord* r : {&a, &b, &c}) r->reply(0, std::string("ok"));
  REQUIRE(first.wait(h.io.waitScope).ok());
  a.replica.step = b.replica.step = c.replica.step = 1;

  auto failing = step(h);
  h.settle();
  c.reply(1, Status::Unavailable("Peer disconnected"), /*worker_lost=*/true);
  h.settle();
  // The survivors are told at once, naming the lost worker.
  REQUIRE(a.aborts.size() == 1);
  REQUIRE(b.aborts.size() == 1);
  CHECK(a.aborts[0].first == 1);
  CHECK_THAT(a.aborts[0].second, Catch::Contains("worker " + std::to_string(id_c)));
  CHECK(c.aborts.empty());
  // Their closures fail because of it; one of them had applied the update.
  a.replica.step = 2;
  a.reply(1, Status::Unavailable("rank 0 gave up"));
  b.reply(1, Status::Unavailable("rank 1 gave up"));
  auto failed = failing.wait(h.io.waitScope);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(failed.status().message(), Catch::Contains("task 2") && Catch::Contains("lost"));
  CHECK_FALSE(h.coordinator->worker_alive(id_c));

  // The next step forms a group of two, from the survivor with fewer steps.
  auto next = step(h);
  h.settle();
  REQUIRE(a.forms.size() == 2);
  REQUIRE(b.forms.size() == 2);
  CHECK(a.forms[1].addresses.size() == 2);
  CHECK(a.forms[1].epoch == 2);
  CHECK(a.forms[1].source == 1);  // b, at step 1
  CHECK_FALSE(a.forms[1].seed.has_value());
  a.reply(2, std::string("a"));
  b.reply(2, std::string("b"));
  CHECK(next.wait(h.io.waitScope).ok());
}

TEST_CASE("a worker that comes back holding an old replica is not the source, with no survivor, a step says "
          "to restore a checkpoint",
          "[coordinator][strategy]") {
  WorkerRecord a, b, back;
  Harness h;
  h.add_worker(a, {"sync_step"}, 0);
  int64_t id_b = h.add_worker(b, {"sync_step"}, 1);
  REQUIRE(h.coordinator->create_strategy("s", model(), config()).ok());
  auto first = step(h);
  h.settle();
  a.reply(0, std::string("ok"));
  b.reply(0, std::string("ok"));
  REQUIRE(first.wait(h.io.waitScope).ok());
  a.replica.step = b.replica.step = 5;
  // A worker registers holding an older replica (it was stopped, dropped
  // and resumed): it joins, but the state comes from a, of the last group.
  back.replica.holds = true;
  back.replica.step = 2;
  h.add_worker(back, {"sync_step"}, 2);
  auto joined = step(h);
  h.settle();
  REQUIRE(back.forms.size() == 1);
  CHECK(back.forms[0].source == 0);
  for (WorkerRecord* r : {&a, &b, &back}) r->reply(r->runs.size() - 1, std::string("ok"));
  REQUIRE(joined.wait(h.io.waitScope).ok());

  // a and b are lost, and `back` lost its replica (it restarted): nobody
  // holds the state of the last group.
  a.link_broken = b.link_broken = true;
  back.replica.holds = false;
  auto lost = step(h);
  h.settle();
  back.reply(back.runs.size() - 1, Status::Unavailable("rank 2 gave up"));
  auto failed = lost.wait(h.io.waitScope);
  CHECK(failed.status().code() == StatusCode::kUnavailable);
  CHECK_FALSE(h.coordinator->worker_alive(id_b));
  auto stranded = step(h).wait(h.io.waitScope);
  CHECK(stranded.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(stranded.status().message(), Catch::Contains("restore a checkpoint"));
}

TEST_CASE("strategies refuse bad requests with the reason", "[coordinator][strategy]") {
  Harness h;
  CHECK(h.coordinator->create_strategy("", model(), config()).code() == StatusCode::kInvalidArgument);
  CHECK(h.coordinator->create_strategy("s", {}, config()).code() == StatusCode::kInvalidArgument);
  CHECK(h.coordinator->create_strategy("s", model(), config(0)).code() == StatusCode::kInvalidArgument);
  auto twice = model();
  twice.push_back(twice[0]);
  CHECK(h.coordinator->create_strategy("s", twice, config()).code() == StatusCode::kInvalidArgument);
  std::vector<MirroredVariableInit> ints = {{"n", Tensor::zeros(DType::kInt64, {2}).value(), Optimizer::sgd(0.1)}};
  CHECK(h.coordinator->create_strategy("s", ints, config()).code() == StatusCode::kInvalidArgument);
  std::vector<MirroredVariableInit> bad_lr = {{"w", Tensor::zeros(DType::kFloat32, {2}).value(), Optimizer::sgd(-1)}};
  CHECK(h.coordinator->create_strategy("s", bad_lr, config()).code() == StatusCode::kInvalidArgument);
  REQUIRE(h.coordinator->create_strategy("s", model(), config()).ok());
  CHECK(h.coordinator->create_strategy("s", model(), config()).ok());  // a reconnecting program
  std::vector<MirroredVariableInit> other = {{"w", Tensor::zeros(DType::kFloat32, {3}).value(), Optimizer::sgd(0.1)}};
  CHECK(h.coordinator->create_strategy("s", other, config()).code() == StatusCode::kAlreadyExists);
  CHECK(h.coordinator->create_strategy("t", model(), config()).code() == StatusCode::kAlreadyExists);  // "w" is s's
  CHECK(h.coordinator->run_step("nope", "f", "").wait(h.io.waitScope).status().code() == StatusCode::kNotFound);
  auto read = h.coordinator->read_mirrored("s", "nope").wait(h.io.waitScope);
  CHECK(read.status().code() == StatusCode::kNotFound);
  // Before any group formed the value is the initial one, held here.
  auto initial = h.coordinator->read_mirrored("s", "w").wait(h.io.waitScope);
  REQUIRE(initial.ok());
  CHECK(initial->first.equals(Tensor::zeros(DType::kFloat32, {2}).value()));
}

TEST_CASE("a step waits for min_replicas workers, then says how many came", "[coordinator][strategy]") {
  WorkerRecord a;
  Harness h;
  h.add_worker(a, {"sync_step"}, 0);
  REQUIRE(h.coordinator->create_strategy("s", model(), config(2)).ok());
  auto waiting = step(h);
  h.advance(std::chrono::milliseconds(6000));
  auto result = waiting.wait(h.io.waitScope);
  CHECK(result.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(result.status().message(), Catch::Contains("needs 2 worker(s)") && Catch::Contains("1 registered"));
  CHECK(a.forms.empty());
}


}  // namespace
}  // namespace capstan::coordinator

namespace capstan::coordinator {

TEST_CASE("a replica's own error is the step's, not the aborted-group errors its peers answer after it",
          "[coordinator][strategy]") {
  WorkerRecord a, b;
  Harness h;
  h.add_worker(a, {"sync_step"}, 0);
  h.add_worker(b, {"sync_step"}, 1);
  REQUIRE(h.coordinator->create_strategy("s", model(), config(2)).ok());
  auto running = step(h);
  h.settle();
  REQUIRE(a.runs.size() == 1);
  REQUIRE(b.runs.size() == 1);
  // b fails on its own; the coordinator aborts a's group; a's next
  // collective finds it aborted.
  b.reply(0, Status::InvalidArgument("replica 1 refuses its batch"));
  h.settle();
  REQUIRE(a.aborts.size() == 1);
  a.reply(0, Status::Aborted("the collective group (generation 1) was aborted after: ABORTED: ..."));
  auto outcome = running.wait(h.io.waitScope);
  CHECK(outcome.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(outcome.status().message(), Catch::Contains("refuses its batch"));
}

}  // namespace capstan::coordinator

// Strategies alone: a worker table, a variable table and a gate of their own,
// on a manual clock.
namespace capstan::coordinator {
namespace {

using testing::FakeWorker;

struct Alone : testing::CoordinatorParts {
  int64_t add_worker(WorkerRecord& record, int task_index) {
    return CoordinatorParts::add_worker(record, task_index, {"sync_step"});
  }

  WorkerTimes times{nullptr};
  Strategies strategies{workers, variables, gate, context, pool, times};
};

TEST_CASE("Strategies alone: a variable lives in one place, and each strategy says what it mirrors",
          "[coordinator][strategy]") {
  Alone f;
  f.restore_variable("b", 2, 0);
  std::vector<MirroredVariableInit> on_ps = {{"b", Tensor::zeros(DType::kFloat32, {2}).value(), Optimizer::sgd(0.1)}};
  auto refused = f.strategies.create("s", on_ps, config());
  CHECK(refused.code() == StatusCode::kAlreadyExists);
  CHECK(refused.message() == "createStrategy 's': 'b' is a parameter-server variable; a variable lives in one place");
  CHECK(f.strategies.empty());
  REQUIRE(f.strategies.create("s", model(), config()).ok());
  CHECK(f.strategies.is_mirrored("w"));
  CHECK_FALSE(f.strategies.is_mirrored("b"));
  auto specs = f.strategies.specs();
  REQUIRE(specs.count("s") == 1);
  REQUIRE(specs["s"].size() == 1);
  CHECK(specs["s"][0].name == "w");
  CHECK(specs["s"][0].shape == Shape{2});
}

TEST_CASE("Strategies alone: a step keeps its strategy busy with its members until it ends, draining refuses steps",
          "[coordinator][strategy]") {
  WorkerRecord a, b, idle;
  Alone f;
  int64_t id_a = f.add_worker(a, 0);
  int64_t id_b = f.add_worker(b, 1);
  int64_t id_idle = f.workers.add(2, {"other"}, std::make_unique<FakeWorker>(idle)).id;
  REQUIRE(f.strategies.create("s", model(), config(2)).ok());
  auto running = f.strategies.run_step("s", "sync_step", "args");
  f.ws.poll();
  REQUIRE(a.runs.size() == 1);
  REQUIRE(b.runs.size() == 1);
  CHECK(f.strategies.busy());
  CHECK(f.strategies.busy_with(id_a));
  CHECK(f.strategies.busy_with(id_b));
  CHECK_FALSE(f.strategies.busy_with(id_idle));
  a.reply(0, std::string("a"));
  b.reply(0, std::string("b"));
  auto outcome = running.wait(f.ws);
  REQUIRE(outcome.ok());
  CHECK(outcome->epoch == 1);
  CHECK_FALSE(f.strategies.busy());
  CHECK(f.stats.steps_completed == 1);
  auto status = f.strategies.status("s").wait(f.ws);
  REQUIRE(status.ok());
  REQUIRE(status->replicas.size() == 2);
  CHECK(status->replicas[1].worker_id == id_b);
  f.gate.drain();
  auto refused = f.strategies.run_step("s", "sync_step", "args").wait(f.ws);
  CHECK(refused.status().code() == StatusCode::kUnavailable);
}


// ---- Durable strategies (a coordinator with a work_dir) ---------------------------------------

// A coordinator over `config` that has replayed its journal.
std::unique_ptr<Harness> restarted(const CoordinatorConfig& config) {
  auto h = std::make_unique<Harness>(config);
  REQUIRE(h->coordinator->open_journal().ok());
  return h;
}

TEST_CASE("a strategy survives a coordinator restart, the next step forms a group from the last members, "
          "steps going on from the replicas'",
          "[coordinator][strategy][durable]") {
  data::testing::TempDir work;
  CoordinatorConfig durable;
  durable.work_dir = work.path();
  // Small, so that the restart compacts the journal: the strategy lives on
  // in the snapshot.
  durable.journal_compact_records = 8;
  {
    WorkerRecord a, b;
    auto h = restarted(durable);
    h->add_worker(a, {"sync_step"}, 0);
    h->add_worker(b, {"sync_step"}, 1);
    REQUIRE(h->coordinator->create_strategy("s", model(), config(2)).ok());
    for (size_t i = 0; i < 2; ++i) {
      auto running = step(*h);
      h->settle();
      a.reply(i, std::string("a"));
      b.reply(i, std::string("b"));
      REQUIRE(running.wait(h->io.waitScope)->steps == static_cast<int64_t>(i) + 1);
    }
    CHECK(a.forms.size() == 1);
    // A reconnecting program creates it again (each journaled: the journal
    // grows past journal_compact_records).
    for (int i = 0; i < 10; ++i) REQUIRE(h->coordinator->create_strategy("s", model(), config(2)).ok());
    // A third step is cut short by the crash: both replicas applied it.
    auto cut = step(*h);
    h->settle();
    REQUIRE(a.runs.size() == 3);
  }
  // The workers re-register (new worker ids) with what they hold: task 0
  // ran one more step than task 1 (its answer never came back), task 2
  // holds an old replica of another run and was never in the group.
  WorkerRecord a, b, stale;
  a.replica = holding(4, 42);
  b.replica = holding(3, 42);
  stale.replica = holding(1, 7);
  auto h = restarted(durable);
  CHECK_THAT(data::testing::read_bytes(work.file("CURRENT")), Catch::StartsWith("journal-"));
  h->add_worker(stale, {"sync_step"}, 2);
  h->add_worker(b, {"sync_step"}, 1);
  h->add_worker(a, {"sync_step"}, 0);
  // The program's create() hands back the replayed strategy; other
  // variables are refused as before.
  REQUIRE(h->coordinator->create_strategy("s", model(), config(2)).ok());
  std::vector<MirroredVariableInit> other = {{"w", Tensor::zeros(DType::kFloat32, {3}).value(), Optimizer::sgd(0.1)}};
  CHECK(h->coordinator->create_strategy("s", other, config(2)).code() == StatusCode::kAlreadyExists);
  auto running = step(*h);
  h->settle();
  REQUIRE(a.forms.size() == 1);
  REQUIRE(stale.forms.size() == 1);
  CHECK(a.forms[0].epoch == 2);             // after the journaled epoch 1
  CHECK(a.forms[0].source == 1);            // task 1: the fewest steps of the last group
  CHECK_FALSE(a.forms[0].seed.has_value());  // the initial values are long gone
  CHECK_FALSE(b.forms[0].seed.has_value());
  a.reply(0, std::string("a"));
  b.reply(0, std::string("b"));
  stale.reply(0, std::string("c"));
  auto outcome = running.wait(h->io.waitScope);
  REQUIRE(outcome.ok());
  CHECK(outcome->steps == 4);  // the source's 3, and this one
  CHECK(outcome->task_indexes == std::vector<int>{0, 1, 2});

  // Restarted again: the group of three is the last one, at step 4.
  h.reset();
  WorkerRecord a2, b2, c2;
  a2.replica = holding(4, 42);
  b2.replica = holding(4, 42);
  c2.replica = holding(5, 42);
  h = restarted(durable);
  h->add_worker(a2, {"sync_step"}, 0);
  h->add_worker(b2, {"sync_step"}, 1);
  h->add_worker(c2, {"sync_step"}, 2);
  auto again = step(*h);
  h->settle();
  REQUIRE(a2.forms.size() == 1);
  CHECK(a2.forms[0].epoch == 3);
  CHECK(a2.forms[0].source == 0);
  for (WorkerRecord* r : {&a2, &b2, &c2}) r->reply(0, std::string("x"));
  CHECK(again.wait(h->io.waitScope)->steps == 5);
}

TEST_CASE("a strategy created but never stepped before a coordinator restart starts from its initial values",
          "[coordinator][strategy][durable]") {
  data::testing::TempDir work;
  CoordinatorConfig durable;
  durable.work_dir = work.path();
  std::vector<MirroredVariableInit> ones = {{"w", Tensor::from_vector<float>({1, 2}, {2}).value(), Optimizer::sgd(0.1)}};
  {
    auto h = restarted(durable);
    REQUIRE(h->coordinator->create_strategy("s", ones, config(1)).ok());
  }
  WorkerRecord a;
  auto h = restarted(durable);
  h->add_worker(a, {"sync_step"}, 0);
  auto running = step(*h);
  h->settle();
  REQUIRE(a.forms.size() == 1);
  CHECK(a.forms[0].epoch == 1);
  REQUIRE(a.forms[0].seed.has_value());
  REQUIRE(a.forms[0].seed->variables.size() == 1);
  const Tensor& w = a.forms[0].seed->variables[0].value;
  CHECK(std::vector<float>(w.flat<float>().begin(), w.flat<float>().end()) == std::vector<float>{1, 2});
  a.reply(0, std::string("a"));
  CHECK(running.wait(h->io.waitScope)->steps == 1);
}

TEST_CASE("Strategies alone journal each change before it is applied, and a restore's seed comes back from the journal",
          "[coordinator][strategy][durable]") {
  WorkerRecord a;
  Alone f;
  f.add_worker(a, 0);
  std::vector<Strategies::Journaled> journaled;
  Status refuse;
  f.strategies.set_journal([&](const Strategies::Journaled& record) {
    if (!refuse.ok()) return refuse;
    journaled.push_back(record);
    return Status::Ok();
  });
  // A journal that refuses: no strategy.
  refuse = Status::DataLoss("disk gone");
  CHECK(f.strategies.create("s", model(), config()).code() == StatusCode::kDataLoss);
  CHECK(f.strategies.empty());
  refuse = Status::Ok();
  REQUIRE(f.strategies.create("s", model(), config()).ok());
  REQUIRE(journaled.size() == 1);
  CHECK(journaled[0].initial.has_value());
  CHECK(journaled[0].epoch == 0);
  auto first = f.strategies.run_step("s", "sync_step", "args");
  f.ws.poll();
  a.reply(0, std::string("a"));
  REQUIRE(first.wait(f.ws).ok());
  REQUIRE(journaled.size() == 2);  // the group formed, without the values
  CHECK_FALSE(journaled[1].initial.has_value());
  CHECK(journaled[1].epoch == 1);
  CHECK(journaled[1].member_tasks == std::vector<int>{0});
  // A restore makes a checkpoint the seed: journaled with its path.
  Strategies::Restore restore;
  restore.checkpoint = "/ckpt/ckpt-7";
  restore.variables["s"] = {"w"};
  REQUIRE(f.strategies.seed(restore).wait(f.ws).ok());
  REQUIRE(journaled.size() == 3);
  CHECK(journaled[2].seed_checkpoint == "/ckpt/ckpt-7");
  CHECK(journaled[2].epoch == 1);

  // A restarted coordinator's Strategies (over the same worker), from those
  // records: the source of its first group reads the checkpoint.
  Strategies restarted{f.workers, f.variables, f.gate, f.context, f.pool, f.times};
  for (auto& record : journaled) restarted.restore_from_journal(record);
  CHECK(restarted.is_mirrored("w"));
  auto replayed = restarted.run_step("s", "sync_step", "args");
  f.ws.poll();
  REQUIRE(a.forms.size() == 2);
  CHECK(a.forms[1].epoch == 2);
  CHECK(a.forms[1].seed_checkpoint == "/ckpt/ckpt-7");
  CHECK(a.forms[1].seed_from_checkpoint == std::vector<std::string>{"w"});
}

}  // namespace

// ---- Exactly-once step input ---------------------------------------------------------------

TEST_CASE("a step's global batch is split among its replicas, each weighted by its share", "[coordinator][strategy]") {
  StepInputConfig global;
  global.dataset_id = 7;
  global.global_batch = 10;
  global.seed = 3;
  auto three = Strategies::split_input(global, 100, 3).value();
  REQUIRE(three.size() == 3);
  CHECK(three[0].start == 100);
  CHECK(three[0].count == 4);
  CHECK(three[1].start == 104);
  CHECK(three[1].count == 3);
  CHECK(three[2].start == 107);
  CHECK(three[2].count == 3);
  double weights = 0;
  for (const auto& share : three) {
    CHECK(share.first == 100);
    CHECK(share.end == 110);
    CHECK(share.dataset_id == 7);
    CHECK(share.seed == 3);
    CHECK(share.weight == Approx(static_cast<double>(share.count) * 3 / 10));
    weights += share.weight;
  }
  CHECK(weights == Approx(3.0));  // the mean of the weighted gradients is the global batch's
  // Two replicas take the same ten positions.
  auto two = Strategies::split_input(global, 100, 2).value();
  CHECK(two[0].count + two[1].count == 10);
  CHECK(two[1].end == 110);
  // Per-replica batches: the step grows with the replicas, each weighs 1.
  StepInputConfig each;
  each.per_replica_batch = 4;
  auto per = Strategies::split_input(each, 0, 3).value();
  CHECK(per[2].start == 8);
  CHECK(per[2].end == 12);
  CHECK(per[1].weight == 1.0);
  // More replicas than examples: refused, naming both.
  auto refused = Strategies::split_input(global, 0, 11);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("10") && Catch::Contains("11 replicas"));
}

TEST_CASE("a failed step's input positions go to the next step's replicas, a committed step's do not",
          "[coordinator][strategy]") {
  WorkerRecord a, b, c;
  Harness h;
  h.add_worker(a, {"sync_step"}, 0);
  h.add_worker(b, {"sync_step"}, 1);
  int64_t id_c = h.add_worker(c, {"sync_step"}, 2);
  REQUIRE(h.coordinator->create_strategy("s", model(), config()).ok());
  StepInputConfig input;
  input.global_batch = 12;
  auto id = h.coordinator->distribute_step_input("s", data::Dataset::range(100).serialize(), input).wait(h.io.waitScope);
  REQUIRE(id.ok());
  // Every worker got the whole dataset (no shard).
  REQUIRE(a.datasets.size() == 1);
  CHECK(a.datasets[0].first == *id);

  auto first = step(h);
  h.settle();
  REQUIRE(a.runs.size() == 1);
  for (WorkerRecord* r : {&a, &b, &c}) {
    REQUIRE(r->runs[0].run.step_input.has_value());
    CHECK(r->runs[0].run.step_input->dataset_id == *id);
    CHECK(r->runs[0].run.step_input->count == 4);
  }
  CHECK(a.runs[0].run.step_input->start == 0);
  CHECK(c.runs[0].run.step_input->start == 8);
  for (WorkerRecord* r : {&a, &b, &c}) {
    r->replica.step = 1;
    r->replica.input_position = 12;  // the replicas took the positions with the update
    r->reply(0, std::string("ok"));
  }
  auto committed = first.wait(h.io.waitScope);
  REQUIRE(committed.ok());
  CHECK(committed->examples == std::vector<int64_t>{4, 4, 4});
  CHECK(committed->input_position == 12);
  // A step whose closure does not read the input (an evaluation) is handed
  // the next positions but commits none of them.
  auto evaluation = step(h);
  h.settle();
  for (WorkerRecord* r : {&a, &b, &c}) r->reply_without_input(1, std::string("eval"));
  auto evaluated = evaluation.wait(h.io.waitScope);
  REQUIRE(evaluated.ok());
  CHECK(evaluated->examples.empty());
  CHECK(evaluated->input_position == 12);

  // The next step takes [12, 24) and fails: c is lost before anyone
  // applied the update.
  auto failing = step(h);
  h.settle();
  CHECK(a.runs[2].run.step_input->start == 12);
  c.reply(2, Status::Unavailable("Peer disconnected"), /*worker_lost=*/true);
  h.settle();
  a.reply(2, Status::Unavailable("rank 0 gave up"));
  b.reply(2, Status::Unavailable("rank 1 gave up"));
  REQUIRE_FALSE(failing.wait(h.io.waitScope).ok());
  CHECK_FALSE(h.coordinator->worker_alive(id_c));

  // The next step's two replicas read [12, 24) again, six each, each
  // weighing 1 (an even split of the same global batch).
  auto again = step(h);
  h.settle();
  REQUIRE(a.forms.size() == 2);
  CHECK(a.forms[1].input_position == 12);  // from the source's report
  REQUIRE(a.runs.size() == 4);
  CHECK(a.runs[3].run.step_input->start == 12);
  CHECK(a.runs[3].run.step_input->count == 6);
  CHECK(b.runs[3].run.step_input->start == 18);
  CHECK(b.runs[3].run.step_input->end == 24);
  CHECK(b.runs[3].run.step_input->weight == 1.0);
  a.reply(3, std::string("a"));
  b.reply(3, std::string("b"));
  auto out = again.wait(h.io.waitScope);
  REQUIRE(out.ok());
  CHECK(out->input_position == 24);
  CHECK(out->examples == std::vector<int64_t>{6, 6});
}

TEST_CASE("a step that failed after the replicas took its update does not hand its positions out again",
          "[coordinator][strategy]") {
  WorkerRecord a, b;
  Harness h;
  h.add_worker(a, {"sync_step"}, 0);
  h.add_worker(b, {"sync_step"}, 1);
  REQUIRE(h.coordinator->create_strategy("s", model(), config()).ok());
  StepInputConfig input;
  input.per_replica_batch = 5;
  REQUIRE(h.coordinator->distribute_step_input("s", data::Dataset::range(50).serialize(), input)
              .wait(h.io.waitScope)
              .ok());
  auto failing = step(h);
  h.settle();
  // Both applied the update (and so took [0, 10)); then a's closure failed.
  a.replica.step = b.replica.step = 1;
  a.replica.input_position = b.replica.input_position = 10;
  a.reply(0, Status::Internal("the closure failed after apply_gradients"));
  b.reply(0, Status::Aborted("the group was aborted"));
  REQUIRE_FALSE(failing.wait(h.io.waitScope).ok());
  auto next = step(h);
  h.settle();
  REQUIRE(a.runs.size() == 2);
  CHECK(a.runs[1].run.step_input->start == 10);
  CHECK(b.runs[1].run.step_input->start == 15);
  a.reply(1, std::string("a"));
  b.reply(1, std::string("b"));
  CHECK(next.wait(h.io.waitScope)->input_position == 20);
}

TEST_CASE("a step input needs exactly one batch size and an existing strategy", "[coordinator][strategy]") {
  WorkerRecord a;
  Harness h;
  h.add_worker(a, {"sync_step"}, 0);
  REQUIRE(h.coordinator->create_strategy("s", model(), config()).ok());
  const std::string range = data::Dataset::range(10).serialize();
  StepInputConfig both;
  both.global_batch = 4;
  both.per_replica_batch = 2;
  auto refused = h.coordinator->distribute_step_input("s", range, both).wait(h.io.waitScope);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("exactly one"));
  StepInputConfig none;
  CHECK(h.coordinator->distribute_step_input("s", range, none).wait(h.io.waitScope).status().code() ==
        StatusCode::kInvalidArgument);
  StepInputConfig ok;
  ok.global_batch = 4;
  CHECK(h.coordinator->distribute_step_input("missing", range, ok).wait(h.io.waitScope).status().code() ==
        StatusCode::kNotFound);
  CHECK(h.coordinator->distribute_step_input("s", "not a dataset", ok).wait(h.io.waitScope).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(a.datasets.empty());  // nothing was sent for a refused input
  // The same input again (a reconnecting program) is the same dataset.
  auto first = h.coordinator->distribute_step_input("s", range, ok).wait(h.io.waitScope);
  auto again = h.coordinator->distribute_step_input("s", range, ok).wait(h.io.waitScope);
  REQUIRE(first.ok());
  REQUIRE(again.ok());
  CHECK(*first == *again);
}

}  // namespace capstan::coordinator
