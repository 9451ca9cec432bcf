// The data service client: from_dataset_id definitions (serialization,
// validation, debug string, cardinality) and the reader's protocol against
// an in-process fake dispatcher and fake data workers (no daemons).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/data/service.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "capstan_schemas/data_worker.capnp.h"
#include "data/definition.h"
#include "data/service_reader.h"
#include "data/test_util.h"
#include "async/status_exception.h"
#include "rpc/server.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::service {
namespace {

using namespace std::chrono_literals;

// ---- Fakes ------------------------------------------------------------------------

// What the fake dispatcher knows and records; shared with the test thread.
struct DispatcherState {
  std::mutex mutex;
  std::map<std::string, std::string> ids;  // definition -> id
  struct JobRequest {
    std::string dataset_id;
    std::string job_name;
    wire::ProcessingMode mode = wire::ProcessingMode::OFF;
    int64_t num_consumers = 0;
    bool cross_trainer_cache = false;
  };
  std::vector<JobRequest> jobs;
  std::vector<std::pair<int64_t, std::string>> tasks;  // listed: task id, worker address
  bool job_finished = true;
  std::optional<Status> heartbeat_error;
  int unavailable_jobs = 0;  // getOrCreateJob answers Unavailable this many times
  int heartbeats = 0;
  // A dispatcher that fingerprints its task list (knownTasks): it answers
  // "unchanged" to a consumer that sends the list's fingerprint. Off: one
  // that predates the field.
  bool fingerprints = false;
  int unchanged_replies = 0;
  uint32_t interval_ms = 0;  // the interval the replies ask for
  std::vector<int64_t> released;
  int64_t next_client = 100;
};

class FakeDispatcher final : public wire::DataDispatcher::Server {
 public:
  explicit FakeDispatcher(DispatcherState* state) : state_(state) {}

 protected:
  kj::Promise<void> registerDataset(RegisterDatasetContext context) override {
    auto bytes = context.getParams().getDefinition();
    std::string definition(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto [it, added] = state_->ids.try_emplace(definition, std::to_string(state_->ids.size() + 1));
    context.getResults().setDatasetId(it->second);
    return kj::READY_NOW;
  }
  kj::Promise<void> getOrCreateJob(GetOrCreateJobContext context) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->unavailable_jobs > 0) {
      --state_->unavailable_jobs;
      return async::to_exception(Status::Unavailable("recovering"));
    }
    auto p = context.getParams().getParams();
    state_->jobs.push_back({p.getDatasetId().cStr(), p.getJobName().cStr(), p.getProcessingMode(),
                            p.getNumConsumers(), p.getCrossTrainerCache()});
    context.getResults().setJobId(1);
    context.getResults().setJobClientId(state_->next_client++);
    return kj::READY_NOW;
  }
  kj::Promise<void> releaseJobClient(ReleaseJobClientContext context) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->released.push_back(context.getParams().getJobClientId());
    return kj::READY_NOW;
  }
  kj::Promise<void> clientHeartbeat(ClientHeartbeatContext context) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    ++state_->heartbeats;
    if (state_->heartbeat_error) return async::to_exception(*state_->heartbeat_error);
    context.getResults().setJobFinished(state_->job_finished);
    context.getResults().setIntervalMs(state_->interval_ms);
    if (state_->fingerprints) {
      uint64_t fingerprint = 7 + state_->tasks.size();
      for (const auto& [id, address] : state_->tasks) {
        fingerprint = fingerprint * 1000003 + static_cast<uint64_t>(id) * 31 + std::hash<std::string>{}(address);
      }
      context.getResults().setTasksFingerprint(fingerprint);
      if (context.getParams().getKnownTasks() == fingerprint) {
        ++state_->unchanged_replies;
        context.getResults().setTasksUnchanged(true);
        return kj::READY_NOW;
      }
    }
    auto tasks = context.getResults().initTasks(static_cast<unsigned>(state_->tasks.size()));
    for (unsigned i = 0; i < tasks.size(); ++i) {
      tasks[i].setTaskId(state_->tasks[i].first);
      tasks[i].setJobId(1);
      tasks[i].setWorkerAddress(state_->tasks[i].second);
    }
    return kj::READY_NOW;
  }

 private:
  DispatcherState* const state_;
};

