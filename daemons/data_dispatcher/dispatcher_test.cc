#include "daemons/data_dispatcher/dispatcher.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "io/memory_file_system.h"
#include "io/testing.h"
#include "sync/mutex.h"

namespace capstan::data_dispatcher {
namespace {

namespace fs = std::filesystem;
using io::testing::SyncGate;
using io::testing::TempDir;
using std::chrono::milliseconds;

class FakeClock final : public DispatcherClock {
 public:
  std::chrono::steady_clock::time_point steady_now() override { return steady_; }
  int64_t wall_micros() override { return wall_micros_; }
  void advance(milliseconds d) {
    steady_ += d;
    wall_micros_ += d.count() * 1000;
  }

 private:
  std::chrono::steady_clock::time_point steady_{};
  int64_t wall_micros_ = 1'000'000'000;
};

DispatcherConfig test_config(std::string work_dir = "") {
  DispatcherConfig config;
  config.work_dir = std::move(work_dir);
  config.client_timeout = milliseconds(1000);
  config.worker_timeout = milliseconds(1000);
  config.job_gc_timeout = milliseconds(5000);
  return config;
}

std::unique_ptr<Dispatcher> open(FakeClock& clock, std::string work_dir = "") {
  auto d = Dispatcher::open(test_config(std::move(work_dir)), nullptr, clock);
  REQUIRE(d.ok());
  return std::move(*d);
}

std::string register_range(Dispatcher& d, int64_t n) {
  auto id = d.register_dataset(data::Dataset::range(n).serialize());
  REQUIRE(id.ok());
  return *id;
}

void add_worker(Dispatcher& d, const std::string& address) {
  REQUIRE(d.worker_heartbeat(address, {}).ok());
}

GetOrCreateJobRequest job(std::string dataset_id, std::string name = "",
                          ProcessingMode mode = ProcessingMode::kOff, int64_t num_consumers = 0) {
  GetOrCreateJobRequest r;
  r.dataset_id = std::move(dataset_id);
  r.job_name = std::move(name);
  r.processing_mode = mode;
  r.num_consumers = num_consumers;
  return r;
}

TEST_CASE("the same definition gets the same dataset id, a bad one is refused") {
  FakeClock clock;
  auto d = open(clock);
  std::string a = register_range(*d, 10);
  CHECK(register_range(*d, 10) == a);
  CHECK(register_range(*d, 11) != a);
  CHECK(d->dataset_definition(a).value() == data::Dataset::range(10).serialize());
  CHECK(d->dataset_definition("nope").status().code() == StatusCode::kNotFound);
  CHECK_FALSE(d->register_dataset("not a dataset").ok());
}

TEST_CASE("a dataset's compression reaches its tasks, gives it its own id, and survives a restart") {
  TempDir dir;
  FakeClock clock;
  std::string definition = data::Dataset::range(10).serialize();
  std::string zstd;
  std::string automatic;
  {
    auto d = open(clock, dir.path());
    automatic = d->register_dataset(definition).value();
    CHECK(d->register_dataset(definition, "auto").value() == automatic);
    zstd = d->register_dataset(definition, "ZSTD").value();
    CHECK(zstd != automatic);
    CHECK(d->register_dataset(definition, "zstd").value() == zstd);
    CHECK(d->register_dataset(definition, "NONE").value() != zstd);

    Status bad = d->register_dataset(definition, "snappy").status();
    CHECK(bad.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(bad.message(), Catch::Contains("'snappy'") && Catch::Contains("AUTO") && Catch::Contains("ZSTD"));
  }
  auto d = open(clock, dir.path());  // replays the journal
  add_worker(*d, "w1:1");
  REQUIRE(d->get_or_create_job(job(zstd, "z")).ok());
  REQUIRE(d->get_or_create_job(job(automatic, "a")).ok());
  auto heartbeat = d->worker_heartbeat("w1:1", {});
  REQUIRE(heartbeat.ok());
  REQUIRE(heartbeat->new_tasks.size() == 2);
  for (const TaskDef& def : heartbeat->new_tasks) {
    CHECK(def.compression ==
          (def.dataset_id == zstd ? wire::ElementCompression::ZSTD : wire::ElementCompression::AUTO));
  }
  for (const DatasetInfo& info : d->list_datasets()) {
    if (info.dataset_id == zstd) CHECK(info.compression == wire::ElementCompression::ZSTD);
  }
  CHECK(d->register_dataset(definition, "ZSTD").value() == zstd);
}

TEST_CASE("a named job is shared by consumers asking with the same parameters") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  auto first = d->get_or_create_job(job(ds, "train"));
  auto second = d->get_or_create_job(job(ds, "train"));
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(first->job_id == second->job_id);
  CHECK(first->job_client_id != second->job_client_id);
  auto anonymous1 = d->get_or_create_job(job(ds));
  auto anonymous2 = d->get_or_create_job(job(ds));
  CHECK(anonymous1->job_id != anonymous2->job_id);
}

TEST_CASE("a named job asked for with other parameters is InvalidArgument") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  std::string other = register_range(*d, 20);
  REQUIRE(d->get_or_create_job(job(ds, "train")).ok());
  auto different_dataset = d->get_or_create_job(job(other, "train"));
  CHECK(different_dataset.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(different_dataset.status().message(), Catch::Contains("other parameters"));
  CHECK(d->get_or_create_job(job(ds, "train", ProcessingMode::kDynamic)).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("get_or_create_job checks its request") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  CHECK(d->get_or_create_job(job("missing")).status().code() == StatusCode::kNotFound);
  CHECK(d->get_or_create_job(job(ds, "", ProcessingMode::kOff, -1)).status().code() ==
        StatusCode::kInvalidArgument);
  GetOrCreateJobRequest cached = job(ds);
  cached.cross_trainer_cache = true;
  CHECK(d->get_or_create_job(cached).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("coordinated reads need an infinite dataset") {
  FakeClock clock;
  auto d = open(clock);
  std::string finite = register_range(*d, 10);
  auto refused = d->get_or_create_job(job(finite, "rr", ProcessingMode::kOff, 2));
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(refused.status().message(), Catch::Contains("infinite"));
  auto infinite = d->register_dataset(data::Dataset::range(10).repeat().serialize());
  REQUIRE(infinite.ok());
  CHECK(d->get_or_create_job(job(*infinite, "rr", ProcessingMode::kOff, 2)).ok());
}

TEST_CASE("static sharding needs workers, and FILE sharding at least one file per worker") {
  FakeClock clock;
  auto d = open(clock);
  auto files = d->register_dataset(data::Dataset::tfrecord_dataset({"/nonexistent/a", "/nonexistent/b"}).serialize());
  REQUIRE(files.ok());
  CHECK(d->get_or_create_job(job(*files, "", ProcessingMode::kFile)).status().code() ==
        StatusCode::kFailedPrecondition);
  add_worker(*d, "w1:1");
  add_worker(*d, "w2:1");
  add_worker(*d, "w3:1");
  auto refused = d->get_or_create_job(job(*files, "", ProcessingMode::kFile));
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("fewer than the 3 workers"));
  CHECK(d->state().list_jobs().empty());  // nothing was created
  // DATA sharding splits by element: any worker count will do.
  std::string range = register_range(*d, 10);
  CHECK(d->get_or_create_job(job(range, "", ProcessingMode::kData)).ok());
}

TEST_CASE("tasks go to the workers present and to workers that join OFF and DYNAMIC jobs") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  add_worker(*d, "w1:1");
  auto off = d->get_or_create_job(job(ds, "off"));
  auto sharded = d->get_or_create_job(job(ds, "data", ProcessingMode::kData));
  REQUIRE(off.ok());
  REQUIRE(sharded.ok());
  CHECK(d->state().tasks_for_job(off->job_id)->size() == 1);

  // The first worker learns of both tasks once; it keeps them afterwards.
  auto w1 = d->worker_heartbeat("w1:1", {});
  REQUIRE(w1.ok());
  REQUIRE(w1->new_tasks.size() == 2);
  CHECK(w1->new_tasks[1].processing_mode == ProcessingMode::kData);
  CHECK(w1->new_tasks[1].num_workers == 1);
  std::vector<int64_t> running{w1->new_tasks[0].task_id, w1->new_tasks[1].task_id, 999};
  auto again = d->worker_heartbeat("w1:1", running);
  CHECK(again->new_tasks.empty());
  CHECK(again->tasks_to_delete == std::vector<int64_t>{999});

  // A new worker joins the OFF job, not the statically sharded one.
  auto w2 = d->worker_heartbeat("w2:1", {});
  REQUIRE(w2.ok());
  REQUIRE(w2->new_tasks.size() == 1);
  CHECK(w2->new_tasks[0].job_id == off->job_id);
  CHECK(d->state().tasks_for_job(sharded->job_id)->size() == 1);

  auto hb = d->client_heartbeat(off->job_client_id);
  REQUIRE(hb.ok());
  CHECK(hb->tasks.size() == 2);
  CHECK_FALSE(hb->job_finished);
  CHECK(d->worker_heartbeat("", {}).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a worker without heartbeats gets no task in a new job") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  add_worker(*d, "old:1");
  clock.advance(milliseconds(1500));  // past worker_timeout
  add_worker(*d, "new:1");
  auto j = d->get_or_create_job(job(ds));
  REQUIRE(j.ok());
  auto tasks = d->state().tasks_for_job(j->job_id);
  REQUIRE(tasks->size() == 1);
  CHECK((*tasks)[0]->worker_address == "new:1");
}

TEST_CASE("finished tasks finish the job") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  add_worker(*d, "w:1");
  auto j = d->get_or_create_job(job(ds));
  int64_t task = d->state().tasks_for_job(j->job_id).value()[0]->task_id;
  REQUIRE(d->finish_task(task).ok());
  REQUIRE(d->finish_task(task).ok());  // twice is fine
  CHECK(d->client_heartbeat(j->job_client_id)->job_finished);
  CHECK(d->finish_task(12345).code() == StatusCode::kNotFound);
}

TEST_CASE("silent clients are released and their job collected after job_gc_timeout") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  auto j = d->get_or_create_job(job(ds, "train"));
  REQUIRE(j.ok());
  clock.advance(milliseconds(800));
  REQUIRE(d->client_heartbeat(j->job_client_id).ok());
  clock.advance(milliseconds(800));  // 1600 since creation, 800 since the heartbeat
  d->collect();
  CHECK(d->state().num_job_clients(j->job_id).value() == 1);
  clock.advance(milliseconds(300));  // 1100 since the heartbeat
  d->collect();
  CHECK(d->state().num_job_clients(j->job_id).value() == 0);
  CHECK(d->client_heartbeat(j->job_client_id).status().code() == StatusCode::kNotFound);

  clock.advance(milliseconds(4000));
  d->collect();
  CHECK_FALSE(d->state().job_from_id(j->job_id).value()->garbage_collected);
  clock.advance(milliseconds(1500));
  d->collect();
  CHECK(d->state().job_from_id(j->job_id).value()->garbage_collected);
  // The name is free again: a new job.
  auto fresh = d->get_or_create_job(job(ds, "train"));
  REQUIRE(fresh.ok());
  CHECK(fresh->job_id != j->job_id);
}

TEST_CASE("a released client's job is collected, a job with clients is not") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  auto released = d->get_or_create_job(job(ds));
  auto kept = d->get_or_create_job(job(ds));
  REQUIRE(d->release_job_client(released->job_client_id).ok());
  for (int i = 0; i < 12; ++i) {
    clock.advance(milliseconds(500));
    REQUIRE(d->client_heartbeat(kept->job_client_id).ok());
    d->collect();
  }
  CHECK(d->state().job_from_id(released->job_id).value()->garbage_collected);
  CHECK_FALSE(d->state().job_from_id(kept->job_id).value()->garbage_collected);
}

// The first element of a range() split: where the chunk begins.
int64_t split_begin(const Result<SplitResponse>& response) {
  REQUIRE(response.ok());
  REQUIRE(response->split.has_value());
  return response->split->components.at(0).flat<int64_t>()[0];
}

int64_t only_task(const Dispatcher& d, int64_t job_id, size_t k = 0) {
  auto tasks = d.state().tasks_for_job(job_id);
  REQUIRE(tasks.ok());
  REQUIRE(tasks->size() > k);
  return (*tasks)[k]->task_id;
}

TEST_CASE("DYNAMIC jobs lease each split to one task, and asking again gets the same split") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 3);
  add_worker(*d, "w1:1");
  add_worker(*d, "w2:1");
  auto j = d->get_or_create_job(job(ds, "", ProcessingMode::kDynamic));
  REQUIRE(j.ok());
  int64_t t1 = only_task(*d, j->job_id, 0);
  int64_t t2 = only_task(*d, j->job_id, 1);
  int64_t a = split_begin(d->get_split(j->job_id, 0, 0, t1, 0));
  int64_t b = split_begin(d->get_split(j->job_id, 0, 0, t2, 0));
  int64_t c = split_begin(d->get_split(j->job_id, 0, 0, t1, 1));
  CHECK(std::set<int64_t>{a, b, c} == std::set<int64_t>{0, 1, 2});
  // A retry (the reply was lost) gets the same split, not the next one.
  CHECK(split_begin(d->get_split(j->job_id, 0, 0, t1, 0)) == a);
  CHECK(split_begin(d->get_split(j->job_id, 0, 0, t1, 1)) == c);
  CHECK(split_begin(d->get_split(j->job_id, 0, 0, t2, 0)) == b);
  CHECK(d->get_split(j->job_id, 0, 0, t1, 2)->end_of_splits);
  CHECK(d->get_split(j->job_id, 0, 0, t2, 1)->end_of_splits);
  CHECK(d->get_split(j->job_id, 0, 0, t2, 1)->end_of_splits);  // a finished repetition

  // Bad requests name what is wrong.
  auto skipping = d->get_split(j->job_id, 0, 0, t2, 5);
  CHECK(skipping.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(skipping.status().message(), Catch::Contains("the next one is number 1"));
  CHECK(d->get_split(j->job_id, 0, 0, t2, -1).status().code() == StatusCode::kInvalidArgument);
  CHECK(d->get_split(j->job_id, 0, 0, 999999, 0).status().code() == StatusCode::kNotFound);
  CHECK(d->get_split(j->job_id, 0, 1, t1, 0).status().code() == StatusCode::kInvalidArgument);
  auto off = d->get_or_create_job(job(ds));
  REQUIRE(off.ok());
  CHECK(d->get_split(off->job_id, 0, 0, t1, 0).status().code() == StatusCode::kFailedPrecondition);
  auto other = d->get_or_create_job(job(ds, "", ProcessingMode::kDynamic));
  REQUIRE(other.ok());
  CHECK(d->get_split(other->job_id, 0, 0, t1, 0).status().code() == StatusCode::kInvalidArgument);

  // A finished task's leases are gone, and it gets no new split.
  REQUIRE(d->finish_task(t1).ok());
  CHECK(d->state().leases(j->job_id, 0, t1).value()->empty());
  CHECK(d->get_split(j->job_id, 0, 0, t1, 0).status().code() == StatusCode::kFailedPrecondition);
}

