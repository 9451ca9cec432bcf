#include "tools/evaluator/evaluator.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "capstan/data/dataset.h"
#include "daemons/coordinator/checkpointing.h"
#include "data/test_util.h"

namespace capstan::evaluator {
namespace {

Tensor floats(std::vector<float> values, Shape shape) { return Tensor::from_vector(values, shape).value(); }

// A checkpoint of "w" (float32[2]) and "emb" (float32[3, 2], 2 shards).
std::string write_model(const std::string& dir) {
  coordinator::VariableState w;
  w.name = "w";
  w.dtype = DType::kFloat32;
  w.shape = {2};
  w.shards.push_back({{"w", 0, 0, 2}, floats({0.5f, -1}, {2}), {}, 9, {}, 0});
  coordinator::VariableState emb;
  emb.name = "emb";
  emb.dtype = DType::kFloat32;
  emb.shape = {3, 2};
  emb.shards.push_back({{"emb/part_0", 0, 0, 2}, floats({0, 1, 2, 3}, {2, 2}), {}, 9, {}, 0});
  emb.shards.push_back({{"emb/part_1", 1, 2, 1}, floats({4, 5}, {1, 2}), {}, 9, {}, 0});
  // "users": an embedding table of dim 2 (default value -1) with keys 7
  // and 1 << 40 on two parameter servers.
  coordinator::VariableState users;
  users.name = "users";
  users.dtype = DType::kFloat32;
  users.optimizer = Optimizer::sgd(0.1);
  EmbeddingTableOptions options;
  options.default_value = -1;
  users.table = EmbeddingTableSpec{"users", 2, DType::kFloat32, EmbeddingInitializer::zeros(), Optimizer::sgd(0.1),
                                   options};
  users.table_shards = 2;
  auto table_shard = [](const char* name, int task, int64_t key, std::vector<float> row) {
    coordinator::ShardState s;
    s.name = name;
    s.ps_task = task;
    s.table_rows.keys = Tensor::from_vector<int64_t>({key}, {1}).value();
    s.table_rows.values = floats(std::move(row), {1, 2});
    s.table_rows.meta = Tensor::zeros(DType::kInt64, {1, ps::kMetaColumns}).value();
    return s;
  };
  users.shards.push_back(table_shard("users/part_0", 0, 7, {0.25f, 0.5f}));
  users.shards.push_back(table_shard("users/part_1", 1, int64_t{1} << 40, {3, 4}));
  return coordinator::write_checkpoint(dir, 9, 3, {w, emb, users}).value();
}

void register_functions(FunctionRegistry& functions) {
  // Predictions for 4 examples from the checkpoint's values: 3 right, and
  // a count to sum.
  functions.register_closure("eval", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor w, ctx.read("w"));
    CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, ctx.gather("emb", Tensor::from_vector<int64_t>({2, 0}, {2}).value()));
    if (w.flat<float>()[0] != 0.5f || rows.flat<float>()[0] != 4 || rows.flat<float>()[3] != 1) {
      return Status::Internal("unexpected values");
    }
    return Element{{floats({0.9f, 0.2f, 0.7f, 0.4f}, {4}), floats({1, 0, 1, 1}, {4}), Tensor::scalar<int64_t>(2)},
                   {"probabilities", "labels", "batches"}};
  });
  // Ids of any shape, as the parameter servers take them.
  functions.register_closure("gather_2d", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, ctx.gather("emb", Tensor::from_vector<int64_t>({2, 0, 1, 2}, {2, 2}).value()));
    if (rows.shape() != Shape{2, 2, 2} || rows.flat<float>()[0] != 4 || rows.flat<float>()[7] != 5) {
      return Status::Internal("gathered " + rows.debug_string());
    }
    return Element{{Tensor::scalar<int64_t>(1)}, {"ok"}};
  });
  // A table's rows from the checkpoint; a key it lacks gets the default row
  // and is not inserted, whatever `insert` says.
  functions.register_closure("lookup_table", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    Tensor ids = Tensor::from_vector<int64_t>({int64_t{1} << 40, 99, 7}, {3}).value();
    CAPSTAN_ASSIGN_OR_RETURN(Tensor rows, ctx.lookup("users", ids, /*insert=*/true));
    CAPSTAN_ASSIGN_OR_RETURN(Tensor again, ctx.lookup("users", ids, true));
    auto r = rows.flat<float>();
    if (rows.shape() != Shape{3, 2} || r[0] != 3 || r[1] != 4 || r[2] != -1 || r[3] != -1 || r[4] != 0.25f ||
        r[5] != 0.5f || !again.equals(rows)) {
      return Status::Internal("looked up " + rows.debug_string());
    }
    return Element{{Tensor::scalar<int64_t>(1)}, {"ok"}};
  });
  functions.register_closure("train", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    CAPSTAN_RETURN_IF_ERROR(ctx.assign_add("w", floats({1, 1}, {2})));
    return Element{};
  });
  functions.register_closure("missing", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    CAPSTAN_RETURN_IF_ERROR(ctx.read("no_such").status());
    return Element{};
  });
  // The number of rows of the next batch of the dataset.
  functions.register_closure("count_rows", [](ClosureContext& ctx, const Element&) -> Result<Element> {
    CAPSTAN_ASSIGN_OR_RETURN(data::Iterator * it, ctx.iterator(Tensor()));
    CAPSTAN_ASSIGN_OR_RETURN(auto next, it->get_next());
    if (!next) return Status::OutOfRange("end");
    return Element{{Tensor::scalar<double>(static_cast<double>(next->components[0].shape()[0]))}, {"rows"}};
  });
  functions.register_dataset_function("five", [](const InputContext&) { return data::Dataset::range(5).batch(2); });
}