// A fake data worker: task t yields offset + 0 .. offset + elements - 1
// (first come), or round * num_consumers + consumer (coordinated).
struct WorkerState {
  std::mutex mutex;
  int64_t offset = 0;
  int64_t elements = 10;
  std::map<int64_t, int64_t> next;  // task -> next index
  // Numbered requests, as a real worker answers them: per task, the last
  // number served and the replies not acknowledged (their values; -1 ends).
  struct Numbered {
    int64_t last_served = 0;
    std::map<int64_t, std::vector<int64_t>> kept;
  };
  std::map<int64_t, Numbered> numbered;
  std::optional<Status> fail_once;  // the next request fails with this
  int64_t fail_sequence = 0;         // the first request with this number fails (Unavailable)
  bool bogus_shm_once = false;       // the next reply names a shared-memory tensor it never offered
  int not_ready = 0;                // the next requests get empty replies
  struct Request {
    int64_t task_id, job_client_id, consumer_index, round;
    int max_elements;
    std::string trainer_id;
    int64_t sequence = 0, acknowledged = 0, received = 0;
  };
  std::vector<Request> requests;
};

Element int_element(int64_t value) {
  Element e;
  e.components.push_back(Tensor::scalar<int64_t>(value));
  return e;
}

class FakeWorker final : public wire::DataWorker::Server {
 public:
  explicit FakeWorker(WorkerState* state) : state_(state) {}

 protected:
  kj::Promise<void> getElements(GetElementsContext context) override {
    auto r = context.getParams().getRequest();
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->requests.push_back({r.getTaskId(), r.getJobClientId(), r.getConsumerIndex(), r.getRoundIndex(),
                                r.getMaxElements(), r.getTrainerId().cStr(), r.getRequestSequence(),
                                r.getAcknowledged(), r.getReceived()});
    if (state_->fail_once) {
      Status error = *state_->fail_once;
      state_->fail_once.reset();
      return async::to_exception(error);
    }
    if (state_->not_ready > 0 && r.getRequestSequence() == 0) {
      --state_->not_ready;
      context.getResults().initElements(0);
      return kj::READY_NOW;
    }
    std::vector<Element> out;
    if (r.getConsumerIndex() >= 0) {
      out.push_back(int_element(r.getRoundIndex() * 100 + r.getConsumerIndex()));
    } else if (r.getRequestSequence() > 0) {
      WorkerState::Numbered& n = state_->numbered[r.getTaskId()];
      int64_t sequence = r.getRequestSequence();
      if (sequence == state_->fail_sequence) {
        state_->fail_sequence = 0;
        return async::to_exception(Status::Unavailable("reply " + std::to_string(sequence) + " lost"));
      }
      n.kept.erase(n.kept.begin(), n.kept.upper_bound(r.getAcknowledged()));
      std::vector<int64_t> values;
      if (sequence <= n.last_served && n.kept.count(sequence) > 0) {
        values = n.kept[sequence];
      } else if (sequence == n.last_served + 1) {
        int64_t& next = state_->next[r.getTaskId()];
        bool not_ready = state_->not_ready > 0;
        if (not_ready) --state_->not_ready;
        while (!not_ready && next < state_->elements && static_cast<int>(values.size()) < r.getMaxElements()) {
          values.push_back(state_->offset + next++);
        }
        n.last_served = sequence;
        n.kept[sequence] = values;
      } else {
        return async::to_exception(Status::FailedPrecondition("request number " + std::to_string(sequence) +
                                                            " after " + std::to_string(n.last_served)));
      }
      for (int64_t v : values) out.push_back(int_element(v));
      if (values.empty() && state_->next[r.getTaskId()] < state_->elements) {
        context.getResults().initElements(0);
        return kj::READY_NOW;  // not ready
      }
    } else {
      int64_t& next = state_->next[r.getTaskId()];
      while (next < state_->elements && static_cast<int>(out.size()) < r.getMaxElements()) {
        out.push_back(int_element(state_->offset + next++));
      }
    }
    auto elements = context.getResults().initElements(static_cast<unsigned>(out.size()));
    for (unsigned i = 0; i < out.size(); ++i) {
      rpc::write_element(elements[i], out[i], rpc::codec_options_for(64 << 20));
    }
    context.getResults().setEndOfSequence(out.empty());
    if (state_->bogus_shm_once && !out.empty()) {
      state_->bogus_shm_once = false;
      auto t = context.getResults().initShmTensors(1)[0];
      t.setDtype(wire::DType::INT64);
      t.initShape(1).set(0, 1);
      t.setOffset(4096 + 64);
      t.setLength(8);
    }
    return kj::READY_NOW;
  }

 private:
  WorkerState* const state_;
};