bool has_task(const std::vector<TaskDef>& defs, int64_t task_id) {
  return std::any_of(defs.begin(), defs.end(), [task_id](const TaskDef& d) { return d.task_id == task_id; });
}

TEST_CASE("a lost worker's tasks move to the live worker with the fewest, which replays their splits") {
  TempDir dir;
  FakeClock clock;
  auto d = open(clock, dir.path());
  std::string ds = register_range(*d, 100);
  add_worker(*d, "a:1");
  add_worker(*d, "b:1");
  add_worker(*d, "c:1");
  auto j = d->get_or_create_job(job(ds, "", ProcessingMode::kDynamic));
  REQUIRE(j.ok());
  const int64_t ta = only_task(*d, j->job_id, 0), tb = only_task(*d, j->job_id, 1), tc = only_task(*d, j->job_id, 2);
  // b runs a second job's task too: c has fewer.
  auto other = d->get_or_create_job(job(ds));
  REQUIRE(other.ok());
  REQUIRE(d->finish_task(only_task(*d, other->job_id, 2)).ok());  // c's task of it
  const int64_t first = split_begin(d->get_split(j->job_id, 0, 0, ta, 0));
  const int64_t second = split_begin(d->get_split(j->job_id, 0, 0, ta, 1));

  // b and c keep heartbeating; a goes silent.
  for (int i = 0; i < 3; ++i) {
    clock.advance(milliseconds(500));
    REQUIRE(d->worker_heartbeat("b:1", {tb}).ok());
    REQUIRE(d->worker_heartbeat("c:1", {tc}).ok());
    REQUIRE(d->client_heartbeat(j->job_client_id).ok());
    d->collect();
  }
  CHECK((*d->state().task_from_id(ta))->worker_address == "c:1");
  CHECK(d->tasks_reassigned() == 2);  // a's tasks of both jobs
  CHECK(d->tasks_waiting_for_worker() == 0);
  auto c = d->worker_heartbeat("c:1", {tc});
  REQUIRE(c.ok());
  CHECK(has_task(c->new_tasks, ta));
  // The same splits for the same numbers, then new ones.
  CHECK(split_begin(d->get_split(j->job_id, 0, 0, ta, 0)) == first);
  CHECK(split_begin(d->get_split(j->job_id, 0, 0, ta, 1)) == second);
  CHECK(split_begin(d->get_split(j->job_id, 0, 0, ta, 2)) != first);
  auto hb = d->client_heartbeat(j->job_client_id);
  REQUIRE(hb.ok());
  for (const TaskInfo& t : hb->tasks) {
    CHECK_FALSE(t.waiting_for_worker);
    if (t.task_id == ta) CHECK(t.worker_address == "c:1");
  }

  // a comes back: the task it still runs is dropped, and it joins the
  // DYNAMIC job afresh (not the OFF one: its copy moved on).
  auto back = d->worker_heartbeat("a:1", {ta});
  REQUIRE(back.ok());
  CHECK(back->tasks_to_delete == std::vector<int64_t>{ta});
  REQUIRE(back->new_tasks.size() == 1);
  CHECK(back->new_tasks[0].job_id == j->job_id);
  CHECK(back->new_tasks[0].task_id != ta);

  // The move is journaled: a restarted dispatcher has the task on c.
  d.reset();
  d = open(clock, dir.path());
  CHECK((*d->state().task_from_id(ta))->worker_address == "c:1");
  CHECK(split_begin(d->get_split(j->job_id, 0, 0, ta, 1)) == second);
}

