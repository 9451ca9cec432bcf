// The worker core with an in-memory stand-in for the parameter servers.
#include "daemons/worker_server/worker.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include "capstan/closure.h"

namespace capstan::worker_server {
namespace {

// Variables held in memory; records what the worker asked of it.
class FakeVariables final : public VariableAccess {
 public:
  Status refresh_if_older(int64_t version) override {
    MutexLock lock(mutex_);
    refreshed_to = std::max(refreshed_to, version);
    return Status::Ok();
  }
  Result<Tensor> read(const std::string& variable) override {
    MutexLock lock(mutex_);
    auto it = values.find(variable);
    if (it == values.end()) return Status::NotFound("variable '" + variable + "' does not exist");
    return it->second;
  }
  Result<Tensor> gather(const std::string& variable, const Tensor& ids) override {
    MutexLock lock(mutex_);
    calls.push_back("gather " + variable);
    return ids;
  }
  Status assign(const std::string& variable, const Tensor& value) override {
    MutexLock lock(mutex_);
    values[variable] = value;
    calls.push_back("assign " + variable);
    return Status::Ok();
  }
  Status assign_add(const std::string& variable, const Tensor& delta) override {
    MutexLock lock(mutex_);
    calls.push_back("assign_add " + variable);
    return Status::Ok();
  }
  Status apply_dense(const std::string& variable, const Tensor& gradient, int64_t,
                     std::optional<double>) override {
    MutexLock lock(mutex_);
    calls.push_back("apply_dense " + variable);
    return Status::Ok();
  }
  Status apply_sparse(const std::string& variable, const Tensor&, const Tensor&, int64_t,
                      std::optional<double>) override {
    MutexLock lock(mutex_);
    calls.push_back("apply_sparse " + variable);
    return Status::Ok();
  }

  Mutex mutex_;
  int64_t refreshed_to GUARDED_BY(mutex_) = -1;
  std::map<std::string, Tensor> values GUARDED_BY(mutex_);
  std::vector<std::string> calls GUARDED_BY(mutex_);
};

int64_t scalar(const Element& e, size_t i) { return e.components.at(i).flat<int64_t>()[0]; }

Element dataset_arg(int64_t id) { return Element{{Tensor::scalar<int64_t>(id)}, {}}; }

struct Fixture {
  Fixture() {
    functions.register_closure("context", [](ClosureContext& ctx, const Element&) -> Result<Element> {
      return Element{{Tensor::scalar<int64_t>(ctx.attempt()), Tensor::scalar<int64_t>(ctx.num_workers()),
                      Tensor::scalar<int64_t>(ctx.worker_index())},
                     {}};
    });
    functions.register_closure("step", [](ClosureContext& ctx, const Element&) -> Result<Element> {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor w, ctx.read("w"));
      CAPSTAN_RETURN_IF_ERROR(ctx.apply_gradients("w", w));
      CAPSTAN_RETURN_IF_ERROR(ctx.apply_sparse_gradients("table", Tensor::scalar<int64_t>(1), w));
      CAPSTAN_RETURN_IF_ERROR(ctx.assign_add("count", Tensor::scalar<float>(1)));
      return Element{{w}, {}};
    });
    functions.register_closure("next", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
      CAPSTAN_ASSIGN_OR_RETURN(data::Iterator * it, ctx.iterator(args.components.at(0)));
      CAPSTAN_ASSIGN_OR_RETURN(auto next, it->get_next());
      return Element{{next ? next->components.at(0) : Tensor::scalar<int64_t>(-1)}, {}};
    });
    functions.register_closure("fail", [](ClosureContext&, const Element&) -> Result<Element> {
      return Status::InvalidArgument("bad batch");
    });
    // Counts steps until cancelled (at most 10 s), then returns the count.
    functions.register_closure("until_cancelled", [this](ClosureContext& ctx, const Element&) -> Result<Element> {
      started.store(true);
      int64_t steps = 0;
      auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!ctx.cancelled() && std::chrono::steady_clock::now() < give_up) {
        ++steps;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      saw_cancel.store(ctx.cancelled());
      return Element{{Tensor::scalar<int64_t>(steps)}, {}};
    });
    functions.register_dataset_function("shard_of_10", [](const InputContext& input) {
      return data::Dataset::range(10).shard(input.num_input_pipelines, input.input_pipeline_id);
    });
  }
  Result<Element> run(const std::string& function, Element args = {}, int attempt = 1, int num_workers = 1,
                      int64_t version = 0) {
    return worker.run_closure({function, std::move(args), version, attempt, num_workers});
  }