// A fake daemon on a loopback port (`port` 0 picks one).
template <typename Service, typename State>
class FakeServer {
 public:
  explicit FakeServer(State* state, uint16_t port = 0) : server_(options(port), nullptr) {
    auto bound = server_.start([state](rpc::CallTracker&) -> capnp::Capability::Client {
      return kj::heap<Service>(state);
    });
    // Not REQUIRE: a test restarts a fake server from a helper thread, and
    // Catch's assertions are not thread-safe.
    if (!bound.ok()) throw std::runtime_error("fake server: " + bound.status().to_string());
    port_ = *bound;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  uint16_t port() const { return port_; }

 private:
  static rpc::RpcServerOptions options(uint16_t port) {
    rpc::RpcServerOptions o;
    o.port = port;
    return o;
  }
  rpc::RpcServer server_;
  uint16_t port_ = 0;
};

using DispatcherServer = FakeServer<FakeDispatcher, DispatcherState>;
using WorkerServer = FakeServer<FakeWorker, WorkerState>;

// A loopback port nothing listens on.
uint16_t free_port() {
  WorkerState unused;
  WorkerServer probe(&unused);
  return probe.port();
}

int64_t as_int(const Element& e) { return e.components.at(0).flat<int64_t>()[0]; }

// Reads `it` to its end (or `limit` elements); every error fails the test.
std::vector<int64_t> drain(Iterator& it, size_t limit = SIZE_MAX) {
  return testing::int64_scalars(testing::drain(it, limit));
}

std::vector<int64_t> drain(engine::IteratorBase& it, size_t limit = SIZE_MAX) {
  std::vector<int64_t> out;
  while (out.size() < limit) {
    Element e;
    bool end = false;
    Status s = it.get_next(&e, &end);
    REQUIRE(s.ok());
    if (end) break;
    out.push_back(as_int(e));
  }
  return out;
}

// What the next get_next of `it` returns (its element is dropped).
Status next_status(engine::IteratorBase& it) {
  Element e;
  bool end = false;
  return it.get_next(&e, &end);
}

std::vector<int64_t> iota(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

// A reader config with short timings for tests.
ReaderConfig fast_config(const std::string& address, ReadOptions options = {}) {
  ReaderConfig config = config_from_op(from_dataset_id(address, "1", options).impl()->root());
  config.connect_timeout = 2000ms;
  config.call_timeout = 5000ms;
  config.worker_connect_timeout = 200ms;
  config.heartbeat_interval = 50ms;
  config.worker_drop_after = 300ms;
  config.max_idle_backoff = 20ms;
  return config;
}

// Two elements a request, `outstanding` requests in flight per task.
ReadOptions windowed(int64_t outstanding) {
  ReadOptions options;
  options.max_elements_per_request = 2;
  options.max_outstanding_requests = outstanding;
  return options;
}

// A fake dispatcher that lists one task (id 1) of one fake worker. The test
// sets up `w`, then calls start_worker() (or start_reading()).
struct OneTask {
  void start_worker() {
    worker = std::make_unique<WorkerServer>(&w);
    state.tasks = {{1, worker->address()}};
  }
  // Starts the worker and a reader of the task.
  std::unique_ptr<engine::IteratorBase> start_reading(ReadOptions options = {}) {
    start_worker();
    return make_service_reader(fast_config(dispatcher.address(), options));
  }
  // The reader's first answer is the worker's InvalidArgument naming `what`;
  // then it reads all 10 elements.
  void check_error_then_all(const std::string& what) {
    auto reader = start_reading();
    Status s = next_status(*reader);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains(what));
    CHECK(drain(*reader) == iota(0, 10));
  }

  DispatcherState state;
  DispatcherServer dispatcher{&state};
  WorkerState w;
  std::unique_ptr<WorkerServer> worker;
};

Status make_error(const Dataset& ds) { return ds.make_iterator().status(); }

// ---- Definitions ----------------------------------------------------------------------

TEST_CASE("from_dataset_id definitions survive serialization", "[data][service]") {
  ReadOptions options;
  options.processing_mode = ProcessingMode::kHint;
  options.job_name = "train";
  options.consumer_index = 1;
  options.num_consumers = 3;
  options.trainer_id = "trainer-a";
  options.cross_trainer_cache = true;
  options.cross_trainer_cache_bytes = 1 << 20;
  options.max_elements_per_request = 8;
  options.client.token = "secret";
  Dataset ds = from_dataset_id("10.0.0.1:5050", "42", options).batch(4);

  auto back = Dataset::deserialize(ds.serialize());
  REQUIRE(back.ok());
  CHECK(back->serialize() == ds.serialize());
  CHECK(back->debug_string() == ds.debug_string());
  auto op = back->impl()->root().getInput();
  REQUIRE(op.isDataService());
  ReaderConfig c = config_from_op(op);
  CHECK(c.address == "10.0.0.1:5050");
  CHECK(c.dataset_id == "42");
  CHECK(c.processing_mode == static_cast<uint8_t>(wire::ProcessingMode::HINT));
  CHECK(c.job_name == "train");
  CHECK(c.consumer_index == 1);
  CHECK(c.num_consumers == 3);
  CHECK(c.trainer_id == "trainer-a");
  CHECK(c.cross_trainer_cache);
  CHECK(c.cross_trainer_cache_bytes == (1 << 20));
  CHECK(c.max_elements_per_request == 8);
  CHECK(c.token == "secret");
}

TEST_CASE("ProcessingMode values match the dispatcher's wire enum", "[data][service]") {
  CHECK(static_cast<int>(ProcessingMode::kOff) == static_cast<int>(wire::ProcessingMode::OFF));
  CHECK(static_cast<int>(ProcessingMode::kDynamic) == static_cast<int>(wire::ProcessingMode::DYNAMIC));
  CHECK(static_cast<int>(ProcessingMode::kFile) == static_cast<int>(wire::ProcessingMode::FILE));
  CHECK(static_cast<int>(ProcessingMode::kData) == static_cast<int>(wire::ProcessingMode::DATA));
  CHECK(static_cast<int>(ProcessingMode::kFileOrData) == static_cast<int>(wire::ProcessingMode::FILE_OR_DATA));
  CHECK(static_cast<int>(ProcessingMode::kHint) == static_cast<int>(wire::ProcessingMode::HINT));
}

TEST_CASE("from_dataset_id arguments are checked by make_iterator, naming the bad one",
          "[data][service]") {
  auto error = [](const std::string& address, ReadOptions options, const std::string& dataset_id = "1") {
    return make_error(from_dataset_id(address, dataset_id, options));
  };
  // `o` with a good address is refused as InvalidArgument; the message matches `names`.
  auto refused = [&error](const ReadOptions& o, const auto& names) {
    Status s = error("127.0.0.1:5050", o);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), names);
  };
  SECTION("a dispatcher address that is not host:port") {
    for (const char* address : {"localhost", "localhost:", ":5050", "host:99999", "host:port", ""}) {
      Status s = error(address, {});
      CHECK(s.code() == StatusCode::kInvalidArgument);
      CHECK_THAT(s.message(), Catch::Contains("data_service") && Catch::Contains("address"));
    }
  }
  SECTION("an empty dataset id") {
    Status s = error("127.0.0.1:5050", {}, "");
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("dataset_id"));
  }
  SECTION("negative num_consumers") {
    ReadOptions o;
    o.job_name = "j";
    o.num_consumers = -2;
    refused(o, Catch::Contains("num_consumers") && Catch::Contains("-2"));
  }
  SECTION("consumer_index out of range") {
    ReadOptions o;
    o.job_name = "j";
    o.num_consumers = 2;
    for (int64_t index : {int64_t{-1}, int64_t{2}, int64_t{7}}) {
      o.consumer_index = index;
      refused(o, Catch::Contains("consumer_index") && Catch::Contains("[0, 2)"));
    }
  }
  SECTION("consumer_index without num_consumers") {
    ReadOptions o;
    o.consumer_index = 0;
    refused(o, Catch::Contains("consumer_index"));
  }
  SECTION("coordinated reads without a job name") {
    ReadOptions o;
    o.num_consumers = 2;
    o.consumer_index = 0;
    refused(o, Catch::Contains("job_name"));
  }
  SECTION("the cross-trainer cache without a trainer id or job name") {
    ReadOptions o;
    o.cross_trainer_cache = true;
    o.job_name = "j";
    CHECK_THAT(error("127.0.0.1:5050", o).message(), Catch::Contains("trainer_id"));
    o.job_name = "";
    o.trainer_id = "t";
    CHECK_THAT(error("127.0.0.1:5050", o).message(), Catch::Contains("job_name"));
  }
  SECTION("max_elements_per_request of 0") {
    ReadOptions o;
    o.max_elements_per_request = 0;
    CHECK_THAT(error("127.0.0.1:5050", o).message(), Catch::Contains("max_elements_per_request"));
  }
  SECTION("under other ops too") {
    ReadOptions o;
    o.num_consumers = -1;
    Status s = make_error(from_dataset_id("127.0.0.1:5050", "1", o).batch(2).prefetch(1));
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("num_consumers"));
  }
  SECTION("valid arguments make an iterator without contacting anyone") {
    ReadOptions o;
    o.job_name = "j";
    o.num_consumers = 2;
    o.consumer_index = 1;
    auto it = from_dataset_id("127.0.0.1:1", "1", o).make_iterator();
    CHECK(it.ok());
  }
}

