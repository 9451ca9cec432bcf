// The tf.data service with real processes: processing modes, named jobs,
// coordinated reads, the cross-trainer cache, dispatcher restarts in
// fault-tolerant mode, workers joining mid-job, and bad input.
#include <signal.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "capstan/data/dataset.h"
#include "capstan/data/service.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "capstan_schemas/data_worker.capnp.h"
#include "data/io/tfrecord.h"
#include "data/test_util.h"
#include "rpc/connection.h"
#include "rpc/errors.h"
#include "async/loop_thread.h"
#include "rpc/message_stream.h"
#include "tests/harness/process.h"
#include "tests/integration/raw_rpc.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;
using data::Dataset;
namespace service = data::service;
using data::testing::drain;
using data::testing::drain_ints;
using data::testing::int64_scalars;

struct DataService {
  explicit DataService(int workers, std::vector<std::string> dispatcher_flags = {},
                       std::vector<std::string> worker_flags_in = {})
      : worker_flags(std::move(worker_flags_in)) {
    dispatcher = &cluster.start("data-dispatcher", dispatcher_flags);
    for (int i = 0; i < workers; ++i) add_worker();
  }
  // `extra` flags for this worker alone (e.g. a fixed --port).
  Daemon& add_worker(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = {"--dispatcher", dispatcher->address(), "--task-index",
                                      std::to_string(workers.size())};
    flags.insert(flags.end(), worker_flags.begin(), worker_flags.end());
    flags.insert(flags.end(), extra.begin(), extra.end());
    worker_args.push_back(flags);
    workers.push_back(&cluster.start("data-worker", flags));
    // Registered with the dispatcher: its heartbeat went through.
    Daemon* w = workers.back();
    REQUIRE(wait_until([this, w]() {
      auto listed = cluster.run("capstanctl", {"data", "workers", dispatcher->address()});
      return listed.output.find(w->address()) != std::string::npos;
    }, 15s));
    return *w;
  }
  // Kills worker k and starts it again with the same flags (its port must be
  // fixed for the dispatcher to give it back its task).
  void restart_worker(size_t k) {
    workers[k]->kill_now();
    workers[k] = &cluster.restart_on_port("data-worker", worker_args[k]);
  }
  std::string address() const { return dispatcher->address(); }

  const std::vector<std::string> worker_flags;
  std::vector<std::vector<std::string>> worker_args;  // each worker's full flags
  TestCluster cluster;
  Daemon* dispatcher = nullptr;
  std::vector<Daemon*> workers;
};

// Expects `got` to hold each of 0 .. n-1 exactly `times` times, in any order.
void check_each(const std::vector<int64_t>& got, int64_t n, size_t times = 1) {
  std::multiset<int64_t> seen(got.begin(), got.end());
  CHECK(got.size() == static_cast<size_t>(n) * times);
  for (int64_t v = 0; v < n; ++v) CHECK(seen.count(v) == times);
}

std::string registered(const DataService& s, const Dataset& ds) {
  auto id = service::register_dataset(s.address(), ds);
  REQUIRE(id.ok());
  return *id;
}

}  // namespace

