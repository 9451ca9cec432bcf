// ModelCheckpoints alone: fake parameter servers, real checkpoint files in a
// temporary directory written and read on a real pool.
#include "daemons/coordinator/model_checkpoints.h"

#include <catch2/catch.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/mirrored_files.h"
#include "daemons/coordinator/test_fakes.h"
#include "data/test_util.h"

namespace capstan::coordinator {
namespace {

using testing::floats;
using testing::values_of;
using testing::WorkerRecord;

// Strategy "s": one Adam variable "w" of 2 floats.
std::vector<MirroredVariableInit> mirrored_model() {
  return {{"w", floats({0.5f, 0.25f}, {2}), Optimizer::adam(0.1)}};
}

StrategyConfig one_replica() {
  StrategyConfig c;
  c.min_replicas = 1;
  c.settings.timeout = std::chrono::milliseconds(5000);
  return c;
}

// A replica's state at `step`: w = [1, 2], Adam's slots m and v.
training::MirroredState trained(int64_t step) {
  training::MirroredState state;
  state.step = step;
  state.variables.push_back({"w", floats({1, 2}, {2}), {{"m", floats({0.1f, 0.2f}, {2})},
                                                        {"v", floats({0.3f, 0.4f}, {2})}}});
  return state;
}

struct Fixture : testing::CoordinatorParts {
  ~Fixture() { pool.join(); }  // before the parts below go

  void create(const std::string& name, std::vector<float> values) {
    auto n = static_cast<int64_t>(values.size());
    VariableRequest request{name, floats(std::move(values), {n}), Optimizer::sgd(0.1), placement::Partitioner::none()};
    REQUIRE(wait(variables.create(std::move(request))).ok());
  }