TEST_CASE("with no live worker a lost worker's tasks wait, and the next worker to heartbeat takes them") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  add_worker(*d, "a:1");
  auto j = d->get_or_create_job(job(ds, "", ProcessingMode::kData));
  REQUIRE(j.ok());
  const int64_t ta = only_task(*d, j->job_id);
  clock.advance(milliseconds(800));
  REQUIRE(d->client_heartbeat(j->job_client_id).ok());
  clock.advance(milliseconds(700));  // a: 1500 ms without a heartbeat
  d->collect();
  CHECK(d->tasks_waiting_for_worker() == 1);
  CHECK(d->tasks_reassigned() == 0);
  auto hb = d->client_heartbeat(j->job_client_id);
  REQUIRE(hb.ok());
  REQUIRE(hb->tasks.size() == 1);
  CHECK(hb->tasks[0].waiting_for_worker);
  d->collect();  // still none: still waiting, nothing else happens
  CHECK(d->tasks_waiting_for_worker() == 1);

  // A new worker takes the statically sharded task with its shard (the
  // job's only task: shard 0 of 1).
  auto z = d->worker_heartbeat("z:1", {});
  REQUIRE(z.ok());
  REQUIRE(z->new_tasks.size() == 1);
  CHECK(z->new_tasks[0].task_id == ta);
  CHECK(z->new_tasks[0].num_workers == 1);
  CHECK(z->new_tasks[0].worker_index == 0);
  CHECK(d->tasks_waiting_for_worker() == 0);
  CHECK(d->tasks_reassigned() == 1);
  hb = d->client_heartbeat(j->job_client_id);
  REQUIRE(hb.ok());
  CHECK_FALSE(hb->tasks[0].waiting_for_worker);
  CHECK(hb->tasks[0].worker_address == "z:1");
  // Finished on z, the job is finished.
  REQUIRE(d->finish_task(ta).ok());
  CHECK(d->client_heartbeat(j->job_client_id)->job_finished);
}

