// The coordinator's journal records alone: each kind read back as written,
// each way a record can be bad, and the journal over a real work_dir.
#include "daemons/coordinator/coordinator_journal.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <catch2/catch.hpp>

#include "capstan_schemas/coordinator_journal.capnp.h"
#include "daemons/coordinator/test_fakes.h"
#include "data/test_util.h"

namespace capstan::coordinator {
namespace {

using Update = wire::journal::CoordinatorUpdate;

std::string serialize(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

template <typename T>
T decoded(const std::string& record, int num_ps = 2) {
  auto out = decode_record(record, num_ps);
  REQUIRE(out.ok());
  REQUIRE(std::holds_alternative<T>(*out));
  return std::get<T>(std::move(*out));
}

TEST_CASE("a variable's record reads back with its shards, optimizer, table and the placer's counter",
          "[coordinator][journal]") {
  PlacedVariable v;
  v.name = "emb";
  v.dtype = DType::kFloat32;
  v.shape = {0, 8};
  v.optimizer = Optimizer::sgd(0.5);
  v.shards = {{"emb/part_0", 0, 0, 0}, {"emb/part_1", 1, 0, 0}};
  EmbeddingTableSpec spec;
  spec.name = "emb";
  spec.dim = 8;
  v.table = spec;
  auto read = decoded<VariableCreated>(variable_record(v, 7));
  CHECK(read.placer_counter == 7);
  CHECK(read.variable.name == "emb");
  CHECK(read.variable.shape == Shape{0, 8});
  REQUIRE(read.variable.shards.size() == 2);
  CHECK(read.variable.shards[1].name == "emb/part_1");
  CHECK(read.variable.shards[1].ps_task == 1);
  CHECK(read.variable.optimizer == v.optimizer);
  REQUIRE(read.variable.table.has_value());
  CHECK(*read.variable.table == spec);

  // A shard beyond the parameter servers there are: another ps list.
  auto fewer = decode_record(variable_record(v, 7), 1);
  CHECK(fewer.status().code() == StatusCode::kFailedPrecondition);
  CHECK(fewer.status().message() == "variable 'emb' has a shard on ps:1 but this coordinator has 1 parameter "
                                    "server(s): start it with the same ps list");
}

TEST_CASE("a variable's record keeps its initializer and whether it awaits its value", "[coordinator][journal]") {
  PlacedVariable v;
  v.name = "w";
  v.dtype = DType::kFloat64;
  v.shape = {6, 2};
  v.optimizer = Optimizer::adam(0.1);
  v.shards = {{"w/part_0", 0, 0, 3}, {"w/part_1", 1, 3, 3}};
  v.initializer = Initializer::random_uniform(-2, 3, 99);
  v.awaiting_value = true;
  auto read = decoded<VariableCreated>(variable_record(v, 2));
  CHECK(read.variable.initializer == v.initializer);
  CHECK(read.variable.awaiting_value);
  // A variable made from a given value (and records older than
  // initializers): kind none, not awaiting.
  v.initializer = Initializer{};
  v.awaiting_value = false;
  auto plain = decoded<VariableCreated>(variable_record(v, 2));
  CHECK(plain.variable.initializer.kind == Initializer::Kind::kNone);
  CHECK_FALSE(plain.variable.awaiting_value);
}

TEST_CASE("dataset, checkpoint and queue snapshot records read back as written", "[coordinator][journal]") {
  PerWorkerDataset d;
  d.definition = std::string("\0def", 4);
  d.function = "make_input";
  d.name = "train";
  d.uid = 99;
  auto dataset = decoded<DatasetAdded>(dataset_record(3, d));
  CHECK(dataset.id == 3);
  CHECK(dataset.dataset.definition == d.definition);
  CHECK(dataset.dataset.function == "make_input");
  CHECK(dataset.dataset.name == "train");
  CHECK(dataset.dataset.uid == 99);

  CHECK(decoded<LastCheckpointSet>(last_checkpoint_record("/ckpt/ckpt-5")).path == "/ckpt/ckpt-5");

  ClosureQueue::Snapshot::Entry entry;
  entry.closure = {12, "train_step", "args", 0};
  entry.state = ClosureQueue::State::kFailed;
  entry.error = Status::InvalidArgument("bad input");
  entry.owner = {5, 6};
  entry.released = true;
  auto closure = decoded<ClosureSnapshot>(closure_state_record(entry)).entry;
  CHECK(closure.closure.id == 12);
  CHECK(closure.closure.function == "train_step");
  CHECK(closure.closure.args == "args");
  CHECK(closure.state == ClosureQueue::State::kFailed);
  CHECK(closure.error.code() == StatusCode::kInvalidArgument);
  CHECK(closure.error.message() == "bad input");
  CHECK(closure.owner.client == 5);
  CHECK(closure.owner.request_seq == 6);
  CHECK(closure.released);

  auto queue = decoded<QueueSnapshot>(queue_state_record(Status::Cancelled("stop"), 40));
  CHECK(queue.pending_error.code() == StatusCode::kCancelled);
  CHECK(queue.next_id == 40);
}

TEST_CASE("a strategy's record reads back with its specs, options, seed, last group and steps",
          "[coordinator][journal][durable]") {
  Strategies::Journaled s;
  s.name = "dense";
  s.specs = {{"w", DType::kFloat32, {2, 3}, Optimizer::adam(0.01)}, {"b", DType::kFloat64, {3}, Optimizer::sgd(0.5)}};
  s.config.min_replicas = 2;
  s.config.settings.timeout = std::chrono::milliseconds(1234);
  s.config.settings.tcp_streams = 2;
  training::MirroredState initial;
  initial.variables.push_back({"w", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).value(), {}});
  initial.variables.push_back({"b", Tensor::from_vector<double>({7, 8, 9}, {3}).value(), {}});
  s.initial = initial;
  s.epoch = 3;
  s.member_tasks = {1, 0};
  s.steps = 17;
  auto back = decoded<StrategyJournaled>(strategy_record(s)).strategy;
  CHECK(back.name == "dense");
  REQUIRE(back.specs.size() == 2);
  CHECK(back.specs[0].name == "w");
  CHECK(back.specs[0].shape == Shape{2, 3});
  CHECK(back.specs[0].optimizer == Optimizer::adam(0.01));
  CHECK(back.specs[1].dtype == DType::kFloat64);
  CHECK(back.config.min_replicas == 2);
  CHECK(back.config.settings.timeout == std::chrono::milliseconds(1234));
  CHECK(back.config.settings.tcp_streams == 2);
  REQUIRE(back.initial.has_value());
  REQUIRE(back.initial->variables.size() == 2);
  CHECK(back.initial->variables[0].name == "w");
  CHECK(back.initial->variables[0].value.flat<float>()[5] == 6);
  CHECK(back.initial->variables[1].value.flat<double>()[2] == 9);
  CHECK(back.seed_checkpoint.empty());
  CHECK(back.epoch == 3);
  CHECK(back.member_tasks == std::vector<int>{1, 0});
  CHECK(back.steps == 17);
  CHECK_FALSE(back.input.has_value());

  // Its step input.
  StepInputConfig input;
  input.dataset_id = 4;
  input.global_batch = 96;
  input.seed = 77;
  input.shuffle = false;
  s.input = input;
  back = decoded<StrategyJournaled>(strategy_record(s)).strategy;
  REQUIRE(back.input.has_value());
  CHECK(back.input->dataset_id == 4);
  CHECK(back.input->global_batch == 96);
  CHECK(back.input->per_replica_batch == 0);
  CHECK(back.input->seed == 77);
  CHECK_FALSE(back.input->shuffle);
  s.input->per_replica_batch = 8;  // both batches: not a step input
  CHECK(decode_record(strategy_record(s), 2).status().code() == StatusCode::kDataLoss);
  s.input.reset();

  // A restore's seed instead of initial values.
  s.initial.reset();
  s.seed_checkpoint = "/ckpt/ckpt-100";
  s.seed_from_checkpoint = {"w", "b"};
  back = decoded<StrategyJournaled>(strategy_record(s)).strategy;
  CHECK_FALSE(back.initial.has_value());
  CHECK(back.seed_checkpoint == "/ckpt/ckpt-100");
  CHECK(back.seed_from_checkpoint == std::vector<std::string>{"w", "b"});

  // Initial values that do not fit the specs are DataLoss.
  s.seed_checkpoint.clear();
  s.initial = initial;
  s.initial->variables.pop_back();
  auto bad = decode_record(strategy_record(s), 2);
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.status().message(), Catch::Contains("'dense'") && Catch::Contains("1 initial value(s) for 2"));
  s.initial = initial;
  std::swap(s.initial->variables[0], s.initial->variables[1]);
  CHECK(decode_record(strategy_record(s), 2).status().code() == StatusCode::kDataLoss);
}

TEST_CASE("a bad record is DataLoss, saying what is wrong", "[coordinator][journal]") {
  CHECK(decode_record("abc", 1).status().message() == "a journal record is not whole words");
  auto junk = decode_record(std::string(16, '\xff'), 1);
  CHECK(junk.status().code() == StatusCode::kDataLoss);
  CHECK(junk.status().message().starts_with("a journal record does not parse: "));
  {
    capnp::MallocMessageBuilder message;
    message.initRoot<Update>().initScheduleClosure().setId(0);
    CHECK(decode_record(serialize(message), 1).status().message() == "a journaled closure has id 0");
  }
  {
    capnp::MallocMessageBuilder message;
    message.initRoot<Update>().initClosureState().setState(1);
    CHECK(decode_record(serialize(message), 1).status().message() == "a journaled closure has state 1");
  }
  {
    capnp::MallocMessageBuilder message;
    auto finished = message.initRoot<Update>().initClosureFinished();
    finished.setId(1);
    finished.setErrorCode(17);
    CHECK(decode_record(serialize(message), 1).status().message() == "a journaled error has code 17");
  }
}

using Loop = testing::CoordinatorParts;

TEST_CASE("without a work_dir the journal writes nothing and is always synced", "[coordinator][journal]") {
  Loop loop;
  CoordinatorJournal journal;
  ClosureQueue queue;
  CHECK_FALSE(journal.durable());
  CHECK(journal.variable(PlacedVariable{}, 0).ok());
  CHECK(journal.last_checkpoint("/ckpt").ok());
  journal.scheduled(1, "f", "", {});
  journal.finished(1, Status::Ok(), queue);
  CHECK(journal.broken().ok());
  CHECK(loop.wait(journal.synced()).ok());
}

TEST_CASE("the closure changes come back in their order after the journal is reopened", "[coordinator][journal]") {
  data::testing::TempDir dir;
  Loop loop;
  ClosureQueue queue;
  {
    CoordinatorJournal journal;
    std::vector<std::string> replay;
    REQUIRE(journal.open(dir.path(), loop.pool, loop.log, {}, &replay).ok());
    CHECK(replay.empty());
    CHECK(journal.durable());
    int64_t id = queue.next_id();
    journal.scheduled(id, "train_step", "args", {7, 1});
    REQUIRE(queue.schedule("train_step", "args", {7, 1}).ok());
    REQUIRE(queue.next(/*worker=*/1).has_value());
    REQUIRE(queue.complete(id, 1, std::string("value")) == ClosureQueue::State::kDone);
    journal.finished(id, Status::Ok(), queue);
    journal.released(id);
    journal.error_taken();
    REQUIRE(loop.wait(journal.synced()).ok());
    // Written at once (the closure records above go in batches).
    REQUIRE(journal.last_checkpoint("/ckpt/ckpt-1").ok());
  }
  CoordinatorJournal journal;
  std::vector<std::string> replay;
  REQUIRE(journal.open(dir.path(), loop.pool, loop.log, {}, &replay).ok());
  REQUIRE(replay.size() == 5);
  auto scheduled = decoded<ClosureScheduled>(replay[0]);
  CHECK(scheduled.function == "train_step");
  CHECK(scheduled.owner.client == 7);
  auto finished = decoded<ClosureFinished>(replay[1]);
  CHECK(finished.result.value() == "value");
  CHECK(decoded<ClosureReleased>(replay[2]).id == scheduled.id);
  decoded<ErrorTaken>(replay[3]);
  CHECK(decoded<LastCheckpointSet>(replay[4]).path == "/ckpt/ckpt-1");
}

}  // namespace
}  // namespace capstan::coordinator