TEST_CASE("a service dataset has a readable debug string without the token", "[data][service]") {
  ReadOptions o;
  o.processing_mode = ProcessingMode::kDynamic;
  o.job_name = "train";
  o.client.token = "secret";
  Dataset ds = from_dataset_id("127.0.0.1:5050", "7", o);
  CHECK(ds.debug_string() == "data_service(127.0.0.1:5050, 7, dynamic, job=train)");
  CHECK(ds.batch(2).debug_string() == "data_service(127.0.0.1:5050, 7, dynamic, job=train).batch(2)");
  CHECK(from_dataset_id("h:1", "3").debug_string() == "data_service(h:1, 3, off)");
  o.num_consumers = 4;
  o.consumer_index = 2;
  CHECK_THAT(from_dataset_id("h:1", "3", o).debug_string(), Catch::Contains("consumer 2 of 4"));
  CHECK_THAT(ds.debug_string(), !Catch::Contains("secret"));
}

TEST_CASE("a service dataset's cardinality is unknown", "[data][service]") {
  Dataset ds = from_dataset_id("127.0.0.1:5050", "1");
  CHECK(ds.cardinality() == kUnknownCardinality);
  CHECK(ds.map(Fn::cast(DType::kFloat32)).batch(2).cardinality() == kUnknownCardinality);
  CHECK(ds.take(5).cardinality() == kUnknownCardinality);
}