TEST_CASE("a consumer that knows the current task list is told it is unchanged, and any change is listed again") {
  FakeClock clock;
  auto d = open(clock);
  std::string ds = register_range(*d, 10);
  add_worker(*d, "a:1");
  auto j = d->get_or_create_job(job(ds, "", ProcessingMode::kData));
  REQUIRE(j.ok());
  auto first = d->client_heartbeat(j->job_client_id);
  REQUIRE(first.ok());
  REQUIRE(first->tasks.size() == 1);
  CHECK_FALSE(first->unchanged);
  CHECK(first->tasks_fingerprint != 0);
  // Knowing it: nothing listed, the same fingerprint.
  auto again = d->client_heartbeat(j->job_client_id, first->tasks_fingerprint);
  REQUIRE(again.ok());
  CHECK(again->unchanged);
  CHECK(again->tasks.empty());
  CHECK(again->tasks_fingerprint == first->tasks_fingerprint);
  // Another fingerprint (a stale one): the whole list.
  auto stale = d->client_heartbeat(j->job_client_id, first->tasks_fingerprint + 1);
  REQUIRE(stale.ok());
  CHECK_FALSE(stale->unchanged);
  CHECK(stale->tasks.size() == 1);
  // The task's worker is lost: the task waits, which changes the list.
  clock.advance(milliseconds(800));
  REQUIRE(d->client_heartbeat(j->job_client_id, first->tasks_fingerprint)->unchanged);
  clock.advance(milliseconds(700));  // a: 1500 ms without a heartbeat
  d->collect();
  REQUIRE(d->tasks_waiting_for_worker() == 1);
  auto waiting = d->client_heartbeat(j->job_client_id, first->tasks_fingerprint);
  REQUIRE(waiting.ok());
  CHECK_FALSE(waiting->unchanged);
  REQUIRE(waiting->tasks.size() == 1);
  CHECK(waiting->tasks[0].waiting_for_worker);
  // Another worker takes it over: a new address, listed again.
  REQUIRE(d->worker_heartbeat("z:1", {}).ok());
  auto moved = d->client_heartbeat(j->job_client_id, waiting->tasks_fingerprint);
  REQUIRE(moved.ok());
  CHECK_FALSE(moved->unchanged);
  REQUIRE(moved->tasks.size() == 1);
  CHECK(moved->tasks[0].worker_address == "z:1");
  CHECK(moved->tasks_fingerprint != first->tasks_fingerprint);
  // The job's end is said in unchanged replies too.
  REQUIRE(d->finish_task(moved->tasks[0].task_id).ok());
  auto done = d->client_heartbeat(j->job_client_id, moved->tasks_fingerprint);
  REQUIRE(done.ok());
  CHECK(done->job_finished);
}