  std::atomic<bool> started{false};
  std::atomic<bool> saw_cancel{false};
  FunctionRegistry functions;
  FakeVariables variables;
  Worker worker{functions, variables, /*task_index=*/3};
};

TEST_CASE("worker: a closure sees its attempt, the number of workers and this worker's index", "[worker]") {
  Fixture f;
  auto result = f.run("context", {}, /*attempt=*/2, /*num_workers=*/5);
  REQUIRE(result.ok());
  CHECK(scalar(*result, 0) == 2);
  CHECK(scalar(*result, 1) == 5);
  CHECK(scalar(*result, 2) == 3);
}

TEST_CASE("worker: variable calls go to the variables, placements are refreshed to the closure's version",
          "[worker]") {
  Fixture f;
  {
    MutexLock lock(f.variables.mutex_);
    f.variables.values["w"] = Tensor::scalar<float>(2.5f);
  }
  auto result = f.run("step", {}, 1, 1, /*version=*/7);
  REQUIRE(result.ok());
  CHECK(result->components[0].flat<float>()[0] == 2.5f);
  MutexLock lock(f.variables.mutex_);
  CHECK(f.variables.refreshed_to == 7);
  CHECK(f.variables.calls == std::vector<std::string>{"apply_dense w", "apply_sparse table", "assign_add count"});
}

TEST_CASE("worker: a run reports where its time went: input, parameter servers, the rest", "[worker]") {
  Fixture f;
  f.functions.register_closure("slow_step", [](ClosureContext& ctx, const Element& args) -> Result<Element> {
    CAPSTAN_ASSIGN_OR_RETURN(data::Iterator * it, ctx.iterator(args.components.at(0)));
    CAPSTAN_RETURN_IF_ERROR(it->get_next().status());
    CAPSTAN_RETURN_IF_ERROR(ctx.read("w").status());
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // compute
    return Element{};
  });
  {
    MutexLock lock(f.variables.mutex_);
    f.variables.values["w"] = Tensor::scalar<float>(1.f);
  }
  REQUIRE(f.worker.create_dataset(1, data::Dataset::range(3).serialize()).ok());
  RunInfo info;
  REQUIRE(f.worker.run_closure({"slow_step", dataset_arg(1)}, &info).ok());
  CHECK(info.phases.input > 0);
  CHECK(info.phases.ps > 0);
  CHECK(info.phases.collective == 0);
  CHECK(info.phases.compute() >= 0.029);
  CHECK(info.phases.total >= info.phases.input + info.phases.ps + 0.029);
  CHECK_FALSE(info.took_step_input);
  // A failed run reports its time too; a batch reports each run's.
  RunInfo failed;
  CHECK_FALSE(f.worker.run_closure({"fail", Element{}}, &failed).ok());
  CHECK(failed.phases.total > 0);
  std::vector<RunInfo> infos;
  f.worker.run_closures({RunClosureRequest{"slow_step", dataset_arg(1)}, RunClosureRequest{"context", Element{}}}, &infos);
  REQUIRE(infos.size() == 2);
  CHECK(infos[0].phases.compute() >= 0.029);
  CHECK(infos[1].phases.total < infos[0].phases.total);
}

TEST_CASE("worker: an unknown closure is NotFound naming it, a closure's error names the closure", "[worker]") {
  Fixture f;
  CHECK(f.worker.check_closure("nope").code() == StatusCode::kNotFound);
  auto missing = f.run("nope");
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("'nope'"));
  auto failed = f.run("fail");
  CHECK(failed.status().code() == StatusCode::kInvalidArgument);
  CHECK(failed.status().message() == "fail: bad batch");
  // A variable that does not exist fails the closure, not the worker.
  auto no_variable = f.run("step");
  CHECK(no_variable.status().code() == StatusCode::kNotFound);
  CHECK(f.run("context").ok());
}

TEST_CASE("worker: a batch runs in order, after a failure the rest do not start", "[worker]") {
  Fixture f;
  auto request = [](const std::string& function) {
    RunClosureRequest r;
    r.function = function;
    return Result<RunClosureRequest>(std::move(r));
  };
  auto outcomes = f.worker.run_closures(
      {request("context"), Result<RunClosureRequest>(Status::InvalidArgument("bad args")), request("context")});
  REQUIRE(outcomes.size() == 3);
  CHECK(outcomes[0].ok());
  CHECK(outcomes[1].status().code() == StatusCode::kInvalidArgument);
  CHECK(outcomes[2].status().code() == StatusCode::kAborted);
  CHECK_THAT(outcomes[2].status().message(), Catch::Contains("bad args"));
  outcomes = f.worker.run_closures({request("context"), request("fail"), request("context"), request("context")});
  REQUIRE(outcomes.size() == 4);
  CHECK(outcomes[0].ok());
  CHECK(outcomes[1].status().message() == "fail: bad batch");
  CHECK(outcomes[2].status().code() == StatusCode::kAborted);
  CHECK(outcomes[3].status().code() == StatusCode::kAborted);
  CHECK(f.worker.run_closures({}).empty());
}

