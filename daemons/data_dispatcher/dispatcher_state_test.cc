#include "daemons/data_dispatcher/dispatcher_state.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <catch2/catch.hpp>
#include <cstring>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "capstan_schemas/dispatcher_journal.capnp.h"

namespace capstan::data_dispatcher {
namespace {

using Job = DispatcherState::Job;

std::string to_bytes(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}
using Task = DispatcherState::Task;
using SplitState = DispatcherState::SplitState;

void ok(DispatcherState& state, const Update& update) {
  Status s = state.apply(update);
  INFO(update_name(update) << ": " << s.to_string());
  REQUIRE(s.ok());
}

// The update is rejected with `code` and the state is unchanged.
void rejected(DispatcherState& state, const Update& update, StatusCode code) {
  const std::string before = state.debug_string();
  Status s = state.apply(update);
  INFO(update_name(update) << ": " << s.to_string());
  CHECK(s.code() == code);
  CHECK_FALSE(s.message().empty());
  CHECK(state.debug_string() == before);
}

std::vector<int64_t> ids_of(const std::vector<const Task*>& tasks) {
  std::vector<int64_t> ids;
  for (const Task* t : tasks) ids.push_back(t->task_id);
  return ids;
}

CreateJob job_of(int64_t id, std::string dataset = "ds", std::string name = "",
                 ProcessingMode mode = ProcessingMode::kOff) {
  CreateJob c;
  c.job_id = id;
  c.dataset_id = std::move(dataset);
  c.job_name = std::move(name);
  c.processing_mode = mode;
  return c;
}

// Job `id` "rr" of "ds", read round-robin by `consumers` consumers
// (coordinated reads).
CreateJob round_robin_job(int64_t id, int64_t consumers) {
  CreateJob rr = job_of(id, "ds", "rr");
  rr.num_consumers = consumers;
  return rr;
}

// Job `id` of "ds", sharded dynamically over `providers` split providers.
CreateJob dynamic_job(int64_t id, int64_t providers) {
  CreateJob job = job_of(id, "ds", "", ProcessingMode::kDynamic);
  job.num_split_providers = providers;
  return job;
}

// A dataset "ds" (fingerprint 42) and workers w1, w2, then `more` (a
// test's set-up), each of which must apply.
void setup(DispatcherState& state, std::initializer_list<Update> more = {}) {
  ok(state, RegisterDataset{"ds", 42});
  ok(state, RegisterWorker{"w1", "w1:t", {"a"}});
  ok(state, RegisterWorker{"w2", "", {}});
  for (const Update& update : more) ok(state, update);
}

// One of each update kind, with non-trivial field values.
std::vector<Update> sample_updates() {
  CreateJob cj;
  cj.job_id = -7;
  cj.dataset_id = "d\xc3\xa9";
  cj.job_name = "named";
  cj.processing_mode = ProcessingMode::kHint;
  cj.num_consumers = 3;
  cj.num_split_providers = 2;
  cj.target_workers = TargetWorkers::kLocal;
  cj.cross_trainer_cache = true;
  return {
      RegisterDataset{"1000", 0xfedcba9876543210ULL},
      RegisterDataset{"", 0},
      RegisterDataset{"1001", 5, wire::ElementCompression::ZSTD},
      RegisterWorker{"host:1", "host:2", {"x", "", "yz"}},
      RegisterWorker{"h", "", {}},
      cj,
      CreateJob{},
      AcquireJobClient{3000, 2000},
      ReleaseJobClient{3000, 123456789},
      CreateTask{4000, 2000, "host:1"},
      CreatePendingTask{4001, 2000, "host:1", 17},
      ClientHeartbeat{3000, true, std::nullopt},
      ClientHeartbeat{3001, false, int64_t{9}},
      FinishTask{4000},
      RemoveTask{-1},
      ProduceSplit{2000, 2, 1, true},
      ProduceSplit{2000, 0, 0, false},
      ProduceSplit{2000, 0, 3, false, 4000},
      GarbageCollectJob{2000},
      ReassignTask{4001, "other:7"},
  };
}

// ---- encoding ---------------------------------------------------------------

TEST_CASE("encode/decode round-trips every update kind") {
  for (const Update& u : sample_updates()) {
    INFO(update_name(u));
    Result<Update> back = decode(encode(u));
    REQUIRE(back.ok());
    CHECK(*back == u);
  }
}

TEST_CASE("a record is a flat Cap'n Proto DispatcherUpdate") {
  const std::string bytes = encode(FinishTask{42});
  REQUIRE(bytes.size() % sizeof(capnp::word) == 0);
  auto words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  capnp::FlatArrayMessageReader reader(words);
  auto root = reader.getRoot<wire::journal::DispatcherUpdate>();
  REQUIRE(root.isFinishTask());
  CHECK(root.getFinishTask().getTaskId() == 42);
}

TEST_CASE("update_name names each kind") {
  CHECK(update_name(RegisterDataset{}) == "RegisterDataset");
  CHECK(update_name(RegisterWorker{}) == "RegisterWorker");
  CHECK(update_name(CreateJob{}) == "CreateJob");
  CHECK(update_name(AcquireJobClient{}) == "AcquireJobClient");
  CHECK(update_name(ReleaseJobClient{}) == "ReleaseJobClient");
  CHECK(update_name(CreateTask{}) == "CreateTask");
  CHECK(update_name(CreatePendingTask{}) == "CreatePendingTask");
  CHECK(update_name(ClientHeartbeat{}) == "ClientHeartbeat");
  CHECK(update_name(FinishTask{}) == "FinishTask");
  CHECK(update_name(RemoveTask{}) == "RemoveTask");
  CHECK(update_name(ProduceSplit{}) == "ProduceSplit");
  CHECK(update_name(GarbageCollectJob{}) == "GarbageCollectJob");
  CHECK(update_name(ReassignTask{}) == "ReassignTask");
  CHECK(processing_mode_name(ProcessingMode::kFileOrData) == "FILE_OR_DATA");
  CHECK(target_workers_name(TargetWorkers::kAny) == "ANY");
}

TEST_CASE("decode rejects empty input") {
  Result<Update> r = decode("");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("decode rejects unknown update kinds") {
  // A union member from a newer schema: discriminant 12 and beyond.
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<wire::journal::DispatcherUpdate>();
  root.initFinishTask().setTaskId(1);
  std::string bytes = to_bytes(message);
  // The discriminant is the struct's first data word after the root pointer
  // and the struct's own words; find it by value and bump it.
  std::string bumped = bytes;
  bool changed = false;
  for (size_t at = 8; at + 2 <= bumped.size() && !changed; at += 2) {
    if (bumped[at] == 8 && bumped[at + 1] == 0) {  // FINISH_TASK = 8
      bumped[at] = 100;
      changed = decode(bumped).status().code() == StatusCode::kInvalidArgument &&
                decode(bumped).status().message().find("unknown update kind 100") != std::string::npos;
      if (!changed) bumped = bytes;
    }
  }
  CHECK(changed);
}

TEST_CASE("decode rejects input truncated at every byte") {
  for (const Update& u : sample_updates()) {
    const std::string bytes = encode(u);
    for (size_t n = 0; n < bytes.size(); ++n) {
      INFO(update_name(u) << " cut to " << n << " of " << bytes.size() << " bytes");
      Result<Update> r = decode(std::string_view(bytes).substr(0, n));
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == StatusCode::kInvalidArgument);
    }
  }
}

TEST_CASE("decode rejects trailing bytes") {
  for (const Update& u : sample_updates()) {
    INFO(update_name(u));
    Result<Update> r = decode(encode(u) + '\0');
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("decode rejects out-of-range enums") {
  for (int field = 0; field < 2; ++field) {
    capnp::MallocMessageBuilder message;
    auto cj = message.initRoot<wire::journal::DispatcherUpdate>().initCreateJob();
    cj.setDatasetId("ds");
    if (field == 0) cj.setProcessingMode(kMaxProcessingMode + 1);
    else cj.setTargetWorkers(kMaxTargetWorkers + 1);
    Result<Update> r = decode(to_bytes(message));
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("out of range"));
  }
}

TEST_CASE("decode rejects garbage words") {
  CHECK(decode(std::string(8, '\xff')).status().code() == StatusCode::kInvalidArgument);
  CHECK(decode(std::string(64, '\x7f')).status().code() == StatusCode::kInvalidArgument);
}

// ---- datasets ---------------------------------------------------------------

TEST_CASE("a fresh state is empty and starts its id counters") {
  DispatcherState state;
  CHECK(state.list_datasets().empty());
  CHECK(state.list_workers().empty());
  CHECK(state.list_jobs().empty());
  CHECK(state.list_active_job_client_ids().empty());
  CHECK(state.next_available_dataset_id() == "1000");
  CHECK(state.next_available_job_id() == 2000);
  CHECK(state.next_available_job_client_id() == 3000);
  CHECK(state.next_available_task_id() == 4000);
  CHECK(state.jobs_to_collect(1'000'000, 0).empty());
}

TEST_CASE("RegisterDataset maps id and fingerprint to each other") {
  DispatcherState state;
  ok(state, RegisterDataset{"1000", 7});
  ok(state, RegisterDataset{"custom", 8});

  auto by_id = state.dataset_from_id("1000");
  REQUIRE(by_id.ok());
  CHECK((*by_id)->fingerprint == 7);
  auto by_fp = state.dataset_for_fingerprint(8);
  REQUIRE(by_fp.ok());
  CHECK((*by_fp)->dataset_id == "custom");
  REQUIRE(state.list_datasets().size() == 2);
  CHECK(state.list_datasets()[0]->dataset_id == "1000");
}

TEST_CASE("next_available_dataset_id stays above numeric dataset ids") {
  DispatcherState state;
  ok(state, RegisterDataset{state.next_available_dataset_id(), 1});
  CHECK(state.next_available_dataset_id() == "1001");
  ok(state, RegisterDataset{"5000", 2});
  CHECK(state.next_available_dataset_id() == "5001");
  ok(state, RegisterDataset{"1500", 3});
  ok(state, RegisterDataset{"named", 4});
  ok(state, RegisterDataset{"-3", 5});
  ok(state, RegisterDataset{"12abc", 6});
  CHECK(state.next_available_dataset_id() == "5001");
}

TEST_CASE("dataset queries report NotFound") {
  DispatcherState state;
  ok(state, RegisterDataset{"ds", 1});
  CHECK(state.dataset_from_id("other").status().code() == StatusCode::kNotFound);
  CHECK(state.dataset_for_fingerprint(2).status().code() == StatusCode::kNotFound);
}

TEST_CASE("RegisterDataset rejects empty ids, duplicate ids and duplicate fingerprints") {
  DispatcherState state;
  ok(state, RegisterDataset{"ds", 1});
  rejected(state, RegisterDataset{"", 9}, StatusCode::kInvalidArgument);
  rejected(state, RegisterDataset{"ds", 2}, StatusCode::kAlreadyExists);
  rejected(state, RegisterDataset{"other", 1}, StatusCode::kAlreadyExists);
}

// ---- workers ------------------------------------------------------------------

TEST_CASE("RegisterWorker lists workers by address") {
  DispatcherState state;
  ok(state, RegisterWorker{"b:1", "b:2", {"gpu", "zone-a"}});
  ok(state, RegisterWorker{"a:1", "", {}});
  auto workers = state.list_workers();
  REQUIRE(workers.size() == 2);
  CHECK(workers[0]->address == "a:1");
  CHECK(workers[1]->address == "b:1");
  auto w = state.worker_from_address("b:1");
  REQUIRE(w.ok());
  CHECK((*w)->transfer_address == "b:2");
  CHECK((*w)->tags == std::vector<std::string>{"gpu", "zone-a"});
  auto tasks = state.tasks_for_worker("a:1");
  REQUIRE(tasks.ok());
  CHECK(tasks->empty());
}

TEST_CASE("re-registering a known worker is idempotent and keeps its tasks") {
  DispatcherState state;
  setup(state, {job_of(1), CreateTask{10, 1, "w1"}});
  ok(state, RegisterWorker{"w1", "w1:t", {"a"}});
  const std::string once = state.debug_string();
  ok(state, RegisterWorker{"w1", "w1:t", {"a"}});
  CHECK(state.debug_string() == once);
  CHECK(state.list_workers().size() == 2);
  CHECK(ids_of(*state.tasks_for_worker("w1")) == std::vector<int64_t>{10});

  ok(state, RegisterWorker{"w1", "w1:new", {"b"}});
  CHECK((*state.worker_from_address("w1"))->transfer_address == "w1:new");
  CHECK(ids_of(*state.tasks_for_worker("w1")) == std::vector<int64_t>{10});
}

TEST_CASE("RegisterWorker rejects an empty address") {
  DispatcherState state;
  rejected(state, RegisterWorker{"", "t", {}}, StatusCode::kInvalidArgument);
}

TEST_CASE("worker queries report NotFound") {
  DispatcherState state;
  CHECK(state.worker_from_address("nobody").status().code() == StatusCode::kNotFound);
  CHECK(state.tasks_for_worker("nobody").status().code() == StatusCode::kNotFound);
}

// ---- jobs ---------------------------------------------------------------------

TEST_CASE("CreateJob records the job's parameters") {
  DispatcherState state;
  setup(state);
  CreateJob c = job_of(2000, "ds", "train", ProcessingMode::kDynamic);
  c.num_consumers = 2;
  c.num_split_providers = 3;
  c.target_workers = TargetWorkers::kAny;
  ok(state, c);
  auto job = state.job_from_id(2000);
  REQUIRE(job.ok());
  const Job& j = **job;
  CHECK(j.dataset_id == "ds");
  CHECK(j.job_name == "train");
  CHECK(j.processing_mode == ProcessingMode::kDynamic);
  CHECK(j.num_consumers == 2);
  CHECK(j.is_round_robin());
  CHECK(j.num_split_providers == 3);
  CHECK(j.target_workers == TargetWorkers::kAny);
  CHECK_FALSE(j.cross_trainer_cache);
  CHECK(j.split_states == std::vector<SplitState>(3));
  CHECK(j.num_clients() == 0);
  CHECK(j.last_client_released_micros == -1);
  CHECK_FALSE(j.finished);
  CHECK_FALSE(j.garbage_collected);
  CHECK(state.tasks_for_job(2000)->empty());

  CreateJob ctc = job_of(2001, "ds", "cached");
  ctc.cross_trainer_cache = true;
  ok(state, ctc);
  CHECK((*state.job_from_id(2001))->cross_trainer_cache);
  CHECK((*state.job_from_id(2001))->split_states.empty());  // not DYNAMIC
  REQUIRE(state.list_jobs().size() == 2);
  CHECK(state.list_jobs()[1]->job_id == 2001);
}

TEST_CASE("next_available_job_id is monotonic") {
  DispatcherState state;
  setup(state);
  ok(state, job_of(state.next_available_job_id()));
  CHECK(state.next_available_job_id() == 2001);
  ok(state, job_of(5000));
  CHECK(state.next_available_job_id() == 5001);
  ok(state, job_of(2500));
  CHECK(state.next_available_job_id() == 5001);
}

TEST_CASE("CreateJob rejects malformed parameters") {
  DispatcherState state;
  setup(state);
  rejected(state, job_of(-1), StatusCode::kInvalidArgument);

  CreateJob c = job_of(1, "ds", "n");
  c.num_consumers = -1;
  rejected(state, c, StatusCode::kInvalidArgument);

  c = job_of(1, "ds", "n", ProcessingMode::kDynamic);
  c.num_split_providers = -1;
  rejected(state, c, StatusCode::kInvalidArgument);

  c = job_of(1);
  c.num_consumers = 2;  // coordinated reads need a name
  rejected(state, c, StatusCode::kInvalidArgument);

  c = job_of(1, "ds", "n");
  c.num_consumers = 2;
  c.target_workers = TargetWorkers::kLocal;
  rejected(state, c, StatusCode::kInvalidArgument);

  c = job_of(1);
  c.cross_trainer_cache = true;  // needs a name
  rejected(state, c, StatusCode::kInvalidArgument);

  c = job_of(1, "ds", "n");
  c.cross_trainer_cache = true;
  c.num_consumers = 2;
  rejected(state, c, StatusCode::kInvalidArgument);
}

TEST_CASE("CreateJob rejects duplicate ids and unknown datasets") {
  DispatcherState state;
  setup(state);
  ok(state, job_of(1));
  rejected(state, job_of(1), StatusCode::kAlreadyExists);
  rejected(state, job_of(2, "missing"), StatusCode::kNotFound);
}

TEST_CASE("job queries report NotFound") {
  DispatcherState state;
  CHECK(state.job_from_id(1).status().code() == StatusCode::kNotFound);
  CHECK(state.job_for_name("x").status().code() == StatusCode::kNotFound);
  CHECK(state.tasks_for_job(1).status().code() == StatusCode::kNotFound);
  CHECK(state.pending_tasks_for_job(1).status().code() == StatusCode::kNotFound);
  CHECK(state.job_clients_for_job(1).status().code() == StatusCode::kNotFound);
  CHECK(state.num_job_clients(1).status().code() == StatusCode::kNotFound);
  CHECK(state.job_for_job_client_id(1).status().code() == StatusCode::kNotFound);
  CHECK(state.task_from_id(1).status().code() == StatusCode::kNotFound);
}

TEST_CASE("named jobs are found by name and the name is unique while the job lives") {
  DispatcherState state;
  setup(state, {job_of(1, "ds", "shared")});
  ok(state, job_of(2));  // anonymous
  auto named = state.job_for_name("shared");
  REQUIRE(named.ok());
  CHECK((*named)->job_id == 1);
  CHECK(state.job_for_name("").status().code() == StatusCode::kNotFound);
  rejected(state, job_of(3, "ds", "shared"), StatusCode::kAlreadyExists);

  // Consumers of the name share job 1.
  ok(state, AcquireJobClient{100, (*state.job_for_name("shared"))->job_id});
  ok(state, AcquireJobClient{101, (*state.job_for_name("shared"))->job_id});
  CHECK(*state.num_job_clients(1) == 2);
}

TEST_CASE("a garbage-collected job's name can be taken by a new job") {
  DispatcherState state;
  setup(state, {job_of(1, "ds", "shared")});
  ok(state, GarbageCollectJob{1});
  auto old = state.job_for_name("shared");
  REQUIRE(old.ok());
  CHECK((*old)->job_id == 1);
  CHECK((*old)->garbage_collected);

  ok(state, job_of(2, "ds", "shared"));
  CHECK((*state.job_for_name("shared"))->job_id == 2);
  CHECK(state.job_from_id(1).ok());  // the old job stays queryable
}

// ---- job clients ----------------------------------------------------------------

TEST_CASE("AcquireJobClient and ReleaseJobClient track a job's clients") {
  DispatcherState state;
  setup(state, {job_of(1), job_of(2)});
  ok(state, AcquireJobClient{state.next_available_job_client_id(), 1});
  ok(state, AcquireJobClient{3005, 1});
  ok(state, AcquireJobClient{3001, 2});
  CHECK(state.next_available_job_client_id() == 3006);
  CHECK(*state.job_clients_for_job(1) == std::vector<int64_t>{3000, 3005});
  CHECK(*state.num_job_clients(1) == 2);
  CHECK((*state.job_for_job_client_id(3001))->job_id == 2);
  CHECK(state.list_active_job_client_ids() == std::vector<int64_t>{3000, 3001, 3005});

  ok(state, ReleaseJobClient{3000, 500});
  CHECK(*state.job_clients_for_job(1) == std::vector<int64_t>{3005});
  CHECK((*state.job_from_id(1))->last_client_released_micros == 500);
  CHECK(state.job_for_job_client_id(3000).status().code() == StatusCode::kNotFound);
  CHECK(state.list_active_job_client_ids() == std::vector<int64_t>{3001, 3005});
  CHECK(state.next_available_job_client_id() == 3006);  // ids are not reused

  ok(state, ReleaseJobClient{3005, 700});
  CHECK(*state.num_job_clients(1) == 0);
  CHECK((*state.job_from_id(1))->last_client_released_micros == 700);
}

TEST_CASE("AcquireJobClient rejects bad ids, unknown and collected jobs") {
  DispatcherState state;
  setup(state, {job_of(1), job_of(2)});
  ok(state, AcquireJobClient{10, 1});
  rejected(state, AcquireJobClient{-1, 1}, StatusCode::kInvalidArgument);
  rejected(state, AcquireJobClient{10, 2}, StatusCode::kAlreadyExists);
  rejected(state, AcquireJobClient{11, 99}, StatusCode::kNotFound);
  ok(state, GarbageCollectJob{2});
  rejected(state, AcquireJobClient{11, 2}, StatusCode::kFailedPrecondition);
}

TEST_CASE("ReleaseJobClient rejects unknown clients and negative times") {
  DispatcherState state;
  setup(state, {job_of(1), AcquireJobClient{10, 1}});
  rejected(state, ReleaseJobClient{10, -5}, StatusCode::kInvalidArgument);
  rejected(state, ReleaseJobClient{11, 5}, StatusCode::kNotFound);
  ok(state, ReleaseJobClient{10, 5});
  rejected(state, ReleaseJobClient{10, 6}, StatusCode::kNotFound);  // released twice
}

// ---- tasks --------------------------------------------------------------------

TEST_CASE("CreateTask assigns a task to a worker") {
  DispatcherState state;
  setup(state, {job_of(1), job_of(2)});
  ok(state, CreateTask{state.next_available_task_id(), 1, "w1"});
  ok(state, CreateTask{4007, 1, "w2"});
  ok(state, CreateTask{4003, 2, "w1"});
  CHECK(state.next_available_task_id() == 4008);

  auto task = state.task_from_id(4007);
  REQUIRE(task.ok());
  CHECK((*task)->job_id == 1);
  CHECK((*task)->worker_address == "w2");
  CHECK((*task)->starting_round == 0);
  CHECK_FALSE((*task)->pending);
  CHECK_FALSE((*task)->finished);
  CHECK(ids_of(*state.tasks_for_job(1)) == std::vector<int64_t>{4000, 4007});
  CHECK(ids_of(*state.tasks_for_worker("w1")) == std::vector<int64_t>{4000, 4003});
  CHECK(ids_of(*state.tasks_for_worker("w2")) == std::vector<int64_t>{4007});
}

TEST_CASE("CreateTask rejects bad ids, unknown jobs and workers, and dead jobs") {
  DispatcherState state;
  setup(state, {job_of(1), job_of(2), job_of(3)});
  ok(state, CreateTask{10, 1, "w1"});
  rejected(state, CreateTask{-1, 1, "w2"}, StatusCode::kInvalidArgument);
  rejected(state, CreateTask{10, 1, "w2"}, StatusCode::kAlreadyExists);
  rejected(state, CreateTask{11, 99, "w1"}, StatusCode::kNotFound);
  rejected(state, CreateTask{11, 1, "nobody"}, StatusCode::kNotFound);
  rejected(state, CreateTask{11, 1, "w1"}, StatusCode::kAlreadyExists);  // one per worker

  ok(state, GarbageCollectJob{2});
  rejected(state, CreateTask{11, 2, "w1"}, StatusCode::kFailedPrecondition);

  ok(state, CreateTask{12, 3, "w1"});
  ok(state, FinishTask{12});
  REQUIRE((*state.job_from_id(3))->finished);
  rejected(state, CreateTask{13, 3, "w2"}, StatusCode::kFailedPrecondition);
}

TEST_CASE("a job is finished when all its tasks are finished") {
  DispatcherState state;
  setup(state, {job_of(1), CreateTask{10, 1, "w1"}, CreateTask{11, 1, "w2"}});
  ok(state, FinishTask{10});
  CHECK((*state.task_from_id(10))->finished);
  CHECK_FALSE((*state.job_from_id(1))->finished);
  CHECK(state.tasks_for_worker("w1")->empty());  // only unfinished tasks
  CHECK(ids_of(*state.tasks_for_job(1)) == std::vector<int64_t>{10, 11});

  ok(state, FinishTask{11});
  CHECK((*state.job_from_id(1))->finished);
  CHECK_FALSE((*state.job_from_id(1))->garbage_collected);
}

TEST_CASE("FinishTask rejects unknown, finished and pending tasks") {
  DispatcherState state;
  setup(state, {round_robin_job(1, 1), CreateTask{10, 1, "w1"}, CreatePendingTask{11, 1, "w2", 5}});
  rejected(state, FinishTask{99}, StatusCode::kNotFound);
  rejected(state, FinishTask{11}, StatusCode::kFailedPrecondition);
  ok(state, FinishTask{10});
  rejected(state, FinishTask{10}, StatusCode::kFailedPrecondition);
}

TEST_CASE("RemoveTask erases a task everywhere") {
  DispatcherState state;
  setup(state, {job_of(1), CreateTask{10, 1, "w1"}, CreateTask{11, 1, "w2"}});
  ok(state, FinishTask{10});
  ok(state, RemoveTask{11});
  CHECK(state.task_from_id(11).status().code() == StatusCode::kNotFound);
  CHECK(ids_of(*state.tasks_for_job(1)) == std::vector<int64_t>{10});
  CHECK(state.tasks_for_worker("w2")->empty());
  // The remaining tasks are all finished.
  CHECK((*state.job_from_id(1))->finished);
  CHECK(state.next_available_task_id() == 4000);  // ids below the counter leave it
  rejected(state, RemoveTask{11}, StatusCode::kNotFound);
}

TEST_CASE("RemoveTask drops a pending task from the queue") {
  DispatcherState state;
  setup(state, {round_robin_job(1, 2), CreatePendingTask{10, 1, "w1", 3}, CreatePendingTask{11, 1, "w2", 4}});
  ok(state, RemoveTask{10});
  CHECK(ids_of(*state.pending_tasks_for_job(1)) == std::vector<int64_t>{11});
  CHECK(state.tasks_for_worker("w1")->empty());
  CHECK_FALSE((*state.job_from_id(1))->finished);
}

// ---- coordinated reads ----------------------------------------------------------

TEST_CASE("a pending task becomes active once every consumer accepts it") {
  DispatcherState state;
  setup(state, {round_robin_job(1, 2),
                CreateTask{10, 1, "w1"},
                AcquireJobClient{100, 1},
                AcquireJobClient{101, 1},
                CreatePendingTask{11, 1, "w2", 5}});

  CHECK(ids_of(*state.pending_tasks_for_job(1)) == std::vector<int64_t>{11});
  CHECK(ids_of(*state.tasks_for_job(1)) == std::vector<int64_t>{10});
  CHECK(ids_of(*state.tasks_for_worker("w2")) == std::vector<int64_t>{11});
  CHECK((*state.task_from_id(11))->pending);

  ok(state, ClientHeartbeat{100, true, std::nullopt});
  CHECK((*state.job_from_id(1))->pending_tasks.front().ready_consumers.size() == 1);
  // A consumer rejects: acceptances reset, the target round moves.
  ok(state, ClientHeartbeat{101, false, int64_t{8}});
  const auto& pending = (*state.job_from_id(1))->pending_tasks.front();
  CHECK(pending.ready_consumers.empty());
  CHECK(pending.failures == 1);
  CHECK(pending.target_round == 8);

  ok(state, ClientHeartbeat{100, true, std::nullopt});
  ok(state, ClientHeartbeat{100, true, std::nullopt});  // repeated: still one
  CHECK((*state.task_from_id(11))->pending);
  ok(state, ClientHeartbeat{101, true, std::nullopt});
  CHECK(state.pending_tasks_for_job(1)->empty());
  CHECK(ids_of(*state.tasks_for_job(1)) == std::vector<int64_t>{10, 11});
  CHECK_FALSE((*state.task_from_id(11))->pending);
  CHECK((*state.task_from_id(11))->starting_round == 8);
  CHECK(state.next_available_task_id() == 4000);
}

TEST_CASE("CreatePendingTask needs a round-robin job and a valid round") {
  DispatcherState state;
  setup(state, {job_of(1), round_robin_job(2, 2), CreateTask{10, 2, "w1"}});
  rejected(state, CreatePendingTask{11, 1, "w1", 0}, StatusCode::kFailedPrecondition);
  rejected(state, CreatePendingTask{11, 2, "w2", -1}, StatusCode::kInvalidArgument);
  rejected(state, CreatePendingTask{10, 2, "w2", 0}, StatusCode::kAlreadyExists);
  rejected(state, CreatePendingTask{11, 99, "w2", 0}, StatusCode::kNotFound);
  rejected(state, CreatePendingTask{11, 2, "nobody", 0}, StatusCode::kNotFound);
  rejected(state, CreatePendingTask{11, 2, "w1", 0}, StatusCode::kAlreadyExists);
}

TEST_CASE("ClientHeartbeat rejects malformed answers, unknown clients and empty queues") {
  DispatcherState state;
  setup(state, {round_robin_job(1, 1), AcquireJobClient{100, 1}});
  rejected(state, ClientHeartbeat{100, false, std::nullopt}, StatusCode::kInvalidArgument);
  rejected(state, ClientHeartbeat{100, true, int64_t{3}}, StatusCode::kInvalidArgument);
  rejected(state, ClientHeartbeat{100, false, int64_t{-3}}, StatusCode::kInvalidArgument);
  rejected(state, ClientHeartbeat{999, true, std::nullopt}, StatusCode::kNotFound);
  rejected(state, ClientHeartbeat{100, true, std::nullopt}, StatusCode::kFailedPrecondition);
}

// ---- splits --------------------------------------------------------------------

TEST_CASE("ProduceSplit counts splits per provider across repetitions") {
  DispatcherState state;
  setup(state, {dynamic_job(1, 2)});
  CHECK(*state.split_state(1, 0) == SplitState{0, 0});

  for (int i = 0; i < 3; ++i) ok(state, ProduceSplit{1, 0, 0, false});
  ok(state, ProduceSplit{1, 0, 1, false});
  CHECK(*state.split_state(1, 0) == SplitState{0, 3});
  CHECK(*state.split_state(1, 1) == SplitState{0, 1});

  ok(state, ProduceSplit{1, 0, 0, true});  // provider 0 reached its end
  CHECK(*state.split_state(1, 0) == SplitState{1, 0});
  CHECK(*state.split_state(1, 1) == SplitState{0, 1});

  ok(state, ProduceSplit{1, 1, 0, false});
  ok(state, ProduceSplit{1, 1, 0, false});
  CHECK(*state.split_state(1, 0) == SplitState{1, 2});
  ok(state, ProduceSplit{1, 1, 0, true});
  ok(state, ProduceSplit{1, 2, 0, true});  // an empty repetition
  CHECK(*state.split_state(1, 0) == SplitState{3, 0});
}

TEST_CASE("ProduceSplit for a later repetition restarts the count there") {
  DispatcherState state;
  setup(state, {job_of(1, "ds", "", ProcessingMode::kDynamic)});
  ok(state, ProduceSplit{1, 0, 0, false});
  ok(state, ProduceSplit{1, 0, 0, false});
  ok(state, ProduceSplit{1, 2, 0, false});
  CHECK(*state.split_state(1, 0) == SplitState{2, 1});
  rejected(state, ProduceSplit{1, 1, 0, false}, StatusCode::kFailedPrecondition);
}

TEST_CASE("ProduceSplit rejects unknown, non-dynamic and collected jobs and bad indices") {
  DispatcherState state;
  setup(state, {job_of(1), dynamic_job(2, 2)});
  ok(state, job_of(3, "ds", "", ProcessingMode::kDynamic));
  rejected(state, ProduceSplit{99, 0, 0, false}, StatusCode::kNotFound);
  rejected(state, ProduceSplit{1, 0, 0, false}, StatusCode::kFailedPrecondition);
  rejected(state, ProduceSplit{2, 0, 2, false}, StatusCode::kInvalidArgument);
  rejected(state, ProduceSplit{2, 0, -1, false}, StatusCode::kInvalidArgument);
  ok(state, GarbageCollectJob{3});
  rejected(state, ProduceSplit{3, 0, 0, false}, StatusCode::kFailedPrecondition);
}

// Found by fuzz/journal_fuzz: a CreateJob record with 2^40 split providers
// made the state allocate terabytes and killed the process on replay.
TEST_CASE("CreateJob with more split providers than any pipeline has is InvalidArgument") {
  DispatcherState state;
  setup(state);
  CreateJob c = job_of(1, "ds", "", ProcessingMode::kDynamic);
  c.num_split_providers = int64_t{1} << 40;
  rejected(state, c, StatusCode::kInvalidArgument);
  c.num_split_providers = kMaxSplitProviders;
  ok(state, c);
}

TEST_CASE("ProduceSplit leases a split to a running task of its job, in order") {
  DispatcherState state;
  setup(state, {dynamic_job(1, 2)});
  ok(state, job_of(2, "ds", "", ProcessingMode::kDynamic));
  ok(state, CreateTask{10, 1, "w1"});
  ok(state, CreateTask{11, 1, "w2"});
  ok(state, CreateTask{20, 2, "w1"});
  using Lease = DispatcherState::Lease;
  CHECK((*state.leases(1, 0, 10))->empty());
  ok(state, ProduceSplit{1, 0, 0, false, 10});
  ok(state, ProduceSplit{1, 0, 0, false, 11});
  ok(state, ProduceSplit{1, 0, 0, false, 10});
  ok(state, ProduceSplit{1, 0, 1, false, 10});
  ok(state, ProduceSplit{1, 0, 0, false});  // an old journal's: nobody's
  CHECK(**state.leases(1, 0, 10) == std::vector<Lease>{{0, 0}, {0, 2}});
  CHECK(**state.leases(1, 0, 11) == std::vector<Lease>{{0, 1}});
  CHECK(**state.leases(1, 1, 10) == std::vector<Lease>{{0, 0}});
  CHECK(*state.split_state(1, 0) == SplitState{0, 4});

  rejected(state, ProduceSplit{1, 0, 0, false, 20}, StatusCode::kNotFound);  // job 2's task
  rejected(state, ProduceSplit{1, 0, 0, false, 99}, StatusCode::kNotFound);
  rejected(state, ProduceSplit{1, 0, 0, true, 10}, StatusCode::kInvalidArgument);
  CHECK(*state.split_state(1, 0) == SplitState{0, 4});  // rejected: nothing changed

  // The end of a repetition keeps the leases: a task may ask again.
  ok(state, ProduceSplit{1, 0, 0, true});
  CHECK(state.leases(1, 0, 10).value()->size() == 2);
  // A finished task's leases go, and it gets no more.
  ok(state, FinishTask{10});
  CHECK((*state.leases(1, 0, 10))->empty());
  CHECK((*state.leases(1, 1, 10))->empty());
  rejected(state, ProduceSplit{1, 1, 0, false, 10}, StatusCode::kFailedPrecondition);
  CHECK(state.leases(1, 2, 10).status().code() == StatusCode::kInvalidArgument);
  ok(state, GarbageCollectJob{1});
  CHECK((*state.leases(1, 0, 11))->empty());
}

TEST_CASE("ReassignTask moves a task with its leases to another worker, even one running the same job") {
  DispatcherState state;
  setup(state, {job_of(1, "ds", "", ProcessingMode::kDynamic), CreateTask{10, 1, "w1"}, CreateTask{11, 1, "w2"}});
  ok(state, ProduceSplit{1, 0, 0, false, 10});
  ok(state, ProduceSplit{1, 0, 0, false, 11});
  ok(state, ProduceSplit{1, 0, 0, false, 10});
  ok(state, ReassignTask{10, "w2"});
  CHECK((*state.task_from_id(10))->worker_address == "w2");
  CHECK(ids_of(*state.tasks_for_worker("w2")) == std::vector<int64_t>{10, 11});
  CHECK(state.tasks_for_worker("w1")->empty());
  // Its place in the job and its leases stay: the new worker replays them.
  CHECK(ids_of(*state.tasks_for_job(1)) == std::vector<int64_t>{10, 11});
  CHECK(**state.leases(1, 0, 10) == std::vector<DispatcherState::Lease>{{0, 0}, {0, 2}});
  // Finishing it on its new worker finishes it.
  ok(state, FinishTask{10});
  CHECK(ids_of(*state.tasks_for_worker("w2")) == std::vector<int64_t>{11});
}

TEST_CASE("ReassignTask rejects unknown, finished and pending tasks, unknown workers and no move") {
  DispatcherState state;
  setup(state);
  CreateJob rr = job_of(1, "ds", "rounds");
  rr.num_consumers = 2;
  ok(state, rr);
  ok(state, CreateTask{10, 1, "w1"});
  ok(state, CreateTask{11, 1, "w2"});
  ok(state, RegisterWorker{"w3", "", {}});
  ok(state, CreatePendingTask{12, 1, "w3", 5});
  rejected(state, ReassignTask{99, "w2"}, StatusCode::kNotFound);
  rejected(state, ReassignTask{10, "nobody"}, StatusCode::kNotFound);
  rejected(state, ReassignTask{10, "w1"}, StatusCode::kInvalidArgument);
  rejected(state, ReassignTask{12, "w2"}, StatusCode::kFailedPrecondition);
  ok(state, FinishTask{11});
  rejected(state, ReassignTask{11, "w1"}, StatusCode::kFailedPrecondition);
}

TEST_CASE("split_state reports errors") {
  DispatcherState state;
  setup(state, {job_of(1), job_of(2, "ds", "", ProcessingMode::kDynamic)});
  CHECK(state.split_state(99, 0).status().code() == StatusCode::kNotFound);
  CHECK(state.split_state(1, 0).status().code() == StatusCode::kFailedPrecondition);
  CHECK(state.split_state(2, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(state.split_state(2, -1).status().code() == StatusCode::kInvalidArgument);
}

// ---- garbage collection -------------------------------------------------------------

TEST_CASE("GarbageCollectJob ends the job's tasks") {
  DispatcherState state;
  setup(state, {round_robin_job(1, 2), CreateTask{10, 1, "w1"}, CreatePendingTask{11, 1, "w2", 3}});
  ok(state, GarbageCollectJob{1});
  const Job& job = **state.job_from_id(1);
  CHECK(job.finished);
  CHECK(job.garbage_collected);
  CHECK((*state.task_from_id(10))->finished);
  CHECK(state.task_from_id(11).status().code() == StatusCode::kNotFound);
  CHECK(state.pending_tasks_for_job(1)->empty());
  CHECK(state.tasks_for_worker("w1")->empty());
  CHECK(state.tasks_for_worker("w2")->empty());
  CHECK(ids_of(*state.tasks_for_job(1)) == std::vector<int64_t>{10});
  rejected(state, FinishTask{10}, StatusCode::kFailedPrecondition);
}

TEST_CASE("GarbageCollectJob rejects unknown, collected and attended jobs") {
  DispatcherState state;
  setup(state, {job_of(1), job_of(2), AcquireJobClient{100, 2}});
  rejected(state, GarbageCollectJob{99}, StatusCode::kNotFound);
  rejected(state, GarbageCollectJob{2}, StatusCode::kFailedPrecondition);
  ok(state, GarbageCollectJob{1});
  rejected(state, GarbageCollectJob{1}, StatusCode::kFailedPrecondition);
}

TEST_CASE("jobs_to_collect follows the client release timeline") {
  DispatcherState state;
  setup(state);
  const int64_t timeout = 50;
  ok(state, job_of(1));  // never had a client: not collected
  ok(state, job_of(2));
  ok(state, job_of(3));
  CHECK(state.jobs_to_collect(1'000'000, timeout).empty());

  ok(state, AcquireJobClient{100, 2});
  ok(state, AcquireJobClient{101, 2});
  ok(state, AcquireJobClient{102, 3});
  CHECK(state.jobs_to_collect(1'000'000, timeout).empty());

  ok(state, ReleaseJobClient{100, 100});
  CHECK(state.jobs_to_collect(1'000'000, timeout).empty());  // 101 still reads
  ok(state, ReleaseJobClient{101, 120});
  ok(state, ReleaseJobClient{102, 110});
  CHECK(state.jobs_to_collect(159, timeout).empty());
  CHECK(state.jobs_to_collect(160, timeout) == std::vector<int64_t>{3});
  CHECK(state.jobs_to_collect(170, timeout) == std::vector<int64_t>{2, 3});
  CHECK(state.jobs_to_collect(170, 0) == std::vector<int64_t>{2, 3});
  CHECK(state.jobs_to_collect(1'000'000, -1).empty());  // never collect

  // A consumer comes back to job 3: it is no longer a candidate.
  ok(state, AcquireJobClient{103, 3});
  CHECK(state.jobs_to_collect(170, timeout) == std::vector<int64_t>{2});

  ok(state, GarbageCollectJob{2});
  CHECK(state.jobs_to_collect(10'000, timeout).empty());

  // A finished job is not collected either.
  ok(state, CreateTask{10, 3, "w1"});
  ok(state, ReleaseJobClient{103, 200});
  CHECK(state.jobs_to_collect(10'000, timeout) == std::vector<int64_t>{3});
  ok(state, FinishTask{10});
  CHECK(state.jobs_to_collect(10'000, timeout).empty());
}

// ---- replay ----------------------------------------------------------------------

// A journal: every kind of update, including one the state rejects.
std::vector<Update> journal() {
  CreateJob dyn = job_of(2000, "1000", "", ProcessingMode::kDynamic);
  dyn.num_split_providers = 2;
  CreateJob rr = job_of(2001, "1000", "shared");
  rr.num_consumers = 2;
  rr.target_workers = TargetWorkers::kAny;
  CreateJob ctc = job_of(2002, "other", "cache", ProcessingMode::kOff);
  ctc.cross_trainer_cache = true;
  return {
      RegisterDataset{"1000", 11},
      RegisterDataset{"other", 12},
      RegisterWorker{"w1", "w1:t", {"gpu"}},
      RegisterWorker{"w2", "", {}},
      RegisterWorker{"w3", "", {"x", "y"}},
      dyn,
      rr,
      ctc,
      AcquireJobClient{3000, 2000},
      AcquireJobClient{3001, 2001},
      AcquireJobClient{3002, 2001},
      AcquireJobClient{3003, 2002},
      CreateTask{4000, 2000, "w1"},
      CreateTask{4001, 2000, "w2"},
      CreateTask{4002, 2001, "w1"},
      CreateTask{4003, 2002, "w2"},
      CreateTask{4006, 2000, "w3"},
      ProduceSplit{2000, 0, 0, false},
      ProduceSplit{2000, 0, 0, false},
      ProduceSplit{2000, 0, 1, false},
      ProduceSplit{2000, 0, 0, true},
      ProduceSplit{2000, 1, 0, false},
      ProduceSplit{2000, 1, 0, false, 4006},  // leases
      ProduceSplit{2000, 1, 0, false, 4000},
      ProduceSplit{2000, 1, 0, false, 4006},
      ProduceSplit{2000, 1, 1, false, 4001},
      CreatePendingTask{4004, 2001, "w3", 7},
      ClientHeartbeat{3001, true, std::nullopt},
      ClientHeartbeat{3002, false, int64_t{9}},
      ClientHeartbeat{3001, true, std::nullopt},
      ClientHeartbeat{3002, true, std::nullopt},
      CreatePendingTask{4005, 2001, "w2", 12},
      FinishTask{4000},
      FinishTask{4000},  // rejected on the first run and on replay
      RemoveTask{4001},
      RegisterWorker{"w2", "w2:t", {"late"}},
      ReleaseJobClient{3003, 5000},
      GarbageCollectJob{2002},
      job_of(2010, "other", "cache"),
      AcquireJobClient{3010, 2010},
      ReleaseJobClient{3000, 6000},
  };
}

TEST_CASE("replaying the encoded journal rebuilds identical state") {
  DispatcherState a;
  std::vector<std::string> records;
  std::vector<StatusCode> codes_a;
  for (const Update& u : journal()) {
    records.push_back(encode(u));  // journal first, then apply
    codes_a.push_back(a.apply(u).code());
  }
  CHECK(std::count(codes_a.begin(), codes_a.end(), StatusCode::kOk) ==
        static_cast<long>(codes_a.size()) - 1);

  DispatcherState b;
  std::vector<StatusCode> codes_b;
  for (const std::string& record : records) {
    Result<Update> u = decode(record);
    REQUIRE(u.ok());
    codes_b.push_back(b.apply(*u).code());
  }
  CHECK(codes_a == codes_b);
  CHECK(a.debug_string() == b.debug_string());

  // And query by query.
  CHECK(a.next_available_dataset_id() == b.next_available_dataset_id());
  CHECK(a.next_available_job_id() == b.next_available_job_id());
  CHECK(a.next_available_job_client_id() == b.next_available_job_client_id());
  CHECK(a.next_available_task_id() == b.next_available_task_id());
  CHECK(b.next_available_job_id() == 2011);
  CHECK(b.next_available_job_client_id() == 3011);
  CHECK(b.next_available_task_id() == 4007);
  CHECK((*b.dataset_for_fingerprint(12))->dataset_id == "other");
  CHECK((*b.worker_from_address("w2"))->tags == std::vector<std::string>{"late"});
  CHECK((*a.job_for_name("cache"))->job_id == 2010);
  CHECK((*b.job_for_name("cache"))->job_id == 2010);
  CHECK((*b.job_for_name("shared"))->job_id == 2001);
  CHECK(*a.split_state(2000, 0) == *b.split_state(2000, 0));
  CHECK(*b.split_state(2000, 0) == SplitState{1, 4});
  CHECK(*b.split_state(2000, 1) == SplitState{1, 1});
  // Task 4006 holds its two leases; finished 4000's and removed 4001's went.
  using Lease = DispatcherState::Lease;
  CHECK(**b.leases(2000, 0, 4006) == std::vector<Lease>{{1, 1}, {1, 3}});
  CHECK((*b.leases(2000, 0, 4000))->empty());
  CHECK((*b.leases(2000, 1, 4001))->empty());
  CHECK(a.list_active_job_client_ids() == b.list_active_job_client_ids());
  for (int64_t job_id : {2000, 2001, 2002, 2010}) {
    INFO(job_id);
    CHECK(ids_of(*a.tasks_for_job(job_id)) == ids_of(*b.tasks_for_job(job_id)));
    CHECK(ids_of(*a.pending_tasks_for_job(job_id)) ==
          ids_of(*b.pending_tasks_for_job(job_id)));
    CHECK(*a.job_clients_for_job(job_id) == *b.job_clients_for_job(job_id));
    CHECK((*a.job_from_id(job_id))->finished == (*b.job_from_id(job_id))->finished);
    CHECK((*a.job_from_id(job_id))->garbage_collected ==
          (*b.job_from_id(job_id))->garbage_collected);
  }
  CHECK(ids_of(*b.tasks_for_job(2001)) == std::vector<int64_t>{4002, 4004});
  CHECK((*b.task_from_id(4004))->starting_round == 9);
  CHECK(ids_of(*b.pending_tasks_for_job(2001)) == std::vector<int64_t>{4005});
  for (const char* w : {"w1", "w2", "w3"}) {
    INFO(w);
    CHECK(ids_of(*a.tasks_for_worker(w)) == ids_of(*b.tasks_for_worker(w)));
  }
  CHECK(a.jobs_to_collect(7000, 100) == b.jobs_to_collect(7000, 100));
  CHECK(b.jobs_to_collect(7000, 100) == std::vector<int64_t>{2000});
}

}  // namespace
}  // namespace capstan::data_dispatcher