TEST_CASE("a service dataset cannot be split for dynamic sharding", "[data][service]") {
  auto provider = from_dataset_id("127.0.0.1:5050", "1").make_split_provider();
  REQUIRE_FALSE(provider.ok());
  CHECK(provider.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(provider.status().message(), Catch::Contains("data_service"));
}

// ---- The reader against fakes ------------------------------------------------------------

TEST_CASE("register_dataset gives the same definition the same id", "[data][service][rpc]") {
  DispatcherState state;
  DispatcherServer dispatcher(&state);
  auto a = register_dataset(dispatcher.address(), Dataset::range(10));
  auto b = register_dataset(dispatcher.address(), Dataset::range(10));
  auto c = register_dataset(dispatcher.address(), Dataset::range(11));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(*a == *b);
  CHECK(*a != *c);
}

TEST_CASE("register_dataset on an unreachable dispatcher is Unavailable after the connect timeout",
          "[data][service][rpc]") {
  ClientOptions options;
  options.connect_timeout = 300ms;
  auto started = std::chrono::steady_clock::now();
  auto id = register_dataset("127.0.0.1:" + std::to_string(free_port()), Dataset::range(3), options);
  REQUIRE_FALSE(id.ok());
  CHECK(id.status().code() == StatusCode::kUnavailable);
  CHECK(std::chrono::steady_clock::now() - started < 5s);
  CHECK(register_dataset("nonsense", Dataset::range(3)).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("OFF mode reads the whole dataset from every worker's task", "[data][service][rpc]") {
  DispatcherState state;
  DispatcherServer dispatcher(&state);
  WorkerState w1, w2;
  w2.offset = 100;
  WorkerServer worker1(&w1), worker2(&w2);
  state.tasks = {{1, worker1.address()}, {2, worker2.address()}};

  ReadOptions options;
  options.max_elements_per_request = 4;
  auto ds = distribute(Dataset::range(10), dispatcher.address(), options);
  REQUIRE(ds.ok());
  auto it = ds->make_iterator();
  REQUIRE(it.ok());
  auto got = drain(**it);
  std::sort(got.begin(), got.end());
  auto want = iota(0, 10);
  auto more = iota(100, 110);
  want.insert(want.end(), more.begin(), more.end());
  CHECK(got == want);

  std::lock_guard<std::mutex> lock(state.mutex);
  REQUIRE(state.jobs.size() == 1);
  CHECK(state.jobs[0].mode == wire::ProcessingMode::OFF);
  CHECK(state.jobs[0].dataset_id == state.ids.begin()->second);
  std::lock_guard<std::mutex> lock1(w1.mutex);
  for (const auto& r : w1.requests) {
    CHECK(r.max_elements == 4);
    CHECK(r.consumer_index == -1);
    CHECK(r.job_client_id == 100);
  }
}

TEST_CASE_METHOD(OneTask, "ops applied to a distributed dataset run locally", "[data][service][rpc]") {
  start_worker();
  auto ds = distribute(Dataset::range(10), dispatcher.address());
  REQUIRE(ds.ok());
  std::vector<int64_t> sizes;
  for (const Element& e : testing::drain(ds->batch(4))) sizes.push_back(e.components[0].shape()[0]);
  CHECK(sizes == std::vector<int64_t>{4, 4, 2});
}

TEST_CASE_METHOD(OneTask, "the reader waits for the dispatcher to report the job finished", "[data][service][rpc]") {
  start_worker();
  state.job_finished = false;
  auto reader = make_service_reader(fast_config(dispatcher.address()));
  CHECK(drain(*reader, 10) == iota(0, 10));
  std::thread finisher([this]() {
    std::this_thread::sleep_for(300ms);
    std::lock_guard<std::mutex> lock(state.mutex);
    state.job_finished = true;
  });
  auto started = std::chrono::steady_clock::now();
  Element e;
  bool end = false;
  CHECK(reader->get_next(&e, &end).ok());
  CHECK(end);
  CHECK(std::chrono::steady_clock::now() - started >= 250ms);
  finisher.join();
}

TEST_CASE("tasks that appear later are read too, empty replies mean not ready", "[data][service][rpc]") {
  DispatcherState state;
  DispatcherServer dispatcher(&state);
  WorkerState w1, w2;
  w2.offset = 100;
  w1.not_ready = 3;
  WorkerServer worker1(&w1), worker2(&w2);
  state.tasks = {{1, worker1.address()}};
  state.job_finished = false;
  auto reader = make_service_reader(fast_config(dispatcher.address()));
  std::vector<int64_t> got = drain(*reader, 5);
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.tasks.push_back({2, worker2.address()});
    state.job_finished = true;
  }
  auto rest = drain(*reader);
  got.insert(got.end(), rest.begin(), rest.end());
  std::sort(got.begin(), got.end());
  auto want = iota(0, 10);
  auto more = iota(100, 110);
  want.insert(want.end(), more.begin(), more.end());
  CHECK(got == want);
}

TEST_CASE("coordinated reads take round r from task r % tasks with the consumer index",
          "[data][service][rpc]") {
  DispatcherState state;
  DispatcherServer dispatcher(&state);
  WorkerState w1, w2;
  WorkerServer worker1(&w1), worker2(&w2);
  state.tasks = {{8, worker2.address()}, {3, worker1.address()}};  // sorted by id: 3, 8
  state.job_finished = false;
  ReadOptions options;
  options.job_name = "train";
  options.num_consumers = 2;
  options.consumer_index = 1;
  auto reader = make_service_reader(fast_config(dispatcher.address(), options));
  CHECK(drain(*reader, 4) == std::vector<int64_t>{1, 101, 201, 301});
  std::lock_guard<std::mutex> lock1(w1.mutex);
  std::lock_guard<std::mutex> lock2(w2.mutex);
  REQUIRE(w1.requests.size() == 2);
  REQUIRE(w2.requests.size() == 2);
  CHECK(w1.requests[0].task_id == 3);
  CHECK(w1.requests[0].round == 0);
  CHECK(w1.requests[1].round == 2);
  CHECK(w2.requests[0].task_id == 8);
  CHECK(w2.requests[0].round == 1);
  CHECK(w2.requests[1].round == 3);
  for (const auto* r : {&w1.requests[0], &w2.requests[1]}) {
    CHECK(r->consumer_index == 1);
    CHECK(r->max_elements == 1);
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  CHECK(state.jobs.at(0).num_consumers == 2);
  CHECK(state.jobs.at(0).job_name == "train");
}

TEST_CASE_METHOD(OneTask, "the cross-trainer cache passes the trainer id", "[data][service][rpc]") {
  start_worker();
  ReadOptions options;
  options.job_name = "shared";
  options.cross_trainer_cache = true;
  options.trainer_id = "trainer-7";
  auto reader = make_service_reader(fast_config(dispatcher.address(), options));
  CHECK(drain(*reader) == iota(0, 10));
  std::lock_guard<std::mutex> lock(w.mutex);
  REQUIRE_FALSE(w.requests.empty());
  CHECK(w.requests[0].trainer_id == "trainer-7");
  std::lock_guard<std::mutex> lock2(state.mutex);
  CHECK(state.jobs.at(0).cross_trainer_cache);
}

TEST_CASE("getOrCreateJob is retried while the dispatcher is Unavailable", "[data][service][rpc]") {
  DispatcherState state;
  state.unavailable_jobs = 3;
  DispatcherServer dispatcher(&state);
  WorkerState w;
  WorkerServer worker(&w);
  state.tasks = {{1, worker.address()}};
  auto reader = make_service_reader(fast_config(dispatcher.address()));
  CHECK(drain(*reader) == iota(0, 10));
}

TEST_CASE("an unreachable dispatcher is Unavailable after the connect timeout", "[data][service][rpc]") {
  ReaderConfig config = fast_config("127.0.0.1:" + std::to_string(free_port()));
  config.connect_timeout = 300ms;
  auto reader = make_service_reader(config);
  auto started = std::chrono::steady_clock::now();
  Status s = next_status(*reader);
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Catch::Contains("getOrCreateJob"));
  CHECK(std::chrono::steady_clock::now() - started < 5s);
}

TEST_CASE("a worker that restarts is read again without losing elements", "[data][service][rpc]") {
  DispatcherState state;
  DispatcherServer dispatcher(&state);
  WorkerState w;  // survives the restart, like a task's position would
  auto worker = std::make_unique<WorkerServer>(&w);
  uint16_t port = worker->port();
  state.tasks = {{1, worker->address()}};
  ReadOptions options;
  options.max_elements_per_request = 1;
  auto reader = make_service_reader(fast_config(dispatcher.address(), options));
  std::vector<int64_t> got = drain(*reader, 3);
  worker.reset();
  std::thread restarter([&worker, &w, port]() {
    std::this_thread::sleep_for(400ms);
    worker = std::make_unique<WorkerServer>(&w, port);
  });
  auto rest = drain(*reader);
  restarter.join();
  got.insert(got.end(), rest.begin(), rest.end());
  CHECK(got == iota(0, 10));
}

TEST_CASE("through unchanged heartbeat replies the reader keeps its tasks, and a changed list adds and drops them",
          "[data][service][rpc]") {
  DispatcherState state;
  state.fingerprints = true;
  DispatcherServer dispatcher(&state);
  WorkerState w1, w2;
  w2.offset = 100;
  w1.not_ready = 3;
  WorkerServer worker1(&w1), worker2(&w2);
  const std::string dead = "127.0.0.1:" + std::to_string(free_port());
  state.tasks = {{1, worker1.address()}, {3, dead}};
  state.job_finished = false;
  auto reader = make_service_reader(fast_config(dispatcher.address()));
  std::vector<int64_t> got = drain(*reader, 5);
  std::this_thread::sleep_for(300ms);  // heartbeats with the list unchanged
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    CHECK(state.unchanged_replies >= 1);
    // A new task, and task 3 (its worker unreachable) no longer listed.
    state.tasks = {{1, worker1.address()}, {2, worker2.address()}};
    state.job_finished = true;
  }
  auto rest = drain(*reader);  // ends only once task 3 is dropped
  got.insert(got.end(), rest.begin(), rest.end());
  std::sort(got.begin(), got.end());
  auto want = iota(0, 10);
  auto more = iota(100, 110);
  want.insert(want.end(), more.begin(), more.end());
  CHECK(got == want);
  std::lock_guard<std::mutex> lock(state.mutex);
  CHECK(state.unchanged_replies >= 2);  // the changed list was fingerprinted and kept too
}

TEST_CASE("a reader heartbeats no more often than the dispatcher asks, idle or not", "[data][service][rpc]") {
  DispatcherState state;
  state.interval_ms = 400;
  DispatcherServer dispatcher(&state);
  WorkerState w;
  w.not_ready = 1000000;  // never ready: the reader idles, which would ask for heartbeats early
  WorkerServer worker(&w);
  state.tasks = {{1, worker.address()}};
  state.job_finished = false;
  auto reader = make_service_reader(fast_config(dispatcher.address()));  // heartbeat_interval 50 ms
  std::atomic<bool> stop{false};
  std::thread reading([&]() {
    while (!stop) {
      if (next_status(*reader).code() != StatusCode::kOk) break;
    }
  });
  std::this_thread::sleep_for(1000ms);
  int heartbeats;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    heartbeats = state.heartbeats;
    state.job_finished = true;
  }
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.not_ready = 0;  // the task's 10 elements, then its end: the reader ends
  }
  stop = true;
  reading.join();
  // The first at the start, then one every 400 ms: 3 in a second (20+ at
  // 50 ms, more with the idle wake-ups).
  CHECK(heartbeats >= 1);
  CHECK(heartbeats <= 4);
}