TEST_CASE("the dispatcher spreads its heartbeat budget over workers and consumers, within a quarter of their timeouts") {
  FakeClock clock;
  DispatcherConfig config = test_config();
  config.max_heartbeats_per_s = 20;
  config.worker_timeout = milliseconds(4000);
  config.client_timeout = milliseconds(8000);
  auto opened = Dispatcher::open(config, nullptr, clock);
  REQUIRE(opened.ok());
  auto& d = **opened;
  CHECK(d.heartbeat_interval() == milliseconds(0));  // nobody yet
  std::string ds = register_range(d, 10);
  add_worker(d, "a:1");
  add_worker(d, "b:1");
  auto j = d.get_or_create_job(job(ds, "", ProcessingMode::kOff));
  REQUIRE(j.ok());
  // 2 workers + 1 consumer at 20/s: each every 150 ms; said in both replies.
  CHECK(d.heartbeat_interval() == milliseconds(150));
  CHECK(d.worker_heartbeat("a:1", {})->interval == milliseconds(150));
  CHECK(d.client_heartbeat(j->job_client_id)->interval == milliseconds(150));
  for (int i = 0; i < 40; ++i) REQUIRE(d.get_or_create_job(job(ds, "", ProcessingMode::kOff)).ok());
  // 43 senders: 2150 ms, but a worker that waits that long (of 4000) could be
  // taken for lost: a quarter of the shorter timeout.
  CHECK(d.heartbeat_interval() == milliseconds(1000));
  // No limit: no request.
  config.max_heartbeats_per_s = 0;
  auto unlimited = Dispatcher::open(config, nullptr, clock);
  REQUIRE(unlimited.ok());
  add_worker(**unlimited, "a:1");
  CHECK((*unlimited)->worker_heartbeat("a:1", {})->interval == milliseconds(0));
}

