#include "daemons/coordinator/ps_variables.h"

#include <kj/async.h>
#include <spdlog/sinks/null_sink.h>

#include <catch2/catch.hpp>

#include "daemons/coordinator/test_fakes.h"
#include "io/testing.h"
#include "training/initializer.h"

namespace capstan::coordinator {
namespace {

using testing::FakeParameterServers;
using testing::floats;
using testing::values_of;

const kj::TimePoint kStart = kj::origin<kj::TimePoint>();

// Two parameter servers, up; the journal records what it is given and
// answers `journal_answer`.
struct Fixture {
  kj::EventLoop loop;
  kj::WaitScope ws{loop};
  boost::asio::thread_pool pool{1};
  FakeParameterServers ps{2};
  PsHealth health{ps, kStart, std::chrono::milliseconds(30000)};
  std::vector<std::string> journaled;
  std::vector<PlacedVariable> journaled_variables;
  Status journal_answer;
  PsVariables variables{ps, health, pool,
                        std::make_shared<spdlog::logger>("ps_variables_test",
                                                         std::make_shared<spdlog::sinks::null_sink_mt>()),
                        "", [this](const PlacedVariable& v) {
                          journaled.push_back(v.name);
                          journaled_variables.push_back(v);
                          return journal_answer;
                        }};
  Fixture() {
    health.set(0, PsHealth::State::kUp, Status::Ok(), kStart);
    health.set(1, PsHealth::State::kUp, Status::Ok(), kStart);
  }
  ~Fixture() { pool.join(); }