TEST_CASE("a task whose worker stays unreachable and is no longer listed is dropped",
          "[data][service][rpc]") {
  DispatcherState state;
  DispatcherServer dispatcher(&state);
  WorkerState w;
  WorkerServer worker(&w);
  std::string dead = "127.0.0.1:" + std::to_string(free_port());
  state.tasks = {{1, worker.address()}, {2, dead}};
  auto reader = make_service_reader(fast_config(dispatcher.address()));
  std::vector<int64_t> got = drain(*reader, 10);
  CHECK(got == iota(0, 10));
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.tasks = {{1, worker.address()}};
  }
  auto started = std::chrono::steady_clock::now();
  CHECK(drain(*reader).empty());  // ends once task 2 is dropped
  CHECK(std::chrono::steady_clock::now() - started < 10s);
}

TEST_CASE("a listed task is kept while its worker is unreachable", "[data][service][rpc]") {
  DispatcherState state;
  DispatcherServer dispatcher(&state);
  state.tasks = {{2, "127.0.0.1:" + std::to_string(free_port())}};
  auto reader = make_service_reader(fast_config(dispatcher.address()));
  std::atomic<bool> done{false};
  std::thread reading([&reader, &done]() {
    (void)next_status(*reader);
    done = true;
  });
  std::this_thread::sleep_for(800ms);  // longer than worker_drop_after
  CHECK_FALSE(done);
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.tasks.clear();
  }
  reading.join();
  CHECK(done);
}