TEST_CASE("replaying the journal rebuilds the same state, definitions, split progress and leases") {
  TempDir dir;
  FakeClock clock;
  std::string before;
  std::string ds;
  int64_t dynamic_job = 0;
  int64_t task = 0;
  std::vector<int64_t> leased;
  {
    auto d = open(clock, dir.path());
    ds = register_range(*d, 5);
    CHECK(fs::exists(dir.path() + "/datasets/" + ds));
    add_worker(*d, "w1:1");
    auto named = d->get_or_create_job(job(ds, "train"));
    auto dynamic = d->get_or_create_job(job(ds, "", ProcessingMode::kDynamic));
    REQUIRE(named.ok());
    REQUIRE(dynamic.ok());
    dynamic_job = dynamic->job_id;
    task = only_task(*d, dynamic_job);
    leased.push_back(split_begin(d->get_split(dynamic_job, 0, 0, task, 0)));
    leased.push_back(split_begin(d->get_split(dynamic_job, 0, 0, task, 1)));
    add_worker(*d, "w2:1");
    REQUIRE(d->release_job_client(named->job_client_id).ok());
    REQUIRE(d->finish_task(d->state().tasks_for_job(named->job_id).value()[0]->task_id).ok());
    before = d->state().debug_string();
  }
  auto d = open(clock, dir.path());
  CHECK(d->state().debug_string() == before);
  CHECK(d->dataset_definition(ds).value() == data::Dataset::range(5).serialize());
  // The task asks for its splits again (its worker restarted too): the same
  // two, in the same order, even asked out of order.
  CHECK(split_begin(d->get_split(dynamic_job, 0, 0, task, 1)) == leased[1]);
  CHECK(split_begin(d->get_split(dynamic_job, 0, 0, task, 0)) == leased[0]);
  CHECK(split_begin(d->get_split(dynamic_job, 0, 0, task, 1)) == leased[1]);
  // Two of five splits were leased before the restart: three new ones remain.
  std::set<int64_t> rest;
  for (int64_t k = 2;; ++k) {
    auto s = d->get_split(dynamic_job, 0, 0, task, k);
    REQUIRE(s.ok());
    if (s->end_of_splits) break;
    rest.insert(split_begin(s));
  }
  CHECK(rest.size() == 3);
  for (int64_t v : leased) CHECK(rest.count(v) == 0);
  CHECK(register_range(*d, 5) == ds);
}