TEST_CASE("worker: the names it registers are its closures and dataset functions", "[worker]") {
  Fixture f;
  auto names = f.worker.function_names();
  CHECK(std::count(names.begin(), names.end(), "step") == 1);
  CHECK(std::count(names.begin(), names.end(), "dataset:shard_of_10") == 1);
}

TEST_CASE("worker: per-worker iterators are created, replaced and forgotten", "[worker]") {
  Fixture f;
  REQUIRE(f.worker.create_dataset(1, data::Dataset::range(3).serialize()).ok());
  CHECK(scalar(f.run("next", dataset_arg(1)).value(), 0) == 0);
  CHECK(scalar(f.run("next", dataset_arg(1)).value(), 0) == 1);
  // Sent again with another definition and no uid: a fresh iterator.
  REQUIRE(f.worker.create_dataset(1, data::Dataset::range(100, 103).serialize()).ok());
  CHECK(scalar(f.run("next", dataset_arg(1)).value(), 0) == 100);

  auto unknown = f.run("next", dataset_arg(9));
  CHECK(unknown.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(unknown.status().message(), Catch::Contains("per-worker dataset 9"));
  auto not_an_arg = f.run("next", Element{{Tensor::scalar<float>(1)}, {}});
  CHECK(not_an_arg.status().code() == StatusCode::kInvalidArgument);

  f.worker.clear_datasets();
  CHECK(f.run("next", dataset_arg(1)).status().code() == StatusCode::kFailedPrecondition);

  auto bad = f.worker.create_dataset(2, "not a definition");
  CHECK_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Contains("per-worker dataset 2"));
  // A closure asking for it learns why it is missing.
  auto missing = f.run("next", dataset_arg(2));
  CHECK(missing.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(missing.status().message(), Catch::Contains("per-worker dataset 2 has no iterator on this worker: "
                                                         "building it failed: "));
  CHECK_THAT(missing.status().message(), Catch::Contains(bad.message()));
  // One never sent says that instead.
  CHECK_THAT(f.run("next", dataset_arg(9)).status().message(), Catch::Contains("the coordinator has not sent it"));
}

TEST_CASE("worker: registering again keeps the iterators a restarted coordinator sends with the same uid",
          "[worker]") {
  Fixture f;
  const std::string range = data::Dataset::range(10).serialize();
  REQUIRE(f.worker.create_dataset(1, range, /*uid=*/77).ok());
  REQUIRE(f.worker.create_dataset(2, range, /*uid=*/88).ok());
  REQUIRE(f.worker.create_dataset(3, range, /*uid=*/0).ok());
  for (int64_t id : {1, 2, 3}) {
    CHECK(scalar(f.run("next", dataset_arg(id)).value(), 0) == 0);
    CHECK(scalar(f.run("next", dataset_arg(id)).value(), 0) == 1);
  }
  f.worker.mark_datasets_stale();
  REQUIRE(f.worker.create_dataset(1, range, 77).ok());  // the same dataset: kept where it was
  REQUIRE(f.worker.create_dataset(3, range, 0).ok());   // no uid: built anew
  f.worker.drop_stale_datasets();
  CHECK(scalar(f.run("next", dataset_arg(1)).value(), 0) == 2);
  CHECK(scalar(f.run("next", dataset_arg(3)).value(), 0) == 0);
  CHECK(f.run("next", dataset_arg(2)).status().code() == StatusCode::kFailedPrecondition);  // not sent again
  // Another uid under the same id (a new coordinator's dataset): built anew.
  REQUIRE(f.worker.create_dataset(1, range, 99).ok());
  CHECK(scalar(f.run("next", dataset_arg(1)).value(), 0) == 0);
}

TEST_CASE("worker: a per-worker iterator's position is saved and restored", "[worker]") {
  Fixture f;
  REQUIRE(f.worker.create_dataset(1, data::Dataset::range(10).shuffle(4, 3).serialize()).ok());
  REQUIRE(f.worker.create_dataset_from_function(2, "shard_of_10", InputContext{3, 1}).ok());
  for (int i = 0; i < 3; ++i) REQUIRE(f.run("next", dataset_arg(1)).ok());
  REQUIRE(f.run("next", dataset_arg(2)).ok());
  auto shuffled = f.worker.save_iterator(1);
  auto sharded = f.worker.save_iterator(2);
  REQUIRE(shuffled.ok());
  REQUIRE(sharded.ok());
  std::vector<int64_t> after;
  for (int i = 0; i < 4; ++i) after.push_back(scalar(f.run("next", dataset_arg(1)).value(), 0));
  CHECK(scalar(f.run("next", dataset_arg(2)).value(), 0) == 4);

  REQUIRE(f.worker.restore_iterator(1, *shuffled).ok());
  REQUIRE(f.worker.restore_iterator(2, *sharded).ok());
  std::vector<int64_t> again;
  for (int i = 0; i < 4; ++i) again.push_back(scalar(f.run("next", dataset_arg(1)).value(), 0));
  CHECK(again == after);
  CHECK(scalar(f.run("next", dataset_arg(2)).value(), 0) == 4);

  // Another dataset's state is refused and the iterator stays where it was.
  auto refused = f.worker.restore_iterator(2, *shuffled);
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.message(), Catch::Contains("per-worker dataset 2"));
  CHECK(scalar(f.run("next", dataset_arg(2)).value(), 0) == 7);
  CHECK(f.worker.save_iterator(9).status().code() == StatusCode::kNotFound);
  CHECK(f.worker.restore_iterator(9, *shuffled).code() == StatusCode::kNotFound);
}