TEST_CASE_METHOD(OneTask, "a worker's element error is returned once and reading continues", "[data][service][rpc]") {
  w.fail_once = Status::InvalidArgument("bad record 3");
  check_error_then_all("bad record 3");
}

TEST_CASE_METHOD(OneTask, "the reader keeps max_outstanding_requests numbered requests in flight per task",
                 "[data][service][rpc]") {
  w.elements = 20;
  auto reader = start_reading(windowed(3));
  CHECK(drain(*reader) == iota(0, 20));
  std::lock_guard<std::mutex> lock(w.mutex);
  REQUIRE(w.requests.size() >= 10);
  // Three went out before any reply came back; each later one acknowledges
  // the reply that made room for it, with the elements received so far.
  for (size_t i = 0; i < 3; ++i) {
    CHECK(w.requests[i].sequence == static_cast<int64_t>(i) + 1);
    CHECK(w.requests[i].acknowledged == 0);
  }
  for (size_t i = 3; i < 10; ++i) {
    CHECK(w.requests[i].sequence == static_cast<int64_t>(i) + 1);
    CHECK(w.requests[i].acknowledged == static_cast<int64_t>(i) - 2);
    CHECK(w.requests[i].received == 2 * w.requests[i].acknowledged);
  }
}

TEST_CASE_METHOD(OneTask, "a reply lost mid-window is asked for again: nothing lost, nothing twice, in order",
                 "[data][service][rpc]") {
  w.elements = 20;
  w.fail_sequence = 3;
  auto reader = start_reading(windowed(4));
  CHECK(drain(*reader) == iota(0, 20));
  std::lock_guard<std::mutex> lock(w.mutex);
  int asked_for_3 = 0;
  for (const auto& r : w.requests) asked_for_3 += r.sequence == 3 ? 1 : 0;
  CHECK(asked_for_3 == 2);
}

