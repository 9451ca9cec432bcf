#include "daemons/coordinator/per_worker_datasets.h"

#include <catch2/catch.hpp>

#include "capstan/data/dataset.h"
#include "daemons/coordinator/checkpointing.h"
#include "daemons/coordinator/test_fakes.h"

namespace capstan::coordinator {
namespace {

using testing::FakeWorker;
using testing::WorkerRecord;

// An event loop, two fake workers (task indexes 0 and 1) and the datasets,
// journaling into `journaled`.
struct Fixture {
  explicit Fixture(int expected_workers = 0)
      : loop(),
        ws(loop),
        log(std::make_shared<spdlog::logger>("datasets_test", std::make_shared<spdlog::sinks::null_sink_mt>())),
        datasets(expected_workers, log, [this](int64_t id, const PerWorkerDataset& dataset) {
          if (!journal_answer.ok()) return journal_answer;
          journaled.emplace_back(id, dataset.name);
          return Status::Ok();
        }) {}

  std::vector<DatasetTarget> both() { return {{1, 0, &peer0}, {2, 1, &peer1}}; }

  static PerWorkerDataset definition(std::string name, int64_t n = 10) {
    PerWorkerDataset dataset;
    dataset.definition = data::Dataset::range(n).serialize();
    dataset.name = std::move(name);
    return dataset;
  }

  kj::EventLoop loop;
  kj::WaitScope ws;
  WorkerRecord record0, record1;
  FakeWorker peer0{record0}, peer1{record1};
  std::shared_ptr<spdlog::logger> log;
  Status journal_answer;
  std::vector<std::pair<int64_t, std::string>> journaled;
  PerWorkerDatasets datasets;
};

TEST_CASE("a per-worker dataset is journaled, then sent to every worker registered now with one uid",
          "[coordinator][datasets]") {
  Fixture f;
  int64_t id = f.datasets.add(Fixture::definition("train"), f.both()).wait(f.ws).value();
  CHECK(id == 1);
  CHECK(f.journaled == std::vector<std::pair<int64_t, std::string>>{{1, "train"}});
  REQUIRE(f.record0.datasets.size() == 1);
  REQUIRE(f.record1.datasets.size() == 1);
  CHECK(f.record0.datasets[0].first == 1);
  REQUIRE(f.record0.dataset_uids.size() == 1);
  CHECK(f.record0.dataset_uids[0] != 0);
  CHECK(f.record0.dataset_uids == f.record1.dataset_uids);
  CHECK(f.datasets.size() == 1);
  CHECK(f.datasets.all().at(1).uid == f.record0.dataset_uids[0]);
}

TEST_CASE("a named per-worker dataset is found again with the same definition, refused with another",
          "[coordinator][datasets]") {
  Fixture f;
  int64_t id = f.datasets.add(Fixture::definition("train"), f.both()).wait(f.ws).value();
  CHECK(f.datasets.add(Fixture::definition("train"), f.both()).wait(f.ws).value() == id);
  auto other = f.datasets.add(Fixture::definition("train", 20), f.both()).wait(f.ws);
  CHECK(other.status().code() == StatusCode::kAlreadyExists);
  CHECK(other.status().message().find("per-worker dataset 'train' exists (id 1)") != std::string::npos);
  auto long_name = f.datasets.add(Fixture::definition(std::string(257, 'x')), f.both()).wait(f.ws);
  CHECK(long_name.status().code() == StatusCode::kInvalidArgument);
  CHECK(f.journaled.size() == 1);
  CHECK(f.record0.datasets.size() == 1);  // sent once
}

TEST_CASE("a per-worker dataset the journal refuses is not added and its id is not used",
          "[coordinator][datasets]") {
  Fixture f;
  f.journal_answer = Status::DataLoss("journal broken");
  auto refused = f.datasets.add(Fixture::definition("train"), f.both()).wait(f.ws);
  CHECK(refused.status().code() == StatusCode::kDataLoss);
  CHECK(f.datasets.empty());
  CHECK(f.record0.datasets.empty());
  f.journal_answer = Status::Ok();
  CHECK(f.datasets.add(Fixture::definition("train"), f.both()).wait(f.ws).value() == 1);
}

TEST_CASE("a worker registering later gets every dataset, sharded over the expected workers",
          "[coordinator][datasets]") {
  Fixture f(/*expected_workers=*/4);
  PerWorkerDataset from_function;
  from_function.function = "make_input";
  f.datasets.add(std::move(from_function), {}).wait(f.ws).value();
  f.datasets.restore(7, Fixture::definition("replayed"));  // from the journal
  f.datasets.send_all({3, 1, &f.peer1}, 2).wait(f.ws);
  REQUIRE(f.record1.function_datasets.size() == 1);
  CHECK(f.record1.function_datasets[0] == std::make_tuple(int64_t{1}, std::string("make_input"), 4, 1));
  REQUIRE(f.record1.datasets.size() == 1);
  CHECK(f.record1.datasets[0].first == 7);
  // The next id goes on after the replayed one.
  CHECK(f.datasets.add(Fixture::definition("next"), {}).wait(f.ws).value() == 8);
}

TEST_CASE("iterator positions are saved by name, one a worker cannot give left out, and put back",
          "[coordinator][datasets]") {
  Fixture f;
  int64_t id = f.datasets.add(Fixture::definition("train"), f.both()).wait(f.ws).value();
  f.record0.iterator_positions[id] = "at-3";  // worker 1 has none (NotFound)
  auto states = f.datasets.iterator_states(f.both()).wait(f.ws);
  const std::string name0 = iterator_tensor_name("train", id, 0);
  CHECK(states == std::map<std::string, std::string>{{name0, "at-3"}});
  int restored = f.datasets.restore_iterators(states, f.both()).wait(f.ws).value();
  CHECK(restored == 1);
  CHECK(f.record0.restored_iterators == std::vector<std::pair<int64_t, std::string>>{{id, "at-3"}});
  CHECK(f.record1.restored_iterators.empty());
  f.record0.restore_answer = Status::InvalidArgument("bad state");
  auto rejected = f.datasets.restore_iterators(states, f.both()).wait(f.ws);
  CHECK(rejected.status().code() == StatusCode::kInvalidArgument);
  CHECK(rejected.status().message().find("restoring " + name0) != std::string::npos);
}

}  // namespace
}  // namespace capstan::coordinator