TEST_CASE("one worker, OFF: range(10) arrives as 0..9 in order", "[data-service]") {
  DataService s(1);
  service::ReadOptions options;
  auto got = drain_ints(service::from_dataset_id(s.address(), registered(s, Dataset::range(10)), options));
  CHECK(got == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("the same definition gets the same id, unknown ids are NotFound", "[data-service]") {
  DataService s(1);
  CHECK(registered(s, Dataset::range(7)) == registered(s, Dataset::range(7)));
  CHECK(registered(s, Dataset::range(7)) != registered(s, Dataset::range(8)));
  auto it = service::from_dataset_id(s.address(), "no-such-dataset").make_iterator();
  if (it.ok()) {
    auto next = (*it)->get_next();
    CHECK(next.status().code() == StatusCode::kNotFound);
  } else {
    CHECK(it.status().code() == StatusCode::kNotFound);
  }
}

TEST_CASE("three workers, OFF: every worker yields the whole dataset", "[data-service]") {
  DataService s(3);
  auto got = drain_ints(service::from_dataset_id(s.address(), registered(s, Dataset::range(10))));
  check_each(got, 10, 3);
}

TEST_CASE("DYNAMIC over two workers: every element exactly once", "[data-service]") {
  DataService s(2);
  service::ReadOptions options;
  options.processing_mode = service::ProcessingMode::kDynamic;
  auto got = drain_ints(service::from_dataset_id(s.address(), registered(s, Dataset::range(100)), options));
  check_each(got, 100);
}

TEST_CASE("DYNAMIC with repeat over three workers: every element of every repetition exactly once",
          "[data-service][splits]") {
  DataService s(3);
  service::ReadOptions options;
  options.processing_mode = service::ProcessingMode::kDynamic;
  // TF resets the split provider per repetition: 5 x 20 elements, not 20.
  auto got = drain_ints(service::from_dataset_id(s.address(), registered(s, Dataset::range(20).repeat(5)), options));
  check_each(got, 20, 5);
  auto small = drain_ints(service::from_dataset_id(s.address(), registered(s, Dataset::range(3).repeat(2)), options));
  std::sort(small.begin(), small.end());
  CHECK(small == std::vector<int64_t>{0, 0, 1, 1, 2, 2});
}

TEST_CASE("DYNAMIC with zip and concatenate: one split provider per source", "[data-service][splits]") {
  DataService s(2);
  service::ReadOptions options;
  options.processing_mode = service::ProcessingMode::kDynamic;
  auto concatenated = Dataset::range(100).concatenate(Dataset::range(100, 200));
  auto got = drain_ints(service::from_dataset_id(s.address(), registered(s, concatenated), options));
  check_each(got, 200);

  auto zipped = Dataset::zip({Dataset::range(10), Dataset::range(100, 110)});
  auto it = service::from_dataset_id(s.address(), registered(s, zipped), options).make_iterator();
  REQUIRE(it.ok());
  std::multiset<int64_t> left, right;
  while (auto next = (*it)->get_next().value()) {
    REQUIRE(next->components.size() == 2);
    left.insert(next->components[0].flat<int64_t>()[0]);
    right.insert(next->components[1].flat<int64_t>()[0]);
  }
  CHECK(left.size() == 10);
  CHECK(right.size() == 10);
  for (int64_t v = 0; v < 10; ++v) {
    CHECK(left.count(v) == 1);
    CHECK(right.count(100 + v) == 1);
  }
}

TEST_CASE("a saved dataset served with DYNAMIC sharding: each shard once, every element once",
          "[data-service][splits]") {
  DataService s(2);
  char dir_template[] = "/tmp/capstan-save-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  std::string path = std::string(dir_template) + "/saved";
  data::SaveOptions save;
  save.num_shards = 5;
  REQUIRE(Dataset::range(50).save(path, save).ok());
  auto loaded = Dataset::load(path);
  REQUIRE(loaded.ok());
  service::ReadOptions options;
  options.processing_mode = service::ProcessingMode::kDynamic;
  auto got = drain_ints(service::from_dataset_id(s.address(), registered(s, *loaded), options));
  check_each(got, 50);
  std::filesystem::remove_all(dir_template);
}

TEST_CASE("DYNAMIC with an infinite repeat keeps serving after workers are stopped", "[data-service][splits]") {
  DataService s(5, {"--worker-timeout-ms", "1000"});
  service::ReadOptions options;
  options.processing_mode = service::ProcessingMode::kDynamic;
  auto it = service::from_dataset_id(s.address(), registered(s, Dataset::range(1).repeat()), options).make_iterator();
  REQUIRE(it.ok());
  auto read = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto next = (*it)->get_next();
      REQUIRE(next.ok());
      REQUIRE(next->has_value());
      CHECK((*next)->components.at(0).flat<int64_t>()[0] == 0);
    }
  };
  read(50);
  for (int w = 1; w < 5; ++w) CHECK(s.workers[static_cast<size_t>(w)]->stop(SIGTERM, 10s).has_value());
  read(500);  // from the one worker left
}

TEST_CASE("two consumers of one named job split the elements between them", "[data-service]") {
  DataService s(1);
  std::string id = registered(s, Dataset::range(200));
  service::ReadOptions options;
  options.job_name = "shared";
  auto a = service::from_dataset_id(s.address(), id, options).make_iterator();
  auto b = service::from_dataset_id(s.address(), id, options).make_iterator();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::vector<int64_t> from_a, from_b;
  bool a_done = false, b_done = false;
  while (!a_done || !b_done) {
    if (!a_done) {
      auto n = (*a)->get_next();
      REQUIRE(n.ok());
      if (n->has_value()) from_a.push_back((*n)->components[0].flat<int64_t>()[0]); else a_done = true;
    }
    if (!b_done) {
      auto n = (*b)->get_next();
      REQUIRE(n.ok());
      if (n->has_value()) from_b.push_back((*n)->components[0].flat<int64_t>()[0]); else b_done = true;
    }
  }
  std::vector<int64_t> all = from_a;
  all.insert(all.end(), from_b.begin(), from_b.end());
  check_each(all, 200);
  CHECK(!from_a.empty());
  CHECK(!from_b.empty());
}

TEST_CASE("a named job asked for with other parameters is InvalidArgument", "[data-service]") {
  DataService s(1);
  std::string id = registered(s, Dataset::range(50));
  service::ReadOptions off;
  off.job_name = "j";
  auto first = service::from_dataset_id(s.address(), id, off).make_iterator();
  REQUIRE(first.ok());
  REQUIRE((*first)->get_next().ok());
  service::ReadOptions dynamic = off;
  dynamic.processing_mode = service::ProcessingMode::kDynamic;
  auto second = service::from_dataset_id(s.address(), id, dynamic).make_iterator();
  Status status = second.ok() ? (*second)->get_next().status() : second.status();
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("'j'"));
}