TEST_CASE_METHOD(OneTask, "a reply naming shared memory the reader never mapped is an error, and reading goes on",
                 "[data][service][rpc]") {
  w.bogus_shm_once = true;
  // The worker keeps the reply; asked again, it sends it without the bogus part.
  check_error_then_all("shared memory");
}

TEST_CASE("max_outstanding_requests is checked", "[data][service]") {
  ReadOptions options;
  options.max_outstanding_requests = 0;
  auto status = make_error(from_dataset_id("localhost:1", "1", options));
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("max_outstanding_requests"));
  options.max_outstanding_requests = 17;
  CHECK(make_error(from_dataset_id("localhost:1", "1", options)).code() == StatusCode::kInvalidArgument);
  options.max_outstanding_requests = 1;
  options.shared_memory_bytes = -1;
  CHECK_THAT(make_error(from_dataset_id("localhost:1", "1", options)).message(),
             Catch::Contains("shared_memory_bytes"));
}

TEST_CASE_METHOD(OneTask, "a worker that has not heard of the task yet is asked again", "[data][service][rpc]") {
  w.fail_once = Status::NotFound("task 1 not found");
  start_worker();
  auto reader = make_service_reader(fast_config(dispatcher.address()));
  CHECK(drain(*reader) == iota(0, 10));
}

TEST_CASE("a heartbeat refused for good ends the reader with that error", "[data][service][rpc]") {
  DispatcherState state;
  state.heartbeat_error = Status::NotFound("job client 100 is unknown");
  DispatcherServer dispatcher(&state);
  auto reader = make_service_reader(fast_config(dispatcher.address()));
  Status s = next_status(*reader);
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("clientHeartbeat"));
  CHECK(next_status(*reader).code() == StatusCode::kNotFound);
}

TEST_CASE_METHOD(OneTask, "the reader releases its job client when destroyed", "[data][service][rpc]") {
  start_worker();
  {
    auto reader = make_service_reader(fast_config(dispatcher.address()));
    CHECK(drain(*reader, 2).size() == 2);
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  CHECK(state.released == std::vector<int64_t>{100});
  int heartbeats = state.heartbeats;
  CHECK(heartbeats >= 1);
}

TEST_CASE("a reader that never started contacts nobody", "[data][service][rpc]") {
  DispatcherState state;
  DispatcherServer dispatcher(&state);
  { auto reader = make_service_reader(fast_config(dispatcher.address())); }
  std::lock_guard<std::mutex> lock(state.mutex);
  CHECK(state.jobs.empty());
  CHECK(state.released.empty());
}

}  // namespace
}  // namespace capstan::data::service