TEST_CASE("a missing dataset definition stops the replay with DataLoss") {
  TempDir dir;
  FakeClock clock;
  std::string ds;
  {
    auto d = open(clock, dir.path());
    ds = register_range(*d, 5);
  }
  fs::remove(dir.path() + "/datasets/" + ds);
  auto d = Dispatcher::open(test_config(dir.path()), nullptr, clock);
  CHECK(d.status().code() == StatusCode::kDataLoss);
}

// ---- Group commit (the journal through io::MemoryFileSystem) ----------------------

std::unique_ptr<Dispatcher> open_on(io::MemoryFileSystem& files, FakeClock& clock) {
  auto d = Dispatcher::open(test_config("/work"), nullptr, clock, files);
  REQUIRE(d.ok());
  return std::move(*d);
}

// A dispatcher `d` journaling into the in-memory `files`.
struct OnMemory {
  // Waits until every change so far is durable.
  void durable() { REQUIRE(d->wait_durable(d->journal_ticket()).ok()); }

  io::MemoryFileSystem files;
  FakeClock clock;
  std::unique_ptr<Dispatcher> d = open_on(files, clock);
};

TEST_CASE_METHOD(OnMemory,
                 "updates made while an fsync is in flight share the next fsync, and each is durable when acknowledged") {
  const std::string dataset = register_range(*d, 1000);
  durable();
  const int64_t syncs_before = files.file_syncs();

  // As DispatcherService runs it: calls one after another on the dispatcher
  // thread (this one), each acknowledged from another thread once
  // wait_durable(its ticket) returns. The first fsync is held in flight.
  SyncGate gate;
  files.on_sync([&gate]() { gate.pass(); });
  constexpr int kUpdates = 10;
  std::vector<JobClient> clients(kUpdates);
  std::vector<Status> acks(kUpdates);
  std::vector<std::thread> acknowledgers;
  for (int i = 0; i < kUpdates; ++i) {
    auto client = d->get_or_create_job(job(dataset));  // a new anonymous job and client: journaled
    REQUIRE(client.ok());
    clients[static_cast<size_t>(i)] = *client;
    const uint64_t ticket = d->journal_ticket();
    acknowledgers.emplace_back([&, i, ticket]() { acks[static_cast<size_t>(i)] = d->wait_durable(ticket); });
    if (i == 0) gate.wait_for_arrival();  // the first update's fsync is in flight from here on
  }
  gate.open();
  for (auto& t : acknowledgers) t.join();
  for (const Status& ack : acks) CHECK(ack.ok());
  CHECK(files.file_syncs() - syncs_before < kUpdates);
  CHECK(files.file_syncs() - syncs_before <= 2);

  // A crash after the acknowledgements loses none of them.
  files.crash();
  d.reset();
  auto restarted = open_on(files, clock);
  CHECK(restarted->list_jobs().size() == static_cast<size_t>(kUpdates));
  for (const JobClient& c : clients) CHECK(restarted->client_heartbeat(c.job_client_id).ok());
}