TEST_CASE("coordinated reads need an infinite dataset", "[data-service]") {
  DataService s(1);
  service::ReadOptions options;
  options.job_name = "coordinated";
  options.num_consumers = 2;
  options.consumer_index = 0;
  auto it = service::from_dataset_id(s.address(), registered(s, Dataset::range(10)), options).make_iterator();
  Status status = it.ok() ? (*it)->get_next().status() : it.status();
  CHECK(status.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(status.message(), Catch::Contains("cardinality 10"));
}

TEST_CASE("coordinated reads deliver rounds of consecutive elements to the consumers", "[data-service]") {
  DataService s(1);
  std::string id = registered(s, Dataset::range(0, 1000).repeat());
  std::vector<std::unique_ptr<data::Iterator>> consumers;
  for (int c = 0; c < 3; ++c) {
    service::ReadOptions options;
    options.job_name = "rounds";
    options.num_consumers = 3;
    options.consumer_index = c;
    auto it = service::from_dataset_id(s.address(), id, options).make_iterator();
    REQUIRE(it.ok());
    consumers.push_back(std::move(*it));
  }
  for (int round = 0; round < 5; ++round) {
    std::vector<int64_t> values;
    for (auto& it : consumers) {
      auto next = it->get_next();
      INFO(next.status().to_string());
      REQUIRE(next.ok());
      REQUIRE(next->has_value());
      values.push_back((*next)->components[0].flat<int64_t>()[0]);
    }
    // One round: consecutive elements, consumer c gets the c-th.
    CHECK(values[1] == values[0] + 1);
    CHECK(values[2] == values[0] + 2);
  }
}

TEST_CASE("the cross-trainer cache lets a second trainer read the same elements", "[data-service]") {
  DataService s(1);
  std::string id = registered(s, Dataset::range(0, int64_t{1} << 40));
  auto reader = [&](const std::string& trainer) {
    service::ReadOptions options;
    options.job_name = "cached";
    options.cross_trainer_cache = true;
    options.trainer_id = trainer;
    auto it = service::from_dataset_id(s.address(), id, options).make_iterator();
    REQUIRE(it.ok());
    return std::move(*it);
  };
  auto take = [](data::Iterator& it, int n) {
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(it.get_next().value()->components[0].flat<int64_t>()[0]);
    return out;
  };
  auto a = reader("trainer-a");
  auto first = take(*a, 20);
  auto b = reader("trainer-b");
  CHECK(take(*b, 20) == first);
}

TEST_CASE("a data worker added mid-job takes part", "[data-service]") {
  DataService s(1);
  auto it = service::from_dataset_id(s.address(), registered(s, Dataset::range(0, int64_t{1} << 40))).make_iterator();
  REQUIRE(it.ok());
  for (int i = 0; i < 10; ++i) REQUIRE((*it)->get_next().ok());
  Daemon& late = s.add_worker();
  // The late worker gets a task for the running job and serves elements.
  CHECK(wait_until([&]() {
    for (int i = 0; i < 50; ++i) REQUIRE((*it)->get_next().ok());
    return late.http_get("/metrics").second.find("capstan_rpc_calls_total{method=\"DataWorker.getElements\"}") != std::string::npos;
  }, 20s));
}

// OFF mode: nothing lost, nothing duplicated. DYNAMIC mode promises at most
// and DYNAMIC, whose splits are leased to tasks (see the stress tests below).
TEST_CASE("restarting the dispatcher mid-job in fault-tolerant mode duplicates nothing and loses nothing",
          "[data-service][fault]") {
  for (auto mode : {service::ProcessingMode::kDynamic, service::ProcessingMode::kOff}) {
    INFO("mode " << static_cast<int>(mode));
    TestCluster keep;
    std::string work_dir = keep.dir() + "/dispatcher";
    uint16_t port = free_port();
    DataService s(mode == service::ProcessingMode::kDynamic ? 2 : 1,
                  {"--port", std::to_string(port), "--work-dir", work_dir});
    service::ReadOptions options;
    options.processing_mode = mode;
    auto it = service::from_dataset_id(s.address(), registered(s, Dataset::range(100)), options).make_iterator();
    REQUIRE(it.ok());
    std::vector<int64_t> got = int64_scalars(drain(**it, 30));
    REQUIRE(got.size() == 30);
    s.dispatcher->kill_now();
    s.dispatcher = &s.cluster.restart_on_port("data-dispatcher", {"--port", std::to_string(port), "--work-dir", work_dir});
    CHECK_THAT(s.dispatcher->log(), Catch::Contains("replayed"));
    std::vector<int64_t> rest = int64_scalars(drain(**it));
    got.insert(got.end(), rest.begin(), rest.end());
    check_each(got, 100);
  }
}

namespace {

// Reads `ds` with DYNAMIC sharding from the service, calling `disrupt(k)`
// after the k-th of `moments` (counts of elements read). Returns every value
// of the elements' first component (batches flattened), sorted.
std::vector<int64_t> read_disrupted(DataService& s, const Dataset& ds, const std::vector<int64_t>& moments,
                                    const std::function<void(size_t)>& disrupt,
                                    service::ProcessingMode mode = service::ProcessingMode::kDynamic) {
  service::ReadOptions options;
  options.processing_mode = mode;
  auto it = service::from_dataset_id(s.address(), registered(s, ds), options).make_iterator();
  REQUIRE(it.ok());
  std::vector<int64_t> got;
  int64_t read = 0;
  size_t next_moment = 0;
  while (true) {
    while (next_moment < moments.size() && read == moments[next_moment]) disrupt(next_moment++);
    auto next = (*it)->get_next();
    REQUIRE(next.ok());
    if (!next->has_value()) break;
    ++read;
    auto values = (*next)->components[0].flat<int64_t>();
    got.insert(got.end(), values.begin(), values.end());
  }
  std::sort(got.begin(), got.end());
  return got;
}

std::vector<int64_t> read_disrupted(DataService& s, int64_t n, const std::vector<int64_t>& moments,
                                    const std::function<void(size_t)>& disrupt) {
  return read_disrupted(s, Dataset::range(n), moments, disrupt);
}

// `count` element counts in [0, n), sorted, from `rng`.
std::vector<int64_t> moments_from(std::mt19937& rng, int64_t n, int count) {
  std::uniform_int_distribution<int64_t> at(0, n - 1);
  std::vector<int64_t> moments;
  for (int i = 0; i < count; ++i) moments.push_back(at(rng));
  std::sort(moments.begin(), moments.end());
  return moments;
}

std::vector<int64_t> range_of(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The seeded runs of each stress test: CAPSTAN_STRESS_SEEDS (ctest sets the
// CMake option of that name, default 6), else 20.
uint32_t stress_seeds() {
  const char* env = std::getenv("CAPSTAN_STRESS_SEEDS");
  const long seeds = env == nullptr ? 20 : std::strtol(env, nullptr, 10);
  return seeds > 0 ? static_cast<uint32_t>(seeds) : 20;
}

}  // namespace

// Issue 18: splits are leased to tasks and getSplit requests are numbered,
// so a split journaled as leased whose reply died with the dispatcher goes
// to the same task again. Before leases, such a split was lost.
TEST_CASE("DYNAMIC: every element exactly once while the dispatcher is killed and restarted 5 times",
          "[data-service][fault][stress]") {
  // range() splits are one element each, and each is journaled (an fsync):
  // ~1 ms a split here, so the run's length is its element count.
  constexpr int64_t kElements = 4000;
  for (uint32_t seed = 1; seed <= stress_seeds(); ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::vector<int64_t> moments = moments_from(rng, kElements, 5);
    std::uniform_int_distribution<int> down_ms(0, 50);
    TestCluster keep;
    std::string work_dir = keep.dir() + "/dispatcher";
    std::vector<std::string> flags = {"--port", std::to_string(free_port()), "--work-dir", work_dir};
    DataService s(2, flags);
    auto got = read_disrupted(s, kElements, moments, [&](size_t) {
      s.dispatcher->kill_now();
      std::this_thread::sleep_for(std::chrono::milliseconds(down_ms(rng)));
      s.dispatcher = &s.cluster.restart_on_port("data-dispatcher", flags);
    });
    CHECK(got == range_of(kElements));
  }
}

// A data worker that restarts rebuilds its task: its DYNAMIC splits come
// back in the same order, and it skips the elements the reader has (the
// reader's requests say how many); a reply lost with the worker is produced
// again. Before, the rebuilt task took fresh splits and the old ones' unsent
// elements were lost.
//
// A third worker dies for good at the first moment: the dispatcher declares
// it lost after --worker-timeout-ms and moves its task to a live worker,
// which replays it the same way (issue 37: the read used to wait forever).
TEST_CASE("DYNAMIC: every element exactly once while data workers restart and one dies for good",
          "[data-service][fault][stress]") {
  constexpr int64_t kElements = 4000;
  for (uint32_t seed = 1; seed <= stress_seeds(); ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::vector<int64_t> moments = moments_from(rng, kElements, 3);
    DataService s(0, {"--worker-timeout-ms", "1000"});
    for (int k = 0; k < 3; ++k) s.add_worker({"--port", std::to_string(free_port())});
    std::uniform_int_distribution<size_t> which(0, 1);
    auto got = read_disrupted(s, kElements, moments, [&](size_t moment) {
      if (moment == 0) s.workers[2]->kill_now();  // for good
      s.restart_worker(which(rng));
    });
    CHECK(got == range_of(kElements));
  }
}

// The replay is exact for any deterministic pipeline, not only one element
// per split: a seeded shuffle and batches that span splits, rebuilt after a
// worker restart, give the same batches in the same order, and the reader's
// count skips the ones it has.
TEST_CASE("DYNAMIC with a seeded shuffle and batches: every element exactly once across data-worker restarts",
          "[data-service][fault]") {
  constexpr int64_t kElements = 3000;
  const Dataset ds = Dataset::range(kElements).shuffle(50, uint64_t{7}).batch(7);
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    std::vector<int64_t> moments = moments_from(rng, kElements / 7, 2);
    DataService s(0);
    for (int k = 0; k < 2; ++k) s.add_worker({"--port", std::to_string(free_port())});
    std::uniform_int_distribution<size_t> which(0, 1);
    auto got = read_disrupted(s, ds, moments, [&](size_t) { s.restart_worker(which(rng)); });
    CHECK(got == range_of(kElements));
  }
}

// A worker sends a task's end to its consumer, then tells the dispatcher
// (finishTask). A worker that dies in between is given the task again when
// it restarts, and the rebuilt task ends only when a consumer asks it. The
// consumer had the end and never asked: the task never finished, nor the
// job, and the read waited forever. Now a reader whose tasks have all ended
// while the job has not asks them again.
TEST_CASE("DYNAMIC: a data worker that dies between a task's end and finishTask does not leave the read waiting",
          "[data-service][fault]") {
  bool staged = false;
  for (int attempt = 1; attempt <= 5 && !staged; ++attempt) {
    INFO("attempt " << attempt);
    TestCluster keep;
    const std::vector<std::string> flags = {"--port", std::to_string(free_port()), "--work-dir",
                                            keep.dir() + "/dispatcher"};
    DataService s(0, flags);
    s.add_worker({"--port", std::to_string(free_port())});
    service::ReadOptions options;
    options.processing_mode = service::ProcessingMode::kDynamic;
    auto it = service::from_dataset_id(s.address(), registered(s, Dataset::range(5)), options).make_iterator();
    REQUIRE(it.ok());
    std::shared_ptr<data::Iterator> reader = std::move(*it);
    std::vector<int64_t> got;
    // All five elements; the end is not asked for yet (a request that could
    // carry it goes out only once the consumer has used what it received).
    for (int i = 0; i < 5; ++i) {
      auto next = reader->get_next();
      REQUIRE(next.ok());
      REQUIRE(next->has_value());
      got.push_back((*next)->components[0].flat<int64_t>()[0]);
    }
    // The worker's pipeline asks for a sixth split at once and hears there
    // is none; then the dispatcher goes away.
    std::this_thread::sleep_for(300ms);
    s.dispatcher->kill_now();
    struct Outcome {
      std::atomic<bool> done{false};
      Status status;
      bool end = false;
    };
    auto outcome = std::make_shared<Outcome>();
    std::thread consumer([reader, outcome]() {
      auto next = reader->get_next();
      outcome->status = next.status();
      outcome->end = next.ok() && !next->has_value();
      outcome->done = true;
    });
    // The worker's runner returned the end (the worker logs it then), and
    // its finishTask cannot reach the dispatcher. The worker dies; the
    // dispatcher comes back from its journal with the task unfinished, and
    // gives it to the restarted worker.
    staged = wait_until([&]() { return s.workers[0]->log().find("end of sequence") != std::string::npos; }, 10s);
    if (staged) s.workers[0]->kill_now();
    s.dispatcher = &s.cluster.restart_on_port("data-dispatcher", flags);
    if (staged) s.workers[0] = &s.cluster.restart_on_port("data-worker", s.worker_args[0]);
    bool ended = wait_until([&]() { return outcome->done.load(); }, 60s);
    if (ended) {
      consumer.join();
    } else {
      consumer.detach();  // waiting without end: the test fails, the thread is left behind
    }
    REQUIRE(ended);
    REQUIRE(outcome->status.ok());
    CHECK(outcome->end);
    CHECK(got == range_of(5));
  }
  // The end of the splits came after the dispatcher died every time (a very
  // slow machine): the case above was never staged, and this says so.
  CHECK(staged);
}

// A checkpointed position of a DYNAMIC read: the reader saves, per task, how
// many elements it handed out; after the dispatcher (with its work_dir) and
// every data worker restart, a reader restored from it joins the same named
// job, the rebuilt tasks replay their splits and skip exactly those elements.
TEST_CASE("DYNAMIC: save, restart the dispatcher and every data worker, restore: every element once across the run",
          "[data-service][fault][checkpoint]") {
  constexpr int64_t kElements = 400;
  TestCluster keep;
  const std::vector<std::string> flags = {"--port", std::to_string(free_port()), "--work-dir",
                                          keep.dir() + "/dispatcher"};
  DataService s(0, flags);
  for (int k = 0; k < 2; ++k) s.add_worker({"--port", std::to_string(free_port())});
  const Dataset ds = Dataset::range(kElements).shuffle(30, uint64_t{5}).batch(4);
  service::ReadOptions options;
  options.processing_mode = service::ProcessingMode::kDynamic;
  options.job_name = "train";
  const Dataset read = service::from_dataset_id(s.address(), registered(s, ds), options);
  auto take = [](data::Iterator& it, int batches, std::vector<int64_t>* ids) {
    for (int i = 0; i < batches; ++i) {
      auto next = it.get_next();
      REQUIRE(next.ok());
      if (!next->has_value()) return;
      auto values = (*next)->components[0].flat<int64_t>();
      ids->insert(ids->end(), values.begin(), values.end());
    }
  };
  std::vector<int64_t> before, after;
  std::string state;
  {
    auto it = read.make_iterator();
    REQUIRE(it.ok());
    take(**it, 30, &before);
    auto saved = (*it)->save();
    REQUIRE(saved.ok());
    state = *saved;
    std::vector<int64_t> lost;  // read after the save: read again after the restore
    take(**it, 20, &lost);
    REQUIRE(lost.size() == 80);
  }
  // Everything restarts.
  s.dispatcher->kill_now();
  for (auto* w : s.workers) w->kill_now();
  s.dispatcher = &s.cluster.restart_on_port("data-dispatcher", flags);
  for (size_t k = 0; k < s.workers.size(); ++k) s.workers[k] = &s.cluster.restart_on_port("data-worker", s.worker_args[k]);
  auto it = read.make_iterator();
  REQUIRE(it.ok());
  REQUIRE((*it)->restore(state).ok());
  take(**it, 1000, &after);
  std::vector<int64_t> all = before;
  all.insert(all.end(), after.begin(), after.end());
  std::sort(all.begin(), all.end());
  CHECK(all == range_of(kElements));

  // An anonymous job has nothing to join again: its position is not saved.
  service::ReadOptions anonymous = options;
  anonymous.job_name.clear();
  auto other = service::from_dataset_id(s.address(), registered(s, ds), anonymous).make_iterator();
  REQUIRE(other.ok());
  auto refused = (*other)->save();
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(refused.status().message(), Catch::Contains("named job"));
}

TEST_CASE("bad requests get error replies and the daemons keep serving", "[data-service][bad-input]") {
  DataService s(1);
  async::LoopThread loop("test-client");
  auto status_of = [&loop](const std::string& address, auto call) { return raw_call(loop, address, call); };
  // A malformed pipeline definition.
  Status malformed = status_of(s.address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::DataDispatcher>().registerDatasetRequest();
    const char junk[] = "definitely not a capnp message";
    request.setDefinition(kj::arrayPtr(reinterpret_cast<const kj::byte*>(junk), sizeof(junk)));
    return request.send().ignoreResult();
  });
  CHECK(malformed.code() == StatusCode::kInvalidArgument);
  // An unknown task id on a worker.
  Status unknown_task = status_of(s.workers[0]->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::DataWorker>().getElementsRequest();
    request.initRequest().setTaskId(424242);
    request.getRequest().setMaxElements(1);
    return request.send().ignoreResult();
  });
  CHECK(unknown_task.code() == StatusCode::kNotFound);
  CHECK_THAT(unknown_task.message(), Catch::Contains("424242"));
  // A negative consumer index.
  service::ReadOptions negative;
  negative.job_name = "n";
  negative.num_consumers = 2;
  negative.consumer_index = -1;
  auto it = service::from_dataset_id(s.address(), registered(s, Dataset::range(0, 10).repeat()), negative).make_iterator();
  Status bad_index = it.ok() ? (*it)->get_next().status() : it.status();
  CHECK(bad_index.code() == StatusCode::kInvalidArgument);
  // A pipeline that fails mid-way: the consumer sees the error, others go on.
  auto failing = service::from_dataset_id(
      s.address(), registered(s, Dataset::range(5).concatenate(Dataset::from_tensors(Element{{Tensor::scalar<float>(1)}, {}}))));
  auto fit = failing.make_iterator();
  REQUIRE(fit.ok());
  bool saw_error = false;
  for (int i = 0; i < 10; ++i) {
    auto next = (*fit)->get_next();
    if (!next.ok()) {
      saw_error = true;
      break;
    }
    if (!next->has_value()) break;
  }
  CHECK(saw_error);
  CHECK(drain_ints(service::from_dataset_id(s.address(), registered(s, Dataset::range(3)))) ==
        std::vector<int64_t>{0, 1, 2});
  auto listing = s.cluster.run("capstanctl", {"data", "jobs", s.address()});
  CHECK(listing.exit_code == 0);
}

