#include "daemons/coordinator/coordinator.h"

#include <kj/debug.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <limits>
#include <tuple>

#include "capstan/data/dataset.h"
#include "checkpoint/checkpoint.h"
#include "daemons/coordinator/checkpointing.h"
#include "daemons/coordinator/test_fakes.h"
#include "data/test_util.h"

namespace capstan::coordinator {
namespace {

namespace fs = std::filesystem;
using testing::FakeParameterServers;
using testing::FakeWorker;
using testing::Harness;
using testing::WorkerRecord;

using testing::floats;
using testing::values_of;

// A config that sends a worker up to `n` closures in one call.
CoordinatorConfig batched(int n) {
  CoordinatorConfig config;
  config.closure_batch = n;
  return config;
}
// A config that runs up to `n` closures at once on each worker.
CoordinatorConfig per_worker(int n) {
  CoordinatorConfig config;
  config.closures_per_worker = n;
  return config;
}

VariableRequest variable(std::string name, Tensor initial,
                         placement::Partitioner partitioner = placement::Partitioner::none()) {
  VariableRequest request;
  request.name = std::move(name);
  request.initial = std::move(initial);
  request.optimizer = Optimizer::sgd(0.5);
  request.partitioner = partitioner;
  return request;
}

TEST_CASE("ps_service names the StatefulSet's pods in task order, bad values are named", "[coordinator][ps_service]") {
  auto two = ps_addresses_of_service("ps.capstan.svc.cluster.local:7100", 2);
  REQUIRE(two.ok());
  CHECK(two.value() == std::vector<std::string>{"ps-0.ps.capstan.svc.cluster.local:7100",
                                                "ps-1.ps.capstan.svc.cluster.local:7100"});
  CHECK(ps_addresses_of_service("params:9000", 1).value() == std::vector<std::string>{"params-0.params:9000"});
  auto no_port = ps_addresses_of_service("ps.capstan.svc", 2);
  REQUIRE_FALSE(no_port.ok());
  CHECK_THAT(no_port.status().message(), Catch::Contains("'ps.capstan.svc'") && Catch::Contains("NAME"));
  auto none = ps_addresses_of_service("ps:7100", 0);
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Catch::Contains("num_ps: 0"));
}

}  // namespace

// ---- Membership ----------------------------------------------------------------------