TEST_CASE("worker: a dataset function gets TF's input context", "[worker]") {
  Fixture f;
  REQUIRE(f.worker.create_dataset_from_function(4, "shard_of_10", InputContext{3, 1}).ok());
  std::vector<int64_t> seen;
  for (int i = 0; i < 4; ++i) seen.push_back(scalar(f.run("next", dataset_arg(4)).value(), 0));
  CHECK(seen == std::vector<int64_t>{1, 4, 7, -1});
  CHECK(f.worker.create_dataset_from_function(5, "missing", InputContext{}).code() == StatusCode::kNotFound);
}

TEST_CASE("worker: closures running at once share an iterator, each element is read once", "[worker]") {
  Fixture f;
  REQUIRE(f.worker.create_dataset(1, data::Dataset::range(400).serialize()).ok());
  Mutex mutex;
  std::multiset<int64_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&f, &mutex, &seen]() {
      for (int i = 0; i < 100; ++i) {
        int64_t v = scalar(f.run("next", dataset_arg(1)).value(), 0);
        MutexLock lock(mutex);
        seen.insert(v);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(seen.size() == 400);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 400);
  CHECK(*seen.begin() == 0);
  CHECK(*seen.rbegin() == 399);
}

}  // namespace
TEST_CASE("worker: a cancelled closure sees cancelled() and its result is abandoned", "[worker]") {
  Fixture f;
  RunClosureRequest request;
  request.function = "until_cancelled";
  request.closure_id = 41;
  Result<Element> result = Status::Unknown("not run");
  std::thread runner([&]() { result = f.worker.run_closure(request); });
  while (!f.started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  f.worker.cancel_closure(41);
  runner.join();
  CHECK(f.saw_cancel.load());
  CHECK(result.status().code() == StatusCode::kCancelled);
  CHECK_THAT(result.status().message(), Catch::Contains("closure 41") && Catch::Contains("abandoned"));

  // A cancel that overtakes its run: the closure does not run at all.
  f.started.store(false);
  f.worker.cancel_closure(42);
  request.closure_id = 42;
  CHECK(f.worker.run_closure(request).status().code() == StatusCode::kCancelled);
  CHECK_FALSE(f.started.load());
  // Other ids are not affected.
  request.function = "context";
  request.closure_id = 43;
  CHECK(f.worker.run_closure(request).ok());
}

TEST_CASE("worker: a closure sees its deadline, past it, cancelled() is true", "[worker]") {
  Fixture f;
  f.functions.register_closure("deadline", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.deadline().time_since_epoch()).count();
    return Element{{Tensor::scalar<int64_t>(ms), Tensor::scalar<int64_t>(ctx.cancelled() ? 1 : 0)}, {}};
  });
  RunClosureRequest request;
  request.function = "deadline";
  auto none = f.worker.run_closure(request);
  REQUIRE(none.ok());
  CHECK(scalar(*none, 1) == 0);
  request.deadline = std::chrono::system_clock::time_point(std::chrono::milliseconds(1000));  // 1970: past
  auto past = f.worker.run_closure(request);
  REQUIRE(past.ok());
  CHECK(scalar(*past, 0) == 1000);
  CHECK(scalar(*past, 1) == 1);
}

}  // namespace capstan::worker_server