// RSS of a process in MiB (Linux /proc).
int64_t rss_mib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) / 1024;
  }
  return -1;
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CAPSTAN_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(CAPSTAN_TEST_ASAN)
constexpr bool kUnderAddressSanitizer = true;
#else
constexpr bool kUnderAddressSanitizer = false;
#endif

TEST_CASE("hostile dataset sizes fail their job, not the data worker", "[data-service][bad-input]") {
  DataService s(1, {}, {"--task-memory-mib", "64"});
  const int64_t huge = int64_t{1} << 40;
  auto endless = Dataset::range(0, int64_t{1} << 62);
  for (auto [ds, op] : std::vector<std::pair<Dataset, std::string>>{
           {endless.shuffle(huge), "shuffle"}, {endless.prefetch(huge), "prefetch"}, {endless.batch(huge), "batch"}}) {
    INFO(op);
    auto it = service::from_dataset_id(s.address(), registered(s, ds)).make_iterator();
    REQUIRE(it.ok());
    Status error;
    for (int i = 0; i < 2'000'000 && error.ok(); ++i) {
      auto next = (*it)->get_next();
      if (!next.ok()) error = next.status();
      else REQUIRE(next->has_value());
    }
    CHECK(error.code() == StatusCode::kResourceExhausted);
    CHECK_THAT(error.message(), Catch::Contains(op + ":") && Catch::Contains("memory budget of 64 MiB"));
  }
  // Sizes that would become threads or slots are refused outright.
  auto interleave = Dataset::range(10).interleave(data::Fn::tfrecord_dataset(), int64_t{1} << 31, huge);
  auto refused = service::from_dataset_id(s.address(), registered(s, interleave)).make_iterator();
  Status refusal = refused.ok() ? (*refused)->get_next().status() : refused.status();
  CHECK(refusal.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refusal.message(), Catch::Contains("cycle_length"));
  // The worker is alive, small, and serves the next job.
  CHECK(s.workers[0]->running());
  int64_t rss = rss_mib(s.workers[0]->pid());
  INFO("data worker RSS " << rss << " MiB");
  CHECK(rss > 0);
  // Under AddressSanitizer freed memory waits in its quarantine (256 MiB)
  // and every byte has shadow memory: a larger bound there.
  CHECK(rss < (kUnderAddressSanitizer ? 1024 : 512));
  auto got = drain_ints(service::from_dataset_id(s.address(), registered(s, Dataset::range(10))));
  CHECK(got == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("capstanctl data lists datasets, jobs and workers", "[data-service]") {
  DataService s(2);
  std::string id = registered(s, Dataset::range(10));
  CHECK(drain_ints(service::from_dataset_id(s.address(), id)).size() == 20);
  auto datasets = s.cluster.run("capstanctl", {"data", "datasets", s.address()});
  CHECK(datasets.exit_code == 0);
  CHECK_THAT(datasets.output, Catch::Contains(id));
  auto jobs = s.cluster.run("capstanctl", {"data", "jobs", s.address()});
  CHECK(jobs.exit_code == 0);
  CHECK_THAT(jobs.output, Catch::Contains("OFF"));
  auto workers = s.cluster.run("capstanctl", {"data", "workers", s.address()});
  CHECK(workers.exit_code == 0);
  CHECK_THAT(workers.output, Catch::Contains(s.workers[0]->address()));
  CHECK_THAT(workers.output, Catch::Contains(s.workers[1]->address()));
}

}  // namespace capstan::testing

namespace capstan::testing {

TEST_CASE("a job whose consumers left is garbage-collected after the timeout", "[data-service]") {
  DataService s(1, {"--job-gc-timeout-ms", "300", "--job-gc-check-interval-ms", "100"});
  std::string id = registered(s, Dataset::range(0, 1000).repeat());
  {
    service::ReadOptions options;
    options.job_name = "short-lived";
    auto it = service::from_dataset_id(s.address(), id, options).make_iterator();
    REQUIRE(it.ok());
    REQUIRE((*it)->get_next().ok());
  }  // the consumer leaves (releases its job client)
  CHECK(wait_until([&]() {
    auto jobs = s.cluster.run("capstanctl", {"data", "jobs", s.address()});
    return jobs.output.find("short-lived") != std::string::npos &&
           jobs.output.find(" yes") != std::string::npos;
  }, 15s));
  CHECK_THAT(s.dispatcher->log(), Catch::Contains("garbage-collected job"));
}

}  // namespace capstan::testing

namespace capstan::testing {

TEST_CASE("DATA sharding over two workers: every element once", "[data-service]") {
  DataService s(2);
  service::ReadOptions options;
  options.processing_mode = service::ProcessingMode::kData;
  auto got = drain_ints(service::from_dataset_id(s.address(), registered(s, Dataset::range(50)), options));
  check_each(got, 50);
}

TEST_CASE("FILE sharding with fewer files than workers is refused", "[data-service]") {
  DataService s(2);
  std::string file = s.cluster.dir() + "/only.tfrecord";
  {
    auto writer = data::io::TFRecordWriter::open(file, data::io::Compression::kNone);
    REQUIRE(writer.ok());
    REQUIRE((*writer)->write("record").ok());
    REQUIRE((*writer)->close().ok());
  }
  service::ReadOptions options;
  options.processing_mode = service::ProcessingMode::kFile;
  auto it = service::from_dataset_id(s.address(), registered(s, Dataset::tfrecord_dataset({file})), options)
                .make_iterator();
  Status status = it.ok() ? (*it)->get_next().status() : it.status();
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("fewer than the 2 workers"));
}

}  // namespace capstan::testing