TEST_CASE("reported scalars: kept per tag up to the last 600, a refused call keeps none of its scalars",
          "[coordinator][status]") {
  Harness h;
  Coordinator& c = *h.coordinator;
  for (int step = 1; step <= 650; ++step) REQUIRE(c.report_scalar("loss", 1.0 / step, step, 1000.0 + step).ok());
  REQUIRE(c.reported().at("loss").size() == Coordinator::kReportedPoints);
  CHECK(c.reported().at("loss").front().step == 51);
  CHECK(c.reported().at("loss").back().value == Approx(1.0 / 650));

  // All or nothing: the bad third scalar keeps the first two out.
  Status mixed = c.report_scalars({{"a", 1, 1}, {"b", 2, 1}, {"c", std::nan(""), 1}}, 5.0);
  CHECK(mixed.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(mixed.message(), Catch::Contains("'c'") && Catch::Contains("not finite"));
  CHECK(c.reported().count("a") == 0);
  CHECK(c.report_scalar(std::string(129, 't'), 1, 1, 5.0).code() == StatusCode::kInvalidArgument);

  std::vector<Coordinator::ReportedScalar> many;
  for (size_t i = 0; i < Coordinator::kReportedTags; ++i) many.push_back({"t" + std::to_string(i), 1.0, 1});
  Status too_many = c.report_scalars(many, 5.0);  // "loss" is already one of the 32
  CHECK(too_many.code() == StatusCode::kResourceExhausted);
  CHECK(c.reported().size() == 1);
  many.pop_back();
  CHECK(c.report_scalars(many, 5.0).ok());
  CHECK(c.reported().size() == Coordinator::kReportedTags);
}

TEST_CASE("overview: the workers with their addresses, the parameter servers' state and the placement",
          "[coordinator][status]") {
  WorkerRecord w;
  Harness h({}, 2);
  h.add_worker(w, {"train_step"}, 3);
  Coordinator::Overview o = h.coordinator->overview();
  REQUIRE(o.workers.size() == 1);
  CHECK(o.workers[0].task_index == 3);
  CHECK_FALSE(o.workers[0].leaving);
  REQUIRE(o.ps.size() == 2);
  for (int task = 0; task < 2; ++task) {
    CHECK(o.ps[task].task == task);
    CHECK(o.ps[task].state == "up");
    CHECK(o.ps[task].shards == 0);
  }
  CHECK(o.placements.variables.empty());
  CHECK(o.last_checkpoint.empty());
}

TEST_CASE("registered workers get distinct ids, are counted and their functions listed", "[coordinator]") {
  WorkerRecord a, b;
  Harness h;
  int64_t id_a = h.add_worker(a, {"train_step"});
  int64_t id_b = h.add_worker(b, {"eval_step", "dataset:make"}, 1);
  CHECK(id_a != id_b);
  CHECK(h.coordinator->num_workers() == 2);
  CHECK(h.coordinator->worker_alive(id_a));
  CHECK(h.coordinator->worker_alive(id_b));
  CHECK_FALSE(h.coordinator->worker_alive(id_b + 100));
  CHECK(h.coordinator->closure_names() == std::set<std::string>{"dataset:make", "eval_step", "train_step"});
}

TEST_CASE("schedule fails with NotFound naming the closure when no worker has it", "[coordinator]") {
  WorkerRecord a;
  Harness h;
  h.add_worker(a, {"train_step"});
  auto id = h.coordinator->schedule("no_such_step", "args");
  REQUIRE_FALSE(id.ok());
  CHECK(id.status().code() == StatusCode::kNotFound);
  CHECK_THAT(id.status().message(), Catch::Contains("no_such_step") && Catch::Contains("train_step"));
  CHECK(h.coordinator->schedule("train_step", "args").ok());
}

TEST_CASE("closures are accepted before any worker registers and run once one does", "[coordinator]") {
  WorkerRecord a;
  Harness h;
  int64_t id = h.coordinator->schedule("train_step", "args").value();
  h.add_worker(a);
  h.settle();
  REQUIRE(a.runs.size() == 1);
  CHECK(a.runs[0].run.closure_id == id);
  CHECK(a.runs[0].run.args == "args");
}

TEST_CASE("a dropped worker that registers again is counted again under a new id", "[coordinator]") {
  WorkerRecord first, again;
  Harness h;
  int64_t old_id = h.add_worker(first);
  h.coordinator->schedule("train_step", "x").value();
  h.settle();
  REQUIRE(first.runs.size() == 1);
  h.answer(first, 0, Status::Unavailable("connection reset"), /*worker_lost=*/true);
  CHECK_FALSE(h.coordinator->worker_alive(old_id));
  CHECK(h.coordinator->num_workers() == 0);

  int64_t new_id = h.add_worker(again);
  CHECK(new_id != old_id);
  CHECK(h.coordinator->worker_alive(new_id));
  CHECK(h.coordinator->num_workers() == 1);
}

// ---- Lanes and dispatch ---------------------------------------------------------------

TEST_CASE("each worker runs closures_per_worker closures at once", "[coordinator]") {
  WorkerRecord a;
  Harness h(a, per_worker(2));
  h.schedule_steps(5);
  CHECK(a.runs.size() == 2);
  CHECK(a.open_runs() == 2);

  h.answer(a, 0, std::string("r0"));
  CHECK(a.runs.size() == 3);
  CHECK(a.open_runs() == 2);
  CHECK(a.runs[2].run.args == "2");
}

TEST_CASE("with closure_batch a deep queue goes to a worker in batches, run one at a time, each value fetched",
          "[coordinator]") {
  WorkerRecord a;
  Harness h(a, batched(4));
  std::vector<int64_t> ids = h.schedule_steps(20);
  // 20 queued for one lane: a full batch of 4, of which one runs.
  CHECK(a.batches == std::vector<size_t>{4});
  REQUIRE(a.runs.size() == 1);
  for (size_t i = 0; i < 4; ++i) {
    REQUIRE(a.runs.size() == i + 1);
    CHECK(a.runs[i].run.args == std::to_string(i));
    h.answer(a, i, "v" + std::to_string(i));
  }
  // The next call only after the batch's last answer.
  CHECK(a.batches == std::vector<size_t>{4, 4});
  for (size_t i = 4; i < 20; ++i) {
    REQUIRE(a.runs.size() == i + 1);
    h.answer(a, i, "v" + std::to_string(i));
  }
  // The queue grows shallow: the batches shrink to one closure per call
  // (those go through run_closure, not counted here).
  CHECK(a.batches.size() < 20);
  CHECK(a.batches.back() <= 4);
  CHECK(h.joined().ok());
  for (int i = 0; i < 20; ++i) {
    CHECK(h.fetched(ids[i]).value() == "v" + std::to_string(i));
  }
}

TEST_CASE("a closure failing in a batch stops the rest of its batch, which its error cancels", "[coordinator]") {
  WorkerRecord a;
  Harness h(batched(4));
  int64_t worker = h.add_worker(a);
  std::vector<int64_t> ids = h.schedule_steps(10);
  REQUIRE(a.batches == std::vector<size_t>{4});
  h.answer(a, 0, std::string("v0"));
  h.answer(a, 1, Status::InvalidArgument("bad input"));
  // Closures 2 and 3 of the batch never started.
  CHECK(a.runs.size() == 2);
  CHECK(h.coordinator->worker_alive(worker));
  CHECK(h.joined().code() == StatusCode::kInvalidArgument);
  CHECK(h.fetched(ids[0]).value() == "v0");
  CHECK(h.fetched(ids[1]).status().code() == StatusCode::kInvalidArgument);
  for (int i = 2; i < 10; ++i) {
    CHECK(h.fetched(ids[i]).status().code() == StatusCode::kCancelled);
  }
  // The lane takes new work afterwards.
  int64_t next = h.coordinator->schedule("train_step", "next").value();
  h.settle();
  REQUIRE(a.runs.size() == 3);
  a.reply(2, std::string("ok"));
  CHECK(h.fetched(next).value() == "ok");
}

TEST_CASE("runs of a batch lost to a retryable failure go back to the queue in their order", "[coordinator]") {
  WorkerRecord a;
  Harness h(a, batched(4));
  std::vector<int64_t> ids = h.schedule_steps(12);
  REQUIRE(a.batches == std::vector<size_t>{4});
  h.answer(a, 0, std::string("v0"));
  // A retryable failure: closures 1 (failed) and 2, 3 (not started) run again.
  h.answer(a, 1, Status::Unavailable("parameter server restarting"));
  std::vector<std::string> order;
  for (size_t i = 2; i < 20 && a.open_runs() > 0; ++i) {
    REQUIRE(a.runs.size() == i + 1);
    order.push_back(a.runs[i].run.args);
    h.answer(a, i, "v" + a.runs[i].run.args);
  }
  REQUIRE(order.size() >= 3);
  CHECK(std::vector<std::string>(order.begin(), order.begin() + 3) == std::vector<std::string>{"1", "2", "3"});
  CHECK(h.joined().ok());
  for (int i = 0; i < 12; ++i) {
    CHECK(h.fetched(ids[i]).value() == "v" + std::to_string(i));
  }
}

TEST_CASE("a worker lost in the middle of a batch has the whole rest of it run elsewhere", "[coordinator]") {
  WorkerRecord a, b;
  Harness h(batched(4));
  int64_t lost = h.add_worker(a);
  std::vector<int64_t> ids = h.schedule_steps(8);
  REQUIRE(a.batches == std::vector<size_t>{4});
  h.answer(a, 0, std::string("a0"));
  h.answer(a, 1, Status::Unavailable("connection reset"), /*worker_lost=*/true);
  CHECK_FALSE(h.coordinator->worker_alive(lost));
  CHECK(a.runs.size() == 2);
  h.add_worker(b);
  h.settle();
  // Closures 1..7 run on b, each once, closure 1 as attempt 2.
  std::map<std::string, int> attempts;
  for (size_t i = 0; i < 7; ++i) {
    REQUIRE(b.runs.size() == i + 1);
    attempts[b.runs[i].run.args] = static_cast<int>(b.runs[i].run.attempt);
    h.answer(b, i, "b" + b.runs[i].run.args);
  }
  CHECK(b.runs.size() == 7);
  CHECK(attempts.size() == 7);
  CHECK(attempts["1"] == 2);
  CHECK(h.joined().ok());
  CHECK(h.fetched(ids[0]).value() == "a0");
  for (int i = 1; i < 8; ++i) {
    CHECK(h.fetched(ids[i]).value() == "b" + std::to_string(i));
  }
}

TEST_CASE("closures with closure_timeout are never batched", "[coordinator]") {
  CoordinatorConfig config;
  config.closure_batch = 4;
  config.closure_timeout = std::chrono::milliseconds(60000);
  WorkerRecord a;
  Harness h(a, config);
  h.schedule_steps(20);
  CHECK(a.batches.empty());
  REQUIRE(a.runs.size() == 1);
  CHECK(a.runs[0].run.deadline_unix_ms > 0);
}

TEST_CASE("a dispatched closure carries attempt 1, the worker count and the placement version", "[coordinator]") {
  WorkerRecord a, b;
  Harness h(a);
  h.add_worker(b);
  h.create_variable(variable("w", floats({1, 2}, {2})));
  h.coordinator->schedule("train_step", "x").value();
  h.settle();
  REQUIRE(a.runs.size() + b.runs.size() == 1);
  const ClosureRun& run = a.runs.empty() ? b.runs[0].run : a.runs[0].run;
  CHECK(run.function == "train_step");
  CHECK(run.attempt == 1);
  CHECK(run.num_workers == 2);
  CHECK(run.placement_version == 1);
}

TEST_CASE("a closure's value is fetched once its worker answers, and join waits for it", "[coordinator]") {
  WorkerRecord a;
  Harness h(a);
  int64_t id = h.coordinator->schedule("train_step", "x").value();
  auto join = h.coordinator->join();
  auto fetch = h.coordinator->fetch(id);
  h.settle();
  CHECK_FALSE(join.poll(h.io.waitScope));
  CHECK(h.coordinator->done().value() == false);
  a.reply(0, std::string("loss"));
  CHECK(join.wait(h.io.waitScope).ok());
  CHECK(fetch.wait(h.io.waitScope).value() == "loss");
  CHECK(h.coordinator->done().value() == true);
  CHECK(h.fetched(id + 100).status().code() == StatusCode::kNotFound);
}

TEST_CASE("an error a worker reports fails the closure, keeps the worker and is raised by join once",
          "[coordinator]") {
  WorkerRecord a;
  Harness h;
  int64_t worker = h.add_worker(a);
  int64_t id = h.coordinator->schedule("train_step", "x").value();
  h.settle();
  h.answer(a, 0, Status::InvalidArgument("bad input"));
  CHECK(h.coordinator->worker_alive(worker));
  CHECK(h.joined().code() == StatusCode::kInvalidArgument);
  CHECK(h.joined().ok());
  CHECK(h.fetched(id).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a failing closure cancels the closures running on other workers and tells those workers",
          "[coordinator]") {
  WorkerRecord a, b;
  Harness h(a);
  h.add_worker(b);
  int64_t slow = h.coordinator->schedule("train_step", "slow").value();
  int64_t failing = h.coordinator->schedule("train_step", "fails").value();
  h.settle();
  REQUIRE(a.runs.size() + b.runs.size() == 2);
  WorkerRecord& slow_worker = a.runs.size() == 1 && a.runs[0].run.closure_id == slow ? a : b;
  WorkerRecord& failing_worker = &slow_worker == &a ? b : a;
  REQUIRE(failing_worker.runs.at(0).run.closure_id == failing);
  h.answer(failing_worker, 0, Status::InvalidArgument("bad input"));
  CHECK(slow_worker.cancels == std::vector<int64_t>{slow});
  CHECK(failing_worker.cancels.empty());
  // join raises the failure without waiting for the cancelled run.
  CHECK(h.joined().code() == StatusCode::kInvalidArgument);
  CHECK(h.fetched(slow).status().code() == StatusCode::kCancelled);
  // The cancelled run answers late: dropped, and its lane takes new work.
  h.answer(slow_worker, 0, std::string("late value"));
  CHECK(h.fetched(slow).status().code() == StatusCode::kCancelled);
  int64_t next = h.coordinator->schedule("train_step", "next").value();
  h.settle();
  CHECK(a.runs.size() + b.runs.size() == 3);
  (a.runs.size() == 2 ? a : b).reply(1, std::string("ok"));
  h.settle();
  CHECK(h.fetched(next).value() == "ok");
}

TEST_CASE("a run past closure_timeout fails with DeadlineExceeded, is cancelled and cancels the rest",
          "[coordinator]") {
  CoordinatorConfig config;
  config.closure_timeout = std::chrono::milliseconds(300);
  WorkerRecord a;
  Harness h(a, config);
  int64_t stuck = h.coordinator->schedule("train_step", "stuck").value();
  int64_t queued = h.coordinator->schedule("train_step", "queued").value();
  h.settle();
  REQUIRE(a.runs.size() == 1);
  CHECK(a.runs[0].run.deadline_unix_ms > 0);
  h.advance(std::chrono::milliseconds(200));
  CHECK(a.cancels.empty());
  h.advance(std::chrono::milliseconds(200));
  CHECK(a.cancels == std::vector<int64_t>{stuck});
  auto failed = h.fetched(stuck);
  CHECK(failed.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(failed.status().message(), Catch::Contains("closure_timeout_ms 300"));
  CHECK(h.fetched(queued).status().code() == StatusCode::kCancelled);
  CHECK(h.joined().code() == StatusCode::kDeadlineExceeded);
}

TEST_CASE("without closure_timeout a run has no deadline", "[coordinator]") {
  WorkerRecord a;
  Harness h(a);
  h.coordinator->schedule("train_step", "x").value();
  h.settle();
  REQUIRE(a.runs.size() == 1);
  CHECK(a.runs[0].run.deadline_unix_ms == 0);
}

TEST_CASE("a worker whose link breaks is dropped and its closures run again elsewhere as attempt 2",
          "[coordinator]") {
  WorkerRecord a, b;
  Harness h;
  int64_t id_a = h.add_worker(a);
  int64_t closure = h.coordinator->schedule("train_step", "x").value();
  h.settle();
  REQUIRE(a.runs.size() == 1);
  CHECK(a.runs[0].run.attempt == 1);
  int64_t id_b = h.add_worker(b);
  h.settle();
  CHECK(b.runs.empty());

  h.answer(a, 0, Status::Unavailable("connection reset"), /*worker_lost=*/true);
  CHECK_FALSE(h.coordinator->worker_alive(id_a));
  CHECK(h.coordinator->worker_alive(id_b));
  REQUIRE(b.runs.size() == 1);
  CHECK(b.runs[0].run.closure_id == closure);
  CHECK(b.runs[0].run.attempt == 2);
  CHECK(b.runs[0].run.num_workers == 1);
  CHECK(a.runs.size() == 1);  // nothing more went to the dropped worker

  b.reply(0, std::string("done"));
  CHECK(h.fetched(closure).value() == "done");
}

TEST_CASE("a worker whose run promise breaks counts as lost", "[coordinator]") {
  WorkerRecord a;
  Harness h;
  int64_t id_a = h.add_worker(a);
  h.coordinator->schedule("train_step", "x").value();
  h.settle();
  REQUIRE(a.runs.size() == 1);
  a.runs[0].reply->reject(KJ_EXCEPTION(DISCONNECTED, "peer gone"));
  h.settle();
  CHECK_FALSE(h.coordinator->worker_alive(id_a));
  CHECK(h.coordinator->done().value() == false);  // the closure is queued again
}

TEST_CASE("a worker that stops answering pings is dropped and its closures run elsewhere", "[coordinator]") {
  CoordinatorConfig config;
  config.worker_ping_interval = std::chrono::milliseconds(1000);
  config.worker_ping_timeout = std::chrono::milliseconds(3000);
  WorkerRecord hung, healthy;
  Harness h(config);
  int64_t id_hung = h.add_worker(hung);
  int64_t closure = h.coordinator->schedule("train_step", "x").value();
  h.settle();
  REQUIRE(hung.runs.size() == 1);
  int64_t id_healthy = h.add_worker(healthy);

  // Both answer for a while: nobody is dropped.
  h.advance(std::chrono::milliseconds(5000));
  CHECK(hung.pings >= 4);
  CHECK(h.coordinator->worker_alive(id_hung));

  hung.answer_pings = false;
  h.advance(std::chrono::milliseconds(2000));
  CHECK(h.coordinator->worker_alive(id_hung));  // its ping is late, not yet timed out
  h.advance(std::chrono::milliseconds(3000));
  CHECK_FALSE(h.coordinator->worker_alive(id_hung));
  CHECK(h.coordinator->worker_alive(id_healthy));
  REQUIRE(healthy.runs.size() == 1);
  CHECK(healthy.runs[0].run.closure_id == closure);
  CHECK(healthy.runs[0].run.attempt == 2);
}

// ---- Variables and placement -----------------------------------------------------------

TEST_CASE("creating a variable places its shards on the parameter servers and bumps the placement version",
          "[coordinator]") {
  Harness h({}, /*num_ps=*/2);
  CHECK(h.coordinator->placements().version == 0);
  auto w =
      h.create_variable(variable("w", floats({1, 2, 3, 4, 5, 6}, {3, 2}), placement::Partitioner::fixed_shards(2)));
  REQUIRE(w.shards.size() == 2);
  CHECK(w.shards[0].name == "w/part_0");
  CHECK(w.shards[0].ps_task == 0);
  CHECK(w.shards[0].ps_address == "ps0:7000");
  CHECK(w.shards[0].rows == 2);
  CHECK(w.shards[1].ps_task == 1);
  CHECK(w.shards[1].first_row == 2);
  CHECK(w.shards[1].rows == 1);
  CHECK(values_of(h.ps.tasks[0].shards.at("w/part_0").value) == std::vector<float>{1, 2, 3, 4});
  CHECK(values_of(h.ps.tasks[1].shards.at("w/part_1").value) == std::vector<float>{5, 6});
  CHECK(h.ps.tasks[1].optimizers.at("w/part_1").kind == Optimizer::Kind::kSgd);  // as the program sent it
  CHECK(h.ps.tasks[1].optimizers.at("w/part_1").learning_rate == 0.5);
  CHECK(h.coordinator->placements().version == 1);

  // Round-robin continues across variables.
  auto b = h.create_variable(variable("b", floats({0}, {1})));
  REQUIRE(b.shards.size() == 1);
  CHECK(b.shards[0].ps_task == 0);
  auto all = h.coordinator->placements();
  CHECK(all.version == 2);
  REQUIRE(all.variables.size() == 2);
  CHECK(all.variables[0].name == "b");
  CHECK(all.variables[1].name == "w");
}

TEST_CASE("creating an existing variable hands it back, another dtype or shape is AlreadyExists",
          "[coordinator]") {
  Harness h;
  h.create_variable(variable("w", floats({1, 2}, {2})));
  auto again = h.coordinator->create_variable(variable("w", floats({9, 9}, {2}))).wait(h.io.waitScope);
  REQUIRE(again.ok());
  CHECK(again->shards.size() == 1);
  CHECK(h.coordinator->placements().version == 1);
  CHECK(values_of(h.ps.tasks[0].shards.at("w").value) == std::vector<float>{1, 2});

  auto other = h.coordinator->create_variable(variable("w", floats({1, 2, 3}, {3}))).wait(h.io.waitScope);
  CHECK(other.status().code() == StatusCode::kAlreadyExists);
}

TEST_CASE("creating a variable with an empty name is InvalidArgument", "[coordinator]") {
  Harness h;
  CHECK(h.coordinator->create_variable(variable("", floats({1}, {1}))).wait(h.io.waitScope).status().code() ==
        StatusCode::kInvalidArgument);
}

// A variable of `dtype` and `shape` whose value `initializer` makes.
VariableRequest initialized(std::string name, Initializer initializer, DType dtype, Shape shape) {
  VariableRequest request = variable(std::move(name), Tensor(), placement::Partitioner::fixed_shards(2));
  request.initializer = initializer;
  request.dtype = dtype;
  request.shape = std::move(shape);
  return request;
}

TEST_CASE("a bad variable request is InvalidArgument saying what to fix, nothing created", "[coordinator]") {
  Harness h({}, /*num_ps=*/2);
  struct Case {
    VariableRequest request;
    std::string says;
  };
  VariableRequest both = initialized("w", Initializer::zeros(), DType::kFloat32, {4});
  both.initial = floats({1, 2, 3, 4}, {4});
  VariableRequest neither = initialized("w", Initializer{}, DType::kFloat32, {4});
  VariableRequest twice = initialized("w", Initializer::zeros(), DType::kFloat32, {4});
  twice.value_from_program = true;
  VariableRequest value_and_program = variable("w", floats({1}, {1}));
  value_and_program.value_from_program = true;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Case> cases = {
      {both, "both an initial value and initializer zeros given; drop one of them"},
      {neither, "no initial value and no initializer; give one of them"},
      {twice, "given with valueFromProgram; drop one of them"},
      {value_and_program, "an initial value given with valueFromProgram"},
      {initialized("w", Initializer::random_normal(0, -0.5, 1), DType::kFloat32, {4}), "stddev -0.5"},
      {initialized("w", Initializer::random_uniform(1, 0, 1), DType::kFloat64, {4}), "minval 1 is greater"},
      {initialized("w", Initializer::constant(inf), DType::kFloat32, {4}), "value inf"},
      {initialized("w", Initializer::truncated_normal(0, 1, 1), DType::kInt32, {4}), "not int32"},
      {initialized("w", Initializer::zeros(), DType::kString, {4}), "cannot be string"},
      {initialized("w", Initializer::zeros(), DType::kInvalid, {4}), "cannot be invalid"},
      {initialized("w", Initializer::zeros(), DType::kFloat32, {4, -1}), "negative dim"},
      {initialized("w", Initializer::zeros(), DType::kFloat32, {int64_t{1} << 40, int64_t{1} << 30}), "too large"},
  };
  for (const Case& c : cases) {
    auto created = h.coordinator->create_variable(c.request).wait(h.io.waitScope);
    INFO(created.status().to_string());
    CHECK(created.status().code() == StatusCode::kInvalidArgument);
    CHECK(created.status().message().find(c.says) != std::string::npos);
  }
  CHECK(h.coordinator->placements().variables.empty());
  for (const auto& task : h.ps.tasks) CHECK(task.shards.empty());
}

TEST_CASE("a variable made by an initializer never passes its value through the coordinator", "[coordinator]") {
  Harness h({}, /*num_ps=*/2);
  auto w = h.create_variable(initialized("w", Initializer::truncated_normal(0, 0.1, 3), DType::kFloat64, {6, 2}));
  REQUIRE(w.shards.size() == 2);
  for (const auto& task : h.ps.tasks) CHECK(task.valued_creates.empty());
  CHECK(h.ps.tasks[static_cast<size_t>(w.shards[1].ps_task)].initialized.at(w.shards[1].name).first_row == 3);
  CHECK_FALSE(h.coordinator->awaiting_value("w"));
  // A program that reconnects gets it back as it is, whatever it asks the seed to be.
  auto again =
      h.coordinator->create_variable(initialized("w", Initializer::truncated_normal(0, 0.1, 4), DType::kFloat64, {6, 2}))
          .wait(h.io.waitScope);
  REQUIRE(again.ok());
  CHECK(h.coordinator->placements().version == 1);
  auto other = h.coordinator->create_variable(initialized("w", Initializer::zeros(), DType::kFloat32, {6, 2}))
                   .wait(h.io.waitScope);
  CHECK(other.status().code() == StatusCode::kAlreadyExists);
}

TEST_CASE("creating a variable without parameter servers is FailedPrecondition", "[coordinator]") {
  Harness h({}, /*num_ps=*/0);
  CHECK(h.coordinator->create_variable(variable("w", floats({1}, {1}))).wait(h.io.waitScope).status().code() ==
        StatusCode::kFailedPrecondition);
}

TEST_CASE("an unreachable parameter server makes calls fail with Unavailable naming it until it is back",
          "[coordinator]") {
  WorkerRecord a;
  Harness h(a, {}, /*num_ps=*/2);
  h.ps.go_down(1);
  h.settle();

  auto created = h.coordinator->create_variable(variable("w", floats({1}, {1}))).wait(h.io.waitScope);
  CHECK(created.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(created.status().message(), Catch::Contains("ps:1") && Catch::Contains("ps1:7000"));
  CHECK(h.coordinator->schedule("train_step", "x").status().code() == StatusCode::kUnavailable);
  CHECK(h.joined().code() == StatusCode::kUnavailable);
  CHECK(h.coordinator->done().status().code() == StatusCode::kUnavailable);

  h.ps.come_up(1);
  h.settle();
  CHECK(h.coordinator->create_variable(variable("w", floats({1}, {1}))).wait(h.io.waitScope).ok());
  CHECK(h.joined().ok());
}

TEST_CASE("dispatch pauses while a parameter server is unreachable", "[coordinator]") {
  WorkerRecord a;
  Harness h(a);
  h.coordinator->schedule("train_step", "1").value();
  h.coordinator->schedule("train_step", "2").value();
  h.settle();
  REQUIRE(a.runs.size() == 1);
  h.ps.go_down(0);
  h.settle();
  h.answer(a, 0, std::string("v"));
  CHECK(a.runs.size() == 1);  // the second waits for the parameter server
  h.ps.come_up(0);
  h.settle();
  REQUIRE(a.runs.size() == 2);
  CHECK(a.runs[1].run.args == "2");
}

TEST_CASE("the coordinator's stats count closures by how they end, and what waits and runs", "[coordinator]") {
  WorkerRecord a;
  Harness h(a);
  auto stats = h.coordinator->stats();
  for (int i = 0; i < 3; ++i) h.coordinator->schedule("train_step", "x").value();
  h.settle();
  CHECK(stats->closures_scheduled == 3);
  CHECK(stats->closures_running == 1);
  CHECK(stats->closures_queued == 2);
  CHECK(stats->workers == 1);
  h.answer(a, 0, std::string("v"));
  a.reply(1, Status::Unavailable("lost run"));  // re-run: not an end
  h.settle();
  CHECK(stats->closures_succeeded == 1);
  CHECK(stats->closures_failed == 0);
  REQUIRE(a.runs.size() == 3);
  h.answer(a, 2, Status::InvalidArgument("bad"));
  CHECK(stats->closures_failed == 1);
  CHECK(stats->closures_queued + stats->closures_running == 0);  // the last one was cancelled
}

// ---- Releasing values -----------------------------------------------------------------------

TEST_CASE("a value the program dropped is released: the coordinator keeps only what the program holds",
          "[coordinator][release]") {
  WorkerRecord a;
  Harness h(a);
  auto stats = h.coordinator->stats();
  std::vector<int64_t> ids = h.schedule_steps(3, /*run=*/false);
  // Dropped while still queued: goes when it finishes.
  REQUIRE(h.coordinator->release({ids[2]}).ok());
  for (size_t run = 0; run < 3; ++run) {
    h.settle();
    REQUIRE(a.runs.size() == run + 1);
    a.reply(run, "v" + std::to_string(run));
  }
  CHECK(h.joined().ok());
  CHECK(stats->results_kept == 2);
  REQUIRE(h.coordinator->release({ids[0]}).ok());
  CHECK(stats->results_kept == 1);
  CHECK(stats->closures_released == 2);
  CHECK(h.fetched(ids[1]).value() == "v1");
  for (int64_t gone : {ids[0], ids[2]}) {
    Status fetched = h.fetched(gone).status();
    CHECK(fetched.code() == StatusCode::kNotFound);
    CHECK_THAT(fetched.message(), Catch::Contains("closure " + std::to_string(gone) + " was released"));
  }
}

TEST_CASE("fetch, then release: the value is gone and a second fetch says it was released", "[coordinator][release]") {
  WorkerRecord a;
  Harness h(a);
  int64_t id = h.coordinator->schedule("train_step", "x", /*client_id=*/9, /*request_seq=*/1).value();
  auto fetch = h.coordinator->fetch(id);
  h.settle();
  a.reply(0, std::string("loss"));
  CHECK(fetch.wait(h.io.waitScope).value() == "loss");
  REQUIRE(h.coordinator->release({id}, 9).ok());
  REQUIRE(h.coordinator->release({id}, 9).ok());  // a retried release: no change
  CHECK(h.coordinator->stats()->closures_released == 1);
  Status again = h.fetched(id).status();
  CHECK(again.code() == StatusCode::kNotFound);
  CHECK_THAT(again.message(), Catch::Contains(std::to_string(id)) && Catch::Contains("released"));
}

TEST_CASE("a fetch waiting on a closure that is released meanwhile ends saying it was released",
          "[coordinator][release]") {
  WorkerRecord a;
  Harness h(a);
  int64_t id = h.coordinator->schedule("train_step", "x").value();
  auto fetch = h.coordinator->fetch(id);
  h.settle();
  REQUIRE(h.coordinator->release({id}).ok());
  a.reply(0, std::string("loss"));
  CHECK(fetch.wait(h.io.waitScope).status().code() == StatusCode::kNotFound);
}

TEST_CASE("releases of ids from another coordinator process are ignored", "[coordinator][release]") {
  WorkerRecord a;
  Harness h(a);
  int64_t id = h.coordinator->schedule("train_step", "x").value();
  h.settle();
  h.answer(a, 0, std::string("v"));
  const uint64_t mine = h.coordinator->incarnation();
  REQUIRE(mine != 0);  // no journal: its ids start at 1 again after a restart
  REQUIRE(h.coordinator->release({id}, 0, mine + 1).ok());
  CHECK(h.fetched(id).value() == "v");
  REQUIRE(h.coordinator->release({id}, 0, mine).ok());
  CHECK(h.fetched(id).status().code() == StatusCode::kNotFound);
}

TEST_CASE("release refuses ids never handed out and over-long lists, releasing none of them",
          "[coordinator][release]") {
  WorkerRecord a;
  Harness h(a);
  std::vector<int64_t> ids = h.schedule_steps(2);
  h.answer(a, 0, std::string("v"));
  for (int64_t bad : {int64_t{-1}, int64_t{0}, ids[1] + 1, std::numeric_limits<int64_t>::max()}) {
    Status refused = h.coordinator->release({ids[0], bad});
    CHECK(refused.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(refused.message(), Catch::Contains(std::to_string(bad)));
  }
  CHECK(h.fetched(ids[0]).value() == "v");  // all or none
  std::vector<int64_t> huge(Coordinator::kMaxReleasePerCall + 1, ids[0]);
  Status too_many = h.coordinator->release(huge);
  CHECK(too_many.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(too_many.message(), Catch::Contains(std::to_string(huge.size())));
  CHECK(h.fetched(ids[0]).value() == "v");
  CHECK(h.coordinator->release({}).ok());
}

TEST_CASE("the values of a client gone longer than client_grace are released, a client that calls keeps its own",
          "[coordinator][release]") {
  CoordinatorConfig config;
  config.client_grace = std::chrono::milliseconds(2000);
  WorkerRecord a;
  Harness h(a, config);
  const uint64_t gone = 1, alive = 2;
  int64_t gone_done = h.coordinator->schedule("train_step", "a", gone, 1).value();
  int64_t alive_done = h.coordinator->schedule("train_step", "b", alive, 1).value();
  int64_t anonymous = h.coordinator->schedule("train_step", "c").value();
  for (size_t run = 0; run < 3; ++run) {
    h.settle();
    REQUIRE(a.runs.size() == run + 1);
    a.reply(run, std::string("v"));
  }
  // One still running when its client's grace ends.
  int64_t gone_running = h.coordinator->schedule("train_step", "d", gone, 2).value();
  h.settle();
  REQUIRE(a.runs.size() == 4);
  CHECK(h.coordinator->stats()->clients == 2);
  // `alive` calls (heartbeats: empty releases) through the grace period.
  for (int i = 0; i < 3; ++i) {
    h.advance(std::chrono::milliseconds(1000));
    REQUIRE(h.coordinator->release({}, alive).ok());
  }
  CHECK(h.fetched(alive_done).value() == "v");
  CHECK(h.fetched(anonymous).value() == "v");  // no client: kept
  Status fetched = h.fetched(gone_done).status();
  CHECK(fetched.code() == StatusCode::kNotFound);
  CHECK_THAT(fetched.message(), Catch::Contains("released"));
  h.answer(a, 3, std::string("late"));
  CHECK(h.fetched(gone_running).status().code() == StatusCode::kNotFound);
  CHECK(h.coordinator->stats()->results_kept == 2);
  CHECK(h.coordinator->stats()->clients == 1);
  // The gone client's requests are forgotten too: a schedule from it now
  // (it came back after all) is a new closure.
  CHECK(h.coordinator->schedule("train_step", "a", gone, 1).value() > gone_running);
}

TEST_CASE("with client_grace 0 a silent client's values stay", "[coordinator][release]") {
  CoordinatorConfig config;
  config.client_grace = std::chrono::milliseconds(0);
  WorkerRecord a;
  Harness h(a, config);
  int64_t id = h.coordinator->schedule("train_step", "a", 1, 1).value();
  h.settle();
  a.reply(0, std::string("v"));
  h.advance(std::chrono::milliseconds(5000));
  h.coordinator->expire_clients();
  CHECK(h.fetched(id).value() == "v");
}

// ---- Checkpoints -------------------------------------------------------------------------

TEST_CASE("save_checkpoint has every parameter server write the shards it holds, reading none itself",
          "[coordinator]") {
  data::testing::TempDir dir;
  Harness h({}, /*num_ps=*/2);
  h.create_variable(variable("w", floats({1, 2, 3, 4}, {4}), placement::Partitioner::fixed_shards(2)));
  h.ps.tasks[0].shards.at("w/part_0").slots["accumulator"] = floats({5, 6}, {2});
  h.ps.tasks[1].shards.at("w/part_1").slots["accumulator"] = floats({7, 8}, {2});
  h.ps.tasks[1].shards.at("w/part_1").step = 5;

  std::string path = h.coordinator->save_checkpoint(dir.path(), 5, 3).wait(h.io.waitScope).value();
  CHECK(h.ps.tasks[0].saved == std::vector<std::string>{"w/part_0"});
  CHECK(h.ps.tasks[1].saved == std::vector<std::string>{"w/part_1"});
  CHECK(fs::exists(fs::path(path) / "ps-0.safetensors"));
  CHECK(fs::exists(fs::path(path) / "ps-1.safetensors"));
  auto reader = checkpoint::CheckpointReader::open(path);
  REQUIRE(reader.ok());
  CHECK(values_of((*reader)->read_variable("w").value()) == std::vector<float>{1, 2, 3, 4});
  CHECK(values_of((*reader)->read_slot_rows("w", "accumulator", 2, 4).value()) == std::vector<float>{7, 8});
  CHECK((*reader)->manifest().variables[0].optimizer_step == 5);
}

TEST_CASE("an embedding table: a shard on every parameter server, saved with its generation, restored re-hashed "
          "into 3 servers, and exported since a checkpoint",
          "[coordinator][embedding]") {
  data::testing::TempDir dir;
  EmbeddingTableSpec spec{"users", 2, DType::kFloat32, EmbeddingInitializer::random_normal(0, 1, 3),
                          Optimizer::sgd(1.0), {}};
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 200; ++k) keys.push_back(k * 1'000'003);
  auto ids = [](std::vector<int64_t> k) { return Tensor::from_vector<int64_t>(k, {static_cast<int64_t>(k.size())}).value(); };
  // Each key goes to the server table_shard_of names (as the router sends it).
  auto by_shard = [&](FakeParameterServers& ps, const std::vector<int64_t>& all, auto fn) {
    const int n = ps.size();
    for (int s = 0; s < n; ++s) {
      std::vector<int64_t> mine;
      for (int64_t k : all) {
        if (table_shard_of(k, n) == s) mine.push_back(k);
      }
      if (!mine.empty()) fn(*ps.tasks[static_cast<size_t>(s)].tables.at("users/part_" + std::to_string(s)), mine);
    }
  };
  std::map<int64_t, std::vector<float>> saved;  // key -> row at the checkpoint
  std::string path;
  {
    Harness h({}, /*num_ps=*/2);
    auto placed = h.coordinator->create_table(spec).wait(h.io.waitScope);
    REQUIRE(placed.ok());
    CHECK(placed->shards.size() == 2);
    CHECK(placed->table.has_value());
    // Creating it again with the same spec hands it back; another spec or a
    // variable's name is refused.
    CHECK(h.coordinator->create_table(spec).wait(h.io.waitScope).ok());
    EmbeddingTableSpec other = spec;
    other.dim = 3;
    CHECK(h.coordinator->create_table(other).wait(h.io.waitScope).status().code() == StatusCode::kAlreadyExists);
    by_shard(h.ps, keys, [&](ps_server::EmbeddingTable& t, const std::vector<int64_t>& mine) {
      REQUIRE(t.lookup(ids(mine), true).ok());
      std::vector<float> grad(mine.size() * 2, 0.5f);
      REQUIRE(t.apply_gradients(ids(mine), Tensor::from_vector<float>(grad, {static_cast<int64_t>(mine.size()), 2}).value(), 0).ok());
      Tensor rows = t.lookup(ids(mine), false).value();
      for (size_t i = 0; i < mine.size(); ++i) saved[mine[i]] = {rows.flat<float>()[2 * i], rows.flat<float>()[2 * i + 1]};
    });
    path = h.coordinator->save_checkpoint(dir.path(), 7, 3).wait(h.io.waitScope).value();
    auto reader = checkpoint::CheckpointReader::open(path).value();
    const auto* entry = reader->manifest().find_variable("users");
    REQUIRE(entry != nullptr);
    REQUIRE(entry->table.has_value());
    CHECK(entry->shape == Shape{200, 2});

    // After the save: 5 keys updated; the export since the checkpoint has
    // exactly them.
    std::vector<int64_t> changed(keys.begin(), keys.begin() + 5);
    by_shard(h.ps, changed, [&](ps_server::EmbeddingTable& t, const std::vector<int64_t>& mine) {
      std::vector<float> grad(mine.size() * 2, 1.0f);
      REQUIRE(t.apply_gradients(ids(mine), Tensor::from_vector<float>(grad, {static_cast<int64_t>(mine.size()), 2}).value(), 0).ok());
    });
    const std::string delta = dir.path() + "/delta.safetensors";
    CHECK(h.coordinator->export_table("users", path, delta).wait(h.io.waitScope).value() == 5);
    CHECK(h.coordinator->export_table("users", "", dir.path() + "/all.safetensors").wait(h.io.waitScope).value() == 200);
    CHECK(h.coordinator->export_table("users", path, dir.path() + "/x.txt").wait(h.io.waitScope).status().code() ==
          StatusCode::kInvalidArgument);
  }
  // A coordinator with 3 parameter servers that never created the table:
  // the restore creates it and sends every row to the server of its key.
  Harness h({}, /*num_ps=*/3);
  REQUIRE(h.coordinator->restore_checkpoint(path).wait(h.io.waitScope).ok());
  int64_t rows = 0;
  by_shard(h.ps, keys, [&](ps_server::EmbeddingTable& t, const std::vector<int64_t>& mine) {
    rows += t.stats().rows.load();
    Tensor got = t.lookup(ids(mine), false).value();
    for (size_t i = 0; i < mine.size(); ++i) {
      CHECK(got.flat<float>()[2 * i] == saved[mine[i]][0]);
      CHECK(got.flat<float>()[2 * i + 1] == saved[mine[i]][1]);
    }
  });
  CHECK(rows == 200);
  CHECK(h.coordinator->placements().variables.at(0).shards.size() == 3);
}

TEST_CASE("save_checkpoint fails when a shard cannot be read or the directory is empty", "[coordinator]") {
  data::testing::TempDir dir;
  Harness h({}, /*num_ps=*/2);
  h.create_variable(variable("w", floats({1, 2, 3, 4}, {4}), placement::Partitioner::fixed_shards(2)));
  h.ps.tasks[1].shards.erase("w/part_1");
  auto saved = h.coordinator->save_checkpoint(dir.path(), 1, 3).wait(h.io.waitScope);
  CHECK(saved.status().code() == StatusCode::kNotFound);
  CHECK(h.coordinator->save_checkpoint("", 1, 3).wait(h.io.waitScope).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("a checkpoint holds each worker's iterator positions, and restoring it puts them back", "[coordinator]") {
  data::testing::TempDir dir;
  WorkerRecord a, b;
  Harness h;
  h.add_worker(a, {"train_step"}, /*task_index=*/0);
  h.add_worker(b, {"train_step"}, /*task_index=*/1);
  h.create_variable(variable("w", floats({1, 2}, {2})));
  std::string definition = data::Dataset::range(10).serialize();
  int64_t train = h.coordinator->create_per_worker_dataset(definition, "train").wait(h.io.waitScope).value();
  int64_t unnamed = h.coordinator->create_per_worker_dataset(definition).wait(h.io.waitScope).value();
  a.iterator_positions = {{train, "a at 3"}, {unnamed, "a at 7"}};
  b.iterator_positions = {{train, "b at 4"}};  // b cannot save `unnamed` (e.g. a data-service read)

  std::string path = h.coordinator->save_checkpoint(dir.path(), 5, 3).wait(h.io.waitScope).value();
  REQUIRE(fs::exists(fs::path(path) / kIteratorsFile));
  auto reader = checkpoint::CheckpointReader::open(path).value();
  auto states = read_iterator_states(*reader).value();
  CHECK(states == std::map<std::string, std::string>{{"iterator/train/worker-0", "a at 3"},
                                                     {"iterator/train/worker-1", "b at 4"},
                                                     {"iterator/#" + std::to_string(unnamed) + "/worker-0", "a at 7"}});

  auto restored = h.coordinator->restore_checkpoint(path).wait(h.io.waitScope).value();
  CHECK(restored.iterators == 3);
  CHECK(a.restored_iterators ==
        std::vector<std::pair<int64_t, std::string>>{{train, "a at 3"}, {unnamed, "a at 7"}});
  CHECK(b.restored_iterators == std::vector<std::pair<int64_t, std::string>>{{train, "b at 4"}});

  // A worker that refuses its state (a dataset defined differently since)
  // fails the restore, naming the iterator.
  b.restore_answer = Status::InvalidArgument("different dataset definition");
  auto refused = h.coordinator->restore_checkpoint(path).wait(h.io.waitScope);
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK(refused.status().message().find("iterator/train/worker-1") != std::string::npos);
}

TEST_CASE("a save with per-worker datasets reads the iterators while no closure runs", "[coordinator]") {
  data::testing::TempDir dir;
  WorkerRecord a;
  Harness h(a);
  h.create_variable(variable("w", floats({1, 2}, {2})));
  int64_t train =
      h.coordinator->create_per_worker_dataset(data::Dataset::range(10).serialize(), "train").wait(h.io.waitScope).value();
  a.iterator_positions = {{train, "position"}};
  h.coordinator->schedule("train_step", "1").value();
  h.coordinator->schedule("train_step", "2").value();
  h.settle();
  REQUIRE(a.runs.size() == 1);

  auto saving = h.coordinator->save_checkpoint(dir.path(), 1, 3);
  h.settle();
  CHECK(h.ps.tasks[0].saved.empty());  // waits for the running closure
  h.answer(a, 0, std::string("v"));
  // The .tmp directory is made on the pool meanwhile.
  for (int i = 0; i < 200 && h.ps.tasks[0].saved.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    h.settle();
  }
  // Snapshot after the first closure finished and before the second
  // started; then dispatch goes on.
  CHECK(h.ps.tasks[0].saved == std::vector<std::string>{"w"});
  CHECK(a.runs_at_save == 1);
  CHECK(saving.wait(h.io.waitScope).ok());
  h.settle();
  CHECK(a.runs.size() == 2);
}

TEST_CASE("without per-worker datasets a save does not wait for running closures", "[coordinator]") {
  data::testing::TempDir dir;
  WorkerRecord a;
  Harness h(a);
  h.create_variable(variable("w", floats({1, 2}, {2})));
  h.coordinator->schedule("train_step", "1").value();
  h.settle();
  REQUIRE(a.open_runs() == 1);
  CHECK(h.coordinator->save_checkpoint(dir.path(), 1, 3).wait(h.io.waitScope).ok());
  CHECK(a.open_runs() == 1);
  CHECK_FALSE(fs::exists(fs::path(dir.path()) / "ckpt-1" / kIteratorsFile));
}

TEST_CASE("restore_checkpoint has each parameter server read the shards it holds", "[coordinator]") {
  data::testing::TempDir dir;
  Harness h({}, /*num_ps=*/2);
  h.create_variable(variable("w", floats({1, 2, 3, 4}, {4}), placement::Partitioner::fixed_shards(2)));
  h.ps.tasks[0].shards.at("w/part_0").slots["accumulator"] = floats({5, 6}, {2});
  h.ps.tasks[1].shards.at("w/part_1").slots["accumulator"] = floats({7, 8}, {2});
  h.ps.tasks[1].shards.at("w/part_1").step = 5;
  std::string path = h.coordinator->save_checkpoint(dir.path(), 5, 3).wait(h.io.waitScope).value();

  // Training moves on; the restore brings back the saved state.
  h.ps.tasks[0].shards.at("w/part_0") = ShardContents{floats({0, 0}, {2}), {}, 0};
  h.ps.tasks[1].shards.at("w/part_1") = ShardContents{floats({0, 0}, {2}), {}, 0};
  CHECK(h.coordinator->restore_checkpoint(path).wait(h.io.waitScope).value().step == 5);
  CHECK(h.ps.tasks[0].restored == std::vector<std::string>{"w/part_0"});
  CHECK(h.ps.tasks[1].restored == std::vector<std::string>{"w/part_1"});
  CHECK(values_of(h.ps.tasks[0].shards.at("w/part_0").value) == std::vector<float>{1, 2});
  CHECK(values_of(h.ps.tasks[0].shards.at("w/part_0").slots.at("accumulator")) == std::vector<float>{5, 6});
  const ShardContents& restored = h.ps.tasks[1].shards.at("w/part_1");
  CHECK(values_of(restored.value) == std::vector<float>{3, 4});
  CHECK(values_of(restored.slots.at("accumulator")) == std::vector<float>{7, 8});
  CHECK(restored.step == 5);
}

TEST_CASE("restoring a checkpoint older than a variable restores the rest and lists it, strict refuses",
          "[coordinator]") {
  data::testing::TempDir dir;
  Harness h({}, /*num_ps=*/1);
  h.create_variable(variable("w", floats({1, 2}, {2}), placement::Partitioner::none()));
  std::string path = h.coordinator->save_checkpoint(dir.path(), 4, 3).wait(h.io.waitScope).value();
  // Created after the checkpoint; training moves on.
  h.create_variable(variable("later", floats({9, 9}, {2}), placement::Partitioner::none()));
  h.ps.tasks[0].shards.at("w") = ShardContents{floats({0, 0}, {2}), {}, 0};

  auto strict = h.coordinator->restore_checkpoint(path, /*strict=*/true).wait(h.io.waitScope);
  CHECK(strict.status().code() == StatusCode::kNotFound);
  CHECK_THAT(strict.status().message(), Catch::Contains("'later'"));
  CHECK(values_of(h.ps.tasks[0].shards.at("w").value) == std::vector<float>{0, 0});  // nothing restored

  auto lenient = h.coordinator->restore_checkpoint(path).wait(h.io.waitScope);
  REQUIRE(lenient.ok());
  CHECK(lenient->step == 4);
  CHECK(lenient->not_in_checkpoint == std::vector<std::string>{"later"});
  CHECK(values_of(h.ps.tasks[0].shards.at("w").value) == std::vector<float>{1, 2});
  CHECK(values_of(h.ps.tasks[0].shards.at("later").value) == std::vector<float>{9, 9});
}

TEST_CASE("restore_checkpoint creates variables the program has not created, with their optimizer",
          "[coordinator]") {
  data::testing::TempDir dir;
  {
    Harness before({}, /*num_ps=*/2);
    before.create_variable(variable("w", floats({1, 2, 3, 4}, {4}), placement::Partitioner::fixed_shards(2)));
    before.coordinator->save_checkpoint(dir.path(), 3, 3).wait(before.io.waitScope).value();
  }
  Harness h({}, /*num_ps=*/2);
  CHECK(h.coordinator->restore_checkpoint(dir.path()).wait(h.io.waitScope).value().step == 3);
  auto all = h.coordinator->placements();
  CHECK(all.version == 1);
  REQUIRE(all.variables.size() == 1);
  CHECK(all.variables[0].shards.size() == 2);
  CHECK(values_of(h.ps.tasks[1].shards.at("w/part_1").value) == std::vector<float>{3, 4});
  CHECK(h.ps.tasks[0].optimizers.at("w/part_0").kind == Optimizer::Kind::kSgd);
  CHECK(h.ps.tasks[0].optimizers.at("w/part_0").learning_rate == 0.5);
}

TEST_CASE("restore_checkpoint fails with Unavailable while a parameter server is unreachable", "[coordinator]") {
  Harness h({}, /*num_ps=*/2);
  h.ps.go_down(0);
  h.settle();
  auto restored = h.coordinator->restore_checkpoint("/nonexistent").wait(h.io.waitScope);
  CHECK(restored.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(restored.status().message(), Catch::Contains("ps:0"));
}

// ---- Per-worker datasets -------------------------------------------------------------------

TEST_CASE("a per-worker dataset goes to the workers registered now and to those registering later",
          "[coordinator]") {
  CoordinatorConfig config;
  config.expected_workers = 2;
  WorkerRecord a, b;
  Harness h(config);
  h.add_worker(a, {"train_step"}, /*task_index=*/0);
  std::string definition = data::Dataset::range(8).serialize();
  int64_t id = h.coordinator->create_per_worker_dataset(definition).wait(h.io.waitScope).value();
  REQUIRE(a.datasets.size() == 1);
  CHECK(a.datasets[0].first == id);

  h.add_worker(b, {"train_step"}, /*task_index=*/1);
  REQUIRE(b.datasets.size() == 1);  // sent before its registration finished
  CHECK(b.datasets[0].first == id);
  CHECK(a.datasets.size() == 1);
}

TEST_CASE("a per-worker dataset with a bad definition is InvalidArgument", "[coordinator]") {
  Harness h;
  auto id = h.coordinator->create_per_worker_dataset("not a dataset").wait(h.io.waitScope);
  CHECK(id.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a named per-worker dataset is found again under its name, unnamed ones are new each time",
          "[coordinator]") {
  WorkerRecord a;
  Harness h;
  h.add_worker(a, {"train_step", "dataset:make"});
  std::string definition = data::Dataset::range(10).serialize();
  int64_t named = h.coordinator->create_per_worker_dataset(definition, "train").wait(h.io.waitScope).value();
  CHECK(h.coordinator->create_per_worker_dataset(definition, "train").wait(h.io.waitScope).value() == named);
  CHECK(a.datasets.size() == 1);  // not sent again: the worker keeps its iterator
  CHECK(h.coordinator->create_per_worker_dataset(definition).wait(h.io.waitScope).value() != named);
  auto changed = h.coordinator->create_per_worker_dataset(data::Dataset::range(5).serialize(), "train")
                     .wait(h.io.waitScope);
  CHECK(changed.status().code() == StatusCode::kAlreadyExists);
  int64_t function = h.coordinator->create_per_worker_dataset_from_function("make", "eval").wait(h.io.waitScope).value();
  CHECK(h.coordinator->create_per_worker_dataset_from_function("make", "eval").wait(h.io.waitScope).value() == function);
  CHECK(h.coordinator->create_per_worker_dataset(definition, std::string(300, 'n')).wait(h.io.waitScope).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("a per-worker dataset function is called with each worker's input context", "[coordinator]") {
  CoordinatorConfig config;
  config.expected_workers = 3;
  WorkerRecord a, b;
  Harness h(config);
  h.add_worker(a, {"dataset:make"}, /*task_index=*/0);
  auto missing = h.coordinator->create_per_worker_dataset_from_function("other").wait(h.io.waitScope);
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("other"));

  int64_t id = h.coordinator->create_per_worker_dataset_from_function("make").wait(h.io.waitScope).value();
  REQUIRE(a.function_datasets.size() == 1);
  CHECK(a.function_datasets[0] == std::make_tuple(id, std::string("make"), 3, 0));
  h.add_worker(b, {"dataset:make"}, /*task_index=*/2);
  REQUIRE(b.function_datasets.size() == 1);
  CHECK(b.function_datasets[0] == std::make_tuple(id, std::string("make"), 3, 2));
}

TEST_CASE("workers started without a task index get the lowest free one, and their dataset shard with it",
          "[coordinator]") {
  WorkerRecord a, b, c, d;
  Harness h;
  int64_t id_a = h.add_worker(a, {"train_step", "dataset:make"}, /*task_index=*/-1);
  int64_t id_b = h.add_worker(b, {"train_step", "dataset:make"}, /*task_index=*/-1);
  CHECK(h.coordinator->worker_task_index(id_a) == 0);
  CHECK(h.coordinator->worker_task_index(id_b) == 1);
  // A given index is kept; the next unindexed worker skips it.
  int64_t id_c = h.add_worker(c, {"train_step", "dataset:make"}, /*task_index=*/2);
  int64_t id_d = h.add_worker(d, {"train_step", "dataset:make"}, /*task_index=*/-1);
  CHECK(h.coordinator->worker_task_index(id_c) == 2);
  CHECK(h.coordinator->worker_task_index(id_d) == 3);
  CHECK(h.coordinator->worker_task_index(id_d + 100) == -1);
  // Each builds its shard of a per-worker dataset with its index.
  int64_t id = h.coordinator->create_per_worker_dataset_from_function("make").wait(h.io.waitScope).value();
  REQUIRE(b.function_datasets.size() == 1);
  CHECK(b.function_datasets[0] == std::make_tuple(id, std::string("make"), 4, 1));
  REQUIRE(d.function_datasets.size() == 1);
  CHECK(d.function_datasets[0] == std::make_tuple(id, std::string("make"), 4, 3));
  // Closures carry the index too: one dispatched before the worker has read
  // its registration reply still sees it.
  for (int i = 0; i < 4; ++i) h.coordinator->schedule("train_step", "x").value();
  h.settle();
  for (auto [record, index] : {std::pair{&a, 0}, std::pair{&b, 1}, std::pair{&c, 2}, std::pair{&d, 3}}) {
    REQUIRE(record->runs.size() == 1);
    CHECK(record->runs[0].run.worker_index == index);
  }
}

}  // namespace capstan::coordinator
