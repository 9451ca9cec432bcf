// ModelCheckpoints alone: fake parameter servers, real checkpoint files in a
// temporary directory written and read on a real pool.
#include "daemons/coordinator/model_checkpoints.h"

#include <catch2/catch.hpp>

#include "daemons/coordinator/test_fakes.h"
#include "data/test_util.h"

namespace capstan::coordinator {
namespace {

using testing::floats;
using testing::values_of;

struct Fixture : testing::CoordinatorParts {
  ~Fixture() { pool.join(); }  // before the parts below go

  void create(const std::string& name, std::vector<float> values) {
    auto n = static_cast<int64_t>(values.size());
    VariableRequest request{name, floats(std::move(values), {n}), Optimizer::sgd(0.1), placement::Partitioner::none()};
    REQUIRE(wait(variables.create(std::move(request))).ok());
  }

  Strategies strategies{workers, variables, gate, context};
  PerWorkerDatasets datasets{0, log, [](int64_t, const PerWorkerDataset&) { return Status::Ok(); }};
  int pauses = 0;
  ModelCheckpoints checkpoints{variables, strategies, datasets, workers, pool, [this]() {
                                 ++pauses;
                                 return kj::Promise<std::shared_ptr<void>>(std::make_shared<int>(0));
                               }};
};

TEST_CASE("a saved checkpoint restores the variables' values, and names the checkpoint restored",
          "[coordinator][model_checkpoints]") {
  data::testing::TempDir dir;
  Fixture f;
  f.create("w", {1, 2});
  auto path = f.wait(f.checkpoints.save(dir.path(), 7, 3));
  REQUIRE(path.ok());
  CHECK(*path == dir.path() + "/ckpt-7");
  CHECK(f.pauses == 0);  // no per-worker datasets: nothing to keep in step
  f.ps.tasks[0].shards.at("w").value = floats({5, 5}, {2});
  auto restored = f.wait(f.checkpoints.restore(dir.path(), /*strict=*/false));
  REQUIRE(restored.ok());
  CHECK(restored->path == dir.path() + "/ckpt-7");
  CHECK(restored->step == 7);
  CHECK(restored->not_in_checkpoint.empty());
  CHECK(values_of(f.ps.tasks[0].shards.at("w").value) == std::vector<float>{1, 2});
}

TEST_CASE("a variable the checkpoint lacks keeps its value and is listed, a strict restore refuses it",
          "[coordinator][model_checkpoints]") {
  data::testing::TempDir dir;
  Fixture f;
  f.create("w", {1, 2});
  REQUIRE(f.wait(f.checkpoints.save(dir.path(), 1, 3)).ok());
  f.create("b", {3});
  auto strict = f.wait(f.checkpoints.restore(dir.path(), /*strict=*/true));
  CHECK(strict.status().code() == StatusCode::kNotFound);
  auto restored = f.wait(f.checkpoints.restore(dir.path(), /*strict=*/false));
  REQUIRE(restored.ok());
  CHECK(restored->not_in_checkpoint == std::vector<std::string>{"b"});
  CHECK(values_of(f.ps.tasks[0].shards.at("b").value) == std::vector<float>{3});
}

TEST_CASE("a restore creates the variables the program has not created again", "[coordinator][model_checkpoints]") {
  data::testing::TempDir dir;
  {
    Fixture before;
    before.create("w", {1, 2});
    REQUIRE(before.wait(before.checkpoints.save(dir.path(), 4, 3)).ok());
  }
  Fixture f;  // a fresh coordinator over fresh parameter servers
  auto restored = f.wait(f.checkpoints.restore(dir.path() + "/ckpt-4", /*strict=*/true));
  REQUIRE(restored.ok());
  CHECK(f.variables.contains("w"));
  CHECK(values_of(f.ps.tasks[0].shards.at("w").value) == std::vector<float>{1, 2});
}

}  // namespace
}  // namespace capstan::coordinator