  WorkerTimes times{nullptr};
  Strategies strategies{workers, variables, gate, context, pool, times};
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

// One step of strategy "s" on every member, answered.
void run_step(Fixture& f, std::vector<WorkerRecord*> members) {
  auto running = f.strategies.run_step("s", "sync_step", "args");
  f.ws.poll();
  for (WorkerRecord* m : members) {
    REQUIRE_FALSE(m->runs.empty());
    m->reply(m->runs.size() - 1, std::string("ok"));
  }
  REQUIRE(f.wait(running).ok());
}

TEST_CASE("rank 0 of a strategy writes its file itself, and a restore sends the checkpoint's path, not values",
          "[coordinator][model_checkpoints][strategy]") {
  data::testing::TempDir dir;
  Fixture f;
  WorkerRecord a, b;
  f.add_worker(a, 0, {"sync_step"});
  f.add_worker(b, 1, {"sync_step"});
  REQUIRE(f.strategies.create("s", mirrored_model(), one_replica()).ok());
  run_step(f, {&a, &b});
  a.replica_state = trained(4);
  b.replica_state = trained(99);  // never asked: rank 0 writes
  auto path = f.wait(f.checkpoints.save(dir.path(), 9, 3));
  REQUIRE(path.ok());
  CHECK(a.replica_saves == std::vector<std::string>{dir.path() + "/ckpt-9.tmp"});
  CHECK(b.replica_saves.empty());
  // The manifest lists the worker's file with the size and CRC32C it
  // reported (a reader checks them), the slots and the step.
  auto reader = checkpoint::CheckpointReader::open(*path).value();
  const auto* w = reader->manifest().find_variable("w");
  REQUIRE(w != nullptr);
  CHECK(w->shards.at(0).file == "mirrored-s.safetensors");
  CHECK(w->slots == std::vector<std::string>{"m", "v"});
  CHECK(w->optimizer_step == 4);
  CHECK(w->optimizer.kind == Optimizer::adam(0.1).kind);
  CHECK(values_of(reader->read_slot("w", "v").value()) == std::vector<float>{0.3f, 0.4f});

  // A restore reads no value: the next group's source is given the path.
  auto restored = f.wait(f.checkpoints.restore(*path, /*strict=*/true));
  REQUIRE(restored.ok());
  // Read before a group takes the seed: from the checkpoint, on the pool.
  auto read = f.wait(f.strategies.read_mirrored("s", "w"));
  REQUIRE(read.ok());
  CHECK(values_of(read->first) == std::vector<float>{1, 2});
  CHECK(read->second == 4);
  run_step(f, {&a, &b});
  const training::ReplicaForm& seeded = a.forms.back();
  CHECK(seeded.source == 0);
  CHECK(seeded.seed_checkpoint == *path);
  CHECK(seeded.seed_from_checkpoint == std::vector<std::string>{"w"});
  CHECK_FALSE(seeded.seed.has_value());
  CHECK(b.forms.back().seed_checkpoint.empty());
}

TEST_CASE("a strategy no group has taken yet is saved from its seed: the initial values, or a restored checkpoint",
          "[coordinator][model_checkpoints][strategy]") {
  data::testing::TempDir dir;
  Fixture f;
  WorkerRecord a;
  f.add_worker(a, 0, {"sync_step"});
  REQUIRE(f.strategies.create("s", mirrored_model(), one_replica()).ok());
  auto initial = f.wait(f.checkpoints.save(dir.path(), 1, 5));
  REQUIRE(initial.ok());
  CHECK(a.replica_saves.empty());
  CHECK(values_of(checkpoint::CheckpointReader::open(*initial).value()->read_variable("w").value()) ==
        std::vector<float>{0.5f, 0.25f});
  // Trained, saved by the worker, restored, saved again before any step:
  // the second checkpoint holds the first's values, slots and step.
  run_step(f, {&a});
  a.replica_state = trained(6);
  auto trained_path = f.wait(f.checkpoints.save(dir.path(), 6, 5));
  REQUIRE(trained_path.ok());
  REQUIRE(f.wait(f.checkpoints.restore(*trained_path, false)).ok());
  auto again = f.wait(f.checkpoints.save(dir.path(), 7, 5));
  REQUIRE(again.ok());
  CHECK(a.replica_saves.size() == 1);
  auto reader = checkpoint::CheckpointReader::open(*again).value();
  CHECK(values_of(reader->read_variable("w").value()) == std::vector<float>{1, 2});
  CHECK(values_of(reader->read_slot("w", "m").value()) == std::vector<float>{0.1f, 0.2f});
  CHECK(reader->manifest().find_variable("w")->optimizer_step == 6);
}

TEST_CASE("a replica that cannot write its file fails the save and leaves no checkpoint",
          "[coordinator][model_checkpoints][strategy]") {
  data::testing::TempDir dir;
  Fixture f;
  WorkerRecord a;
  f.add_worker(a, 0, {"sync_step"});
  REQUIRE(f.strategies.create("s", mirrored_model(), one_replica()).ok());
  run_step(f, {&a});
  auto failed = f.wait(f.checkpoints.save(dir.path(), 2, 3));  // a.replica_state absent: NotFound
  CHECK(failed.status().code() == StatusCode::kNotFound);
  CHECK_THAT(failed.status().message(), Catch::Contains("saving strategy 's'"));
  CHECK(checkpoint::list_checkpoints(dir.path()).value().empty());
}

TEST_CASE("a checkpoint whose mirrored variables the coordinator wrote (mirrored.safetensors) still restores",
          "[coordinator][model_checkpoints][strategy]") {
  data::testing::TempDir dir;
  // The layout before workers wrote their own files: every strategy's
  // variables in the coordinator's mirrored.safetensors.
  VariableState old;
  old.name = "w";
  old.dtype = DType::kFloat32;
  old.shape = {2};
  old.optimizer = Optimizer::adam(0.1);
  ShardState shard;
  shard.name = "w";
  shard.ps_task = -1;
  shard.rows = 2;
  shard.value = floats({3, 4}, {2});
  shard.slots = {{"m", floats({0.5f, 0.5f}, {2})}, {"v", floats({0.7f, 0.7f}, {2})}};
  shard.step = 11;
  old.shards.push_back(shard);
  auto path = write_checkpoint(dir.path(), 11, 3, {old});
  REQUIRE(path.ok());
  REQUIRE(checkpoint::CheckpointReader::open(*path).value()->manifest().find_variable("w")->shards[0].file ==
          kMirroredFile);
  Fixture f;
  WorkerRecord a;
  f.add_worker(a, 0, {"sync_step"});
  REQUIRE(f.strategies.create("s", mirrored_model(), one_replica()).ok());
  REQUIRE(f.wait(f.checkpoints.restore(*path, true)).ok());
  auto read = f.wait(f.strategies.read_mirrored("s", "w"));
  REQUIRE(read.ok());
  CHECK(values_of(read->first) == std::vector<float>{3, 4});
  CHECK(read->second == 11);
  // The source reads it as it reads the new layout (by variable name).
  auto state = checkpoint::read_mirrored_seed(*path, f.strategies.specs()["s"], {"w"}, nullptr);
  REQUIRE(state.ok());
  CHECK(values_of(state->variables.at(0).slots.at("v")) == std::vector<float>{0.7f, 0.7f});
  run_step(f, {&a});
  CHECK(a.forms.back().seed_checkpoint == *path);
}

TEST_CASE("a restore refuses a mirrored variable whose checkpoint shape differs, reading no value",
          "[coordinator][model_checkpoints][strategy]") {
  data::testing::TempDir dir;
  Result<std::string> path = Status::Unknown("not saved");
  {
    Fixture f;
    f.create("w", {1, 2, 3});  // a parameter-server variable "w" of 3 floats
    path = f.wait(f.checkpoints.save(dir.path(), 1, 3));
    REQUIRE(path.ok());
  }
  WorkerRecord a;
  Fixture g;
  g.add_worker(a, 0, {"sync_step"});
  REQUIRE(g.strategies.create("s", mirrored_model(), one_replica()).ok());
  auto refused = g.wait(g.checkpoints.restore(*path, false));
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("mirrored variable 'w' is float32[2]"));
}

}  // namespace
}  // namespace capstan::coordinator