double metric(const Metrics& m, const std::string& name) {
  for (const auto& [n, v] : m.values) {
    if (n == name) return v;
  }
  FAIL("no metric " << name);
  return 0;
}

// A checkpoint written to a temporary directory, and the test's functions.
struct Fixture {
  Fixture() : path(write_model(dir.path())) { register_functions(functions); }
  Result<Metrics> evaluate(const EvaluatorOptions& options) { return evaluate_checkpoint(functions, path, options); }
  // Evaluates with `closure` and the other options' defaults.
  Result<Metrics> evaluate(const std::string& closure) {
    EvaluatorOptions options;
    options.closure = closure;
    return evaluate(options);
  }

  data::testing::TempDir dir;
  std::string path;
  FunctionRegistry functions;
};

}  // namespace

TEST_CASE("the evaluator runs a closure against a checkpoint in memory and sums its metrics", "[evaluator]") {
  Fixture f;
  EvaluatorOptions options;
  options.closure = "eval";
  options.steps = 3;
  auto m = f.evaluate(options);
  REQUIRE(m.ok());
  CHECK(m->step == 9);
  CHECK(m->calls == 3);
  CHECK(metric(*m, "accuracy") == Approx(0.75));
  CHECK(metric(*m, "examples") == 12);
  // Positives 0.9, 0.7, 0.4 against the negative 0.2: every pair ordered.
  CHECK(metric(*m, "auc") == Approx(1.0));
  double expected_loss = -(std::log(0.9) + std::log(0.8) + std::log(0.7) + std::log(0.4)) / 4;
  CHECK(metric(*m, "log_loss") == Approx(expected_loss).epsilon(1e-5));
  CHECK(metric(*m, "batches") == 6);
  CHECK(metrics_json(*m).find("\"step\":9,\"accuracy\":0.75") != std::string::npos);
}

TEST_CASE("the evaluator gathers as the parameter servers do: the ids' shape, then the row's",
          "[evaluator]") {
  Fixture f;
  auto m = f.evaluate("gather_2d");
  REQUIRE(m.ok());
  CHECK(metric(*m, "ok") == 1);
}

TEST_CASE("the evaluator looks embedding tables up in the checkpoint, never inserting", "[evaluator]") {
  Fixture f;
  auto m = f.evaluate("lookup_table");
  INFO(m.status().to_string());
  REQUIRE(m.ok());
  CHECK(metric(*m, "ok") == 1);
}

TEST_CASE("the evaluator never trains and names what is missing", "[evaluator]") {
  Fixture f;
  EvaluatorOptions options;
  options.closure = "train";
  auto trained = f.evaluate(options);
  CHECK(trained.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(trained.status().message(), Catch::Contains("does not update variables ('w')"));
  options.closure = "missing";
  auto missing = f.evaluate(options);
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("no_such") && Catch::Contains(f.path));
  options.closure = "nope";
  CHECK_THAT(f.evaluate(options).status().message(),
             Catch::Contains("'nope'") && Catch::Contains("count_rows"));
  options.closure = "eval";
  CHECK(evaluate_checkpoint(f.functions, f.dir.path() + "/ckpt-404", options).status().code() == StatusCode::kNotFound);
}

TEST_CASE("with a dataset function the closure runs until the dataset ends", "[evaluator]") {
  Fixture f;
  EvaluatorOptions options;
  options.closure = "count_rows";
  options.dataset_function = "five";
  options.steps = 0;
  auto m = f.evaluate(options);
  REQUIRE(m.ok());
  CHECK(m->calls == 3);
  CHECK(metric(*m, "rows") == 5);
  options.steps = 2;
  CHECK(f.evaluate(options).value().calls == 2);
  options.dataset_function = "";
  CHECK(f.evaluate(options).status().code() == StatusCode::kFailedPrecondition);
}

}  // namespace capstan::evaluator