namespace capstan::testing {

// The shared-memory path (data/shm_region.h) against the real worker: the
// same elements, in the same order, as over TCP; large tensors go through
// the region (the worker counts their bytes), small ones by TCP beside them.
TEST_CASE("OFF mode over shared memory and over TCP: identical elements", "[data-service][shm]") {
  DataService s(1);
  constexpr int64_t kRows = 24, kRowInts = 32768;  // 256 KiB rows: over the shared-memory threshold
  std::vector<int64_t> values(static_cast<size_t>(kRows * kRowInts));
  std::iota(values.begin(), values.end(), int64_t{0});
  auto big = Tensor::from_vector<int64_t>(values, {kRows, kRowInts});
  REQUIRE(big.ok());
  std::vector<int64_t> labels(static_cast<size_t>(kRows));
  std::iota(labels.begin(), labels.end(), int64_t{100});
  auto small = Tensor::from_vector<int64_t>(labels, {kRows});
  REQUIRE(small.ok());
  const Dataset ds = Dataset::from_tensor_slices(Element{{*big, *small}, {}}).repeat(3);
  const std::string id = registered(s, ds);

  service::ReadOptions tcp;
  tcp.shared_memory_bytes = 0;
  std::vector<Element> over_tcp = drain(service::from_dataset_id(s.address(), id, tcp));
  CHECK(metric(*s.workers[0], "capstan_data_worker_shm_bytes_total") == 0);

  service::ReadOptions shm;
  shm.shared_memory_bytes = 8 << 20;  // smaller than the data: the ring wraps, records are reused
  shm.max_outstanding_requests = 3;
  shm.max_elements_per_request = 4;  // many replies: the first three only get the offer
  std::vector<Element> over_shm = drain(service::from_dataset_id(s.address(), id, shm));

  REQUIRE(over_tcp.size() == static_cast<size_t>(3 * kRows));
  REQUIRE(over_shm.size() == over_tcp.size());
  for (size_t i = 0; i < over_tcp.size(); ++i) {
    INFO("element " << i);
    REQUIRE(over_shm[i].components.size() == 2);
    CHECK(over_shm[i].components[0].equals(over_tcp[i].components[0]));
    CHECK(over_shm[i].components[1].equals(over_tcp[i].components[1]));
    CHECK(over_shm[i].components[0].flat<int64_t>()[0] == static_cast<int64_t>(i % kRows) * kRowInts);
  }
  // The first replies only offer the region; the later ones' rows travel in
  // it until it is full (this reader keeps every element, so no record is
  // released), then by TCP.
  double shm_bytes = metric(*s.workers[0], "capstan_data_worker_shm_bytes_total");
  CHECK(shm_bytes >= static_cast<double>(4 << 20));
  CHECK(shm_bytes <= static_cast<double>(8 << 20));
}

TEST_CASE("replies of many mid-size tensors, and of large ones, arrive whole over TCP", "[data-service]") {
  DataService s(1);
  // 8 KiB rows (referenced by the reply, each a segment of its own) in three
  // components, 300 elements to a reply: 900 such tensors per reply.
  constexpr int64_t kRows = 600, kRowInts = 1024;
  std::vector<int64_t> values(static_cast<size_t>(kRows * kRowInts));
  std::iota(values.begin(), values.end(), int64_t{0});
  auto rows = Tensor::from_vector<int64_t>(values, {kRows, kRowInts});
  REQUIRE(rows.ok());
  const std::string mid = registered(s, Dataset::from_tensor_slices(Element{{*rows, *rows, *rows}, {}}));
  service::ReadOptions options;
  options.shared_memory_bytes = 0;
  options.max_elements_per_request = 300;
  std::vector<Element> got = drain(service::from_dataset_id(s.address(), mid, options));
  REQUIRE(got.size() == static_cast<size_t>(kRows));
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i].components.size() == 3);
    CHECK(got[i].components[2].flat<int64_t>()[kRowInts - 1] == static_cast<int64_t>(i + 1) * kRowInts - 1);
  }
  // 1 MiB elements (up to 16 to a reply) travel in the replies themselves,
  // not pulled one by one through ByteSources: the elements of a reply keep
  // the reply's received buffer, so there are fewer buffers than elements
  // (pulled, each has its own; how many a reply carries depends on how far
  // the worker's pipeline got).
  constexpr int64_t kBigInts = 1 << 17;
  std::vector<int64_t> big(static_cast<size_t>(kBigInts));
  std::iota(big.begin(), big.end(), int64_t{7});
  auto tensor = Tensor::from_vector<int64_t>(big, {kBigInts});
  REQUIRE(tensor.ok());
  const std::string large = registered(s, Dataset::from_tensors(Element{{*tensor}, {}}).repeat(40));
  got = drain(service::from_dataset_id(s.address(), large, options));
  REQUIRE(got.size() == 40);
  for (const Element& e : got) REQUIRE(e.components.at(0).equals(*tensor));
  auto buffer_of = [](const Element& e) {
    const Tensor& t = e.components.at(0);
    return rpc::received_buffer_holding(t.data(), t.byte_size()).get();
  };
  std::set<const void*> buffers;
  for (const Element& e : got) buffers.insert(buffer_of(e));
  CHECK(buffers.count(nullptr) == 0);
  CHECK(buffers.size() < got.size());
}