  Result<VariableLocation> create(const std::string& name, Tensor initial, int shards) {
    VariableRequest request{name, std::move(initial), Optimizer::sgd(0.1),
                            placement::Partitioner::fixed_shards(shards)};
    return variables.create(std::move(request)).wait(ws);
  }
};

TEST_CASE("a variable is split into shards on the parameter servers, journaled, then recorded",
          "[coordinator][ps_variables]") {
  Fixture f;
  auto w = f.create("w", floats({1, 2, 3, 4}, {4}), 2);
  REQUIRE(w.ok());
  REQUIRE(w->shards.size() == 2);
  CHECK(w->shards[0].ps_task != w->shards[1].ps_task);
  CHECK(w->shards[0].rows + w->shards[1].rows == 4);
  CHECK(f.journaled == std::vector<std::string>{"w"});
  CHECK(f.variables.version() == 1);
  CHECK(f.variables.placements().variables.size() == 1);
  const auto& first = f.ps.tasks[static_cast<size_t>(w->shards[0].ps_task)].shards.at(w->shards[0].name);
  CHECK(values_of(first.value) == std::vector<float>{1, 2});
  CHECK(f.variables.shards_on(w->shards[1].ps_task) == std::set<std::string>{w->shards[1].name});

  // Created again alike (a reconnecting program): handed back as it is.
  auto again = f.create("w", floats({9, 9, 9, 9}, {4}), 2);
  REQUIRE(again.ok());
  CHECK(again->shards[0].name == w->shards[0].name);
  CHECK(f.variables.version() == 1);
  CHECK(f.journaled.size() == 1);
  CHECK(values_of(first.value) == std::vector<float>{1, 2});
  // Otherwise: AlreadyExists, saying what it is.
  auto other = f.create("w", floats({1, 2}, {2}), 1);
  CHECK(other.status().code() == StatusCode::kAlreadyExists);
  CHECK(other.status().message() == "variable 'w' exists as float32[4], not float32[2]");
}

TEST_CASE("a variable the journal refuses is not recorded", "[coordinator][ps_variables]") {
  Fixture f;
  f.journal_answer = Status::DataLoss("disk full");
  auto w = f.create("w", floats({1, 2}, {2}), 1);
  CHECK(w.status().code() == StatusCode::kDataLoss);
  CHECK_FALSE(f.variables.contains("w"));
  CHECK(f.variables.version() == 0);
}

TEST_CASE("an embedding table has one shard per parameter server and keeps its spec", "[coordinator][ps_variables]") {
  Fixture f;
  EmbeddingTableSpec spec;
  spec.name = "emb";
  spec.dim = 8;
  auto table = f.variables.create_table(spec).wait(f.ws);
  REQUIRE(table.ok());
  REQUIRE(table->shards.size() == 2);
  CHECK(table->shards[1].ps_task == 1);
  CHECK(f.ps.tasks[1].tables.count(table->shards[1].name) == 1);
  CHECK(f.variables.create_table(spec).wait(f.ws).ok());
  spec.dim = 16;
  CHECK(f.variables.create_table(spec).wait(f.ws).status().code() == StatusCode::kAlreadyExists);
  spec.dim = 0;
  CHECK(f.variables.create_table(spec).wait(f.ws).status().code() == StatusCode::kInvalidArgument);
  REQUIRE(f.create("w", floats({1}, {1}), 1).ok());
  spec.name = "w";
  spec.dim = 8;
  auto clash = f.variables.create_table(spec).wait(f.ws);
  CHECK(clash.status().message() == "createEmbeddingTable: 'w' is a variable float32[1], not an embedding table");
  VariableRequest request{"emb", floats({1}, {1}), Optimizer::sgd(0.1), placement::Partitioner::none()};
  CHECK(f.variables.create(std::move(request)).wait(f.ws).status().message() ==
        "createVariable: 'emb' is an embedding table");
}

TEST_CASE("each parameter server writes its own shards, and a restarted one reads them back itself",
          "[coordinator][ps_variables]") {
  Fixture f;
  io::testing::TempDir dir;
  auto w = f.create("w", floats({1, 2, 3, 4}, {4}), 2);
  REQUIRE(w.ok());
  auto writer = checkpoint::CheckpointWriter::begin(dir.path(), 5, 0);
  REQUIRE(writer.ok());
  auto save = f.variables.begin_save((*writer)->path()).wait(f.ws);
  REQUIRE(save.ok());
  REQUIRE(save->saves.size() == 2);
  REQUIRE(save->variables.size() == 1);
  CHECK(save->variables[0].partitioning == std::vector<int64_t>{2, 2});
  CHECK(save->variables[0].shards[0].file == checkpoint::ps_file_name(w->shards[0].ps_task));
  auto files = f.variables.finish_save(*save).wait(f.ws);
  REQUIRE(files.ok());
  REQUIRE(files->size() == 2);
  // Each server wrote the shard it holds.
  for (const auto& task : f.ps.tasks) CHECK(task.saved.size() == 1);
  checkpoint::Manifest manifest;
  manifest.variables = save->variables;
  REQUIRE((*writer)->commit(manifest, *files).ok());

  const int lost = w->shards[1].ps_task;
  const std::string lost_shard = w->shards[1].name;
  f.ps.restart_empty(lost);
  std::vector<VariableState> states = f.variables.layout();
  std::erase_if(states[0].shards, [&](const ShardState& s) { return s.name != lost_shard; });
  REQUIRE(f.variables.restore_from(dir.file("ckpt-5"), states).wait(f.ws).ok());
  const auto& back = f.ps.tasks[static_cast<size_t>(lost)];
  CHECK(back.restored == std::vector<std::string>{lost_shard});
  CHECK(values_of(back.shards.at(lost_shard).value) == std::vector<float>{3, 4});
  CHECK(f.ps.tasks[static_cast<size_t>(1 - lost)].restored.empty());
}

TEST_CASE("no save while a parameter server is not up", "[coordinator][ps_variables]") {
  Fixture f;
  f.health.set(1, PsHealth::State::kDown, Status::Ok(), kStart);
  auto save = f.variables.begin_save("/nowhere/ckpt-1.tmp").wait(f.ws);
  CHECK(save.status().code() == StatusCode::kUnavailable);
}

TEST_CASE("a restore places the checkpoint's variables that do not exist, and records them once restored",
          "[coordinator][ps_variables]") {
  Fixture f;
  REQUIRE(f.create("w", floats({1, 2}, {2}), 1).ok());
  checkpoint::Manifest manifest;
  for (std::string name : {"w", "b", "mirrored"}) {
    checkpoint::ManifestVariable v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = {4};
    v.shards = {{name + "/part_0", "ps-0.safetensors", 0, 2}, {name + "/part_1", "ps-1.safetensors", 2, 2}};
    manifest.variables.push_back(v);
  }
  auto skip = [](const std::string& name) { return name == "mirrored"; };
  auto placed = f.variables.place_absent(manifest, skip);
  REQUIRE(placed.ok());
  REQUIRE(placed->size() == 1);
  CHECK((*placed)[0].name == "b");
  CHECK((*placed)[0].shards.size() == 2);
  // Placed, not recorded: nothing was created yet.
  CHECK_FALSE(f.variables.contains("b"));
  REQUIRE(f.variables.record((*placed)[0]).ok());
  CHECK(f.variables.contains("b"));
  CHECK_FALSE(f.variables.contains("mirrored"));
  // "w" exists: left as it was (one shard of 2 values).
  auto placements = f.variables.placements();
  REQUIRE(placements.variables.size() == 2);
  CHECK(placements.variables[0].name == "b");
  CHECK(placements.variables[1].shards.size() == 1);
}

TEST_CASE("a variable read back from the journal keeps the placer's round robin going", "[coordinator][ps_variables]") {
  Fixture f;
  PlacedVariable v;
  v.name = "w";
  v.dtype = DType::kFloat32;
  v.shape = {2};
  v.shards = {{"w/part_0", 1, 0, 2}};
  f.variables.restore(v, 5);
  CHECK(f.variables.placer_counter() == 5);
  CHECK(f.variables.version() == 1);
  v.name = "b";
  f.variables.restore(v, 3);
  CHECK(f.variables.placer_counter() == 5);
  CHECK(f.variables.version() == 2);
  CHECK(f.journaled.empty());
}

// ---- Variables whose value never passes through the coordinator

TEST_CASE("a variable made by an initializer has each shard compute its rows, no value passing here",
          "[coordinator][ps_variables]") {
  Fixture f;
  VariableRequest request{"w", Tensor(), Optimizer::sgd(0.1), placement::Partitioner::fixed_shards(3)};
  request.initializer = Initializer::glorot_uniform(7);
  request.dtype = DType::kFloat32;
  request.shape = {10, 4};
  auto w = f.variables.create(request).wait(f.ws);
  REQUIRE(w.ok());
  CHECK(w->dtype == DType::kFloat32);
  CHECK(w->shape == Shape{10, 4});
  REQUIRE(w->shards.size() == 3);
  // Every shard was created with the initializer and its rows of the whole
  // variable: no create carried a value.
  std::vector<float> joined;
  for (const auto& shard : w->shards) {
    const auto& task = f.ps.tasks[static_cast<size_t>(shard.ps_task)];
    CHECK(task.valued_creates.empty());
    const InitializedShard& sent = task.initialized.at(shard.name);
    CHECK(sent.initializer == request.initializer);
    CHECK(sent.logical_shape == Shape{10, 4});
    CHECK(sent.first_row == shard.first_row);
    CHECK(sent.rows == shard.rows);
    std::vector<float> rows = values_of(task.shards.at(shard.name).value);
    joined.insert(joined.end(), rows.begin(), rows.end());
  }
  auto whole = training::initial_rows(request.initializer, DType::kFloat32, {10, 4}, 0, 10);
  REQUIRE(whole.ok());
  CHECK(joined == values_of(*whole));
  // The journal keeps the initializer (the value is on the servers).
  REQUIRE(f.journaled_variables.size() == 1);
  CHECK(f.journaled_variables[0].initializer == request.initializer);
  CHECK_FALSE(f.journaled_variables[0].awaiting_value);
  CHECK_FALSE(f.variables.awaiting_value("w"));
}

TEST_CASE("a scalar made by an initializer is one shard of one row", "[coordinator][ps_variables]") {
  Fixture f;
  VariableRequest request{"s", Tensor(), Optimizer::none(), placement::Partitioner::none()};
  request.initializer = Initializer::constant(3);
  request.dtype = DType::kFloat64;
  auto s = f.variables.create(request).wait(f.ws);
  REQUIRE(s.ok());
  REQUIRE(s->shards.size() == 1);
  const auto& task = f.ps.tasks[static_cast<size_t>(s->shards[0].ps_task)];
  CHECK(task.initialized.at("s").rows == 1);
  CHECK(task.shards.at("s").value.shape().empty());
}

TEST_CASE("a variable the program writes is created as zeros on the servers and awaits its value until written",
          "[coordinator][ps_variables]") {
  Fixture f;
  VariableRequest request{"w", Tensor(), Optimizer::sgd(0.1), placement::Partitioner::fixed_shards(2)};
  request.value_from_program = true;
  request.dtype = DType::kFloat32;
  request.shape = {4, 2};
  auto w = f.variables.create(request).wait(f.ws);
  REQUIRE(w.ok());
  for (const auto& shard : w->shards) {
    const auto& task = f.ps.tasks[static_cast<size_t>(shard.ps_task)];
    CHECK(task.valued_creates.empty());
    CHECK(task.initialized.at(shard.name).initializer == Initializer::zeros());
  }
  CHECK(f.variables.awaiting_value("w"));
  REQUIRE(f.journaled_variables.size() == 1);
  CHECK(f.journaled_variables[0].awaiting_value);
  // A program that comes back before it wrote the value is asked again.
  REQUIRE(f.variables.create(request).wait(f.ws).ok());
  CHECK(f.variables.awaiting_value("w"));

  // Written: journaled again without the flag; a second call changes nothing.
  REQUIRE(f.variables.written("w").ok());
  CHECK_FALSE(f.variables.awaiting_value("w"));
  REQUIRE(f.journaled_variables.size() == 2);
  CHECK_FALSE(f.journaled_variables[1].awaiting_value);
  CHECK(f.journaled_variables[1].shards.size() == 2);
  REQUIRE(f.variables.written("w").ok());
  CHECK(f.journaled_variables.size() == 2);
  CHECK(f.variables.version() == 1);
  CHECK(f.variables.written("nope").code() == StatusCode::kNotFound);
}

TEST_CASE("a written flag the journal refuses stays awaiting", "[coordinator][ps_variables]") {
  Fixture f;
  VariableRequest request{"w", Tensor(), Optimizer::sgd(0.1), placement::Partitioner::none()};
  request.value_from_program = true;
  request.dtype = DType::kFloat32;
  request.shape = {4};
  REQUIRE(f.variables.create(request).wait(f.ws).ok());
  f.journal_answer = Status::DataLoss("disk full");
  CHECK(f.variables.written("w").code() == StatusCode::kDataLoss);
  CHECK(f.variables.awaiting_value("w"));
}

TEST_CASE("a parameter server that refuses an initializer fails the create, nothing recorded",
          "[coordinator][ps_variables]") {
  Fixture f;
  VariableRequest request{"w", Tensor(), Optimizer::sgd(0.1), placement::Partitioner::none()};
  request.initializer = Initializer::random_normal(0, -1, 1);  // the fake computes it as a server would
  request.dtype = DType::kFloat32;
  request.shape = {4};
  auto w = f.variables.create(request).wait(f.ws);
  CHECK(w.status().code() == StatusCode::kInvalidArgument);
  CHECK(w.status().message().find("stddev -1") != std::string::npos);
  CHECK_FALSE(f.variables.contains("w"));
  CHECK(f.journaled.empty());
}

}  // namespace
}  // namespace capstan::coordinator