TEST_CASE_METHOD(OnMemory, "a change not yet acknowledged may be lost in a crash, an acknowledged one is not") {
  const std::string dataset = register_range(*d, 10);
  durable();
  auto client = d->get_or_create_job(job(dataset, "acknowledged"));
  REQUIRE(client.ok());
  durable();
  REQUIRE(d->get_or_create_job(job(dataset, "never acknowledged")).ok());
  CHECK_FALSE(d->is_durable(d->journal_ticket()));

  // A power cut: the old process (`d`, kept to the end of the test only as
  // memory) is gone with its lock.
  files.crash();
  auto restarted = open_on(files, clock);
  auto jobs = restarted->list_jobs();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].job_name == "acknowledged");
}

TEST_CASE_METHOD(OnMemory, "after a failed fsync the dispatcher refuses changes and every wait fails") {
  const std::string dataset = register_range(*d, 10);
  durable();

  files.fail_next_sync(Status::DataLoss("Input/output error"));
  REQUIRE(d->get_or_create_job(job(dataset)).ok());  // applied, queued
  Status failed = d->wait_durable(d->journal_ticket());
  CHECK(failed.code() == StatusCode::kDataLoss);

  auto refused = d->get_or_create_job(job(dataset));
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  CHECK(refused.status().message().find("Input/output error") != std::string::npos);
  CHECK(d->worker_heartbeat("w:1", {}).status().code() == StatusCode::kFailedPrecondition);
  CHECK_FALSE(d->wait_durable(d->journal_ticket()).ok());
}

}  // namespace
}  // namespace capstan::data_dispatcher