// Issue 37: a data worker killed for good (kill -9, never restarted). The
// dispatcher declares it lost after --worker-timeout-ms and moves its
// unfinished task to the surviving worker, which replays the task's splits
// and skips what the reader says it has. Before, the reader got 19,991 of
// 20,000 elements and then waited forever.
TEST_CASE("DYNAMIC: a data worker killed for good: its task moves on, every element once, then the end",
          "[data-service][fault]") {
  constexpr int64_t kElements = 8000;
  DataService s(2, {"--worker-timeout-ms", "2000"});
  std::chrono::steady_clock::time_point killed;
  auto got = read_disrupted(s, Dataset::range(kElements).batch(1), {2000}, [&](size_t) {
    s.workers[1]->kill_now();
    killed = std::chrono::steady_clock::now();
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  WARN("end of sequence " << seconds << " s after the kill (--worker-timeout-ms 2000)");
  CHECK(got == range_of(kElements));
  // Liveness, not speed: the end comes, long before the test's timeout.
  CHECK(seconds < 60);
  // The metrics are sampled once a second.
  CHECK(wait_until([&]() { return metric(*s.dispatcher, "capstan_data_dispatcher_tasks_reassigned_total") == 1; },
                   5s));
  CHECK(metric(*s.dispatcher, "capstan_data_dispatcher_tasks_waiting_for_worker") == 0);
}

// With no worker left, the task waits (the dispatcher's metrics and the
// reader's stderr say so) until a new worker registers and takes it over.
TEST_CASE("DYNAMIC: the last data worker killed for good: the read waits for a new one, then gets every element once",
          "[data-service][fault]") {
  constexpr int64_t kElements = 3000;
  DataService s(1, {"--worker-timeout-ms", "1000"});
  auto got = read_disrupted(s, Dataset::range(kElements), {1000}, [&](size_t) {
    s.workers[0]->kill_now();
    REQUIRE(wait_until([&]() { return metric(*s.dispatcher, "capstan_data_dispatcher_tasks_waiting_for_worker") == 1; },
                       20s));
    s.add_worker();
  });
  CHECK(got == range_of(kElements));
  // The metrics are sampled once a second.
  CHECK(wait_until([&]() { return metric(*s.dispatcher, "capstan_data_dispatcher_tasks_waiting_for_worker") == 0; },
                   5s));
  CHECK(metric(*s.dispatcher, "capstan_data_dispatcher_tasks_reassigned_total") == 1);
}

// Static sharding: the lost worker's task keeps its shard on its new worker.
TEST_CASE("DATA and FILE sharding: a data worker killed for good: its shard moves on, every element once",
          "[data-service][fault]") {
  SECTION("DATA") {
    constexpr int64_t kElements = 4000;
    DataService s(2, {"--worker-timeout-ms", "1000"});
    auto got = read_disrupted(s, Dataset::range(kElements), {700}, [&](size_t) { s.workers[0]->kill_now(); },
                              service::ProcessingMode::kData);
    CHECK(got == range_of(kElements));
  }
  SECTION("FILE") {
    constexpr int kFiles = 4, kRecords = 500;
    DataService s(2, {"--worker-timeout-ms", "1000"});
    std::vector<std::string> files;
    for (int f = 0; f < kFiles; ++f) {
      files.push_back(s.cluster.dir() + "/part-" + std::to_string(f) + ".tfrecord");
      auto writer = data::io::TFRecordWriter::open(files.back(), data::io::Compression::kNone);
      REQUIRE(writer.ok());
      for (int r = 0; r < kRecords; ++r) REQUIRE((*writer)->write(std::to_string(f * kRecords + r)).ok());
      REQUIRE((*writer)->close().ok());
    }
    service::ReadOptions options;
    options.processing_mode = service::ProcessingMode::kFile;
    auto it = service::from_dataset_id(s.address(), registered(s, Dataset::tfrecord_dataset(files)), options)
                  .make_iterator();
    REQUIRE(it.ok());
    std::vector<int64_t> got;
    while (true) {
      if (got.size() == 300) s.workers[1]->kill_now();
      auto next = (*it)->get_next();
      REQUIRE(next.ok());
      if (!next->has_value()) break;
      got.push_back(std::stoll(std::string((*next)->components.at(0).string_at(0))));
    }
    std::sort(got.begin(), got.end());
    CHECK(got == range_of(int64_t{kFiles} * kRecords));
  }
}

}  // namespace capstan::testing
