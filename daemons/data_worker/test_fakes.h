// Fakes for the data worker's unit tests: a dispatcher that records what the
// worker asked and answers as the test says (leasing splits as the real one
// does), and a Harness (an event loop, a manual clock for heartbeats, a
// DataWorker over the fake).
#ifndef CAPSTAN_DAEMONS_DATA_WORKER_TEST_FAKES_H_
#define CAPSTAN_DAEMONS_DATA_WORKER_TEST_FAKES_H_

#include <kj/async-io.h>
#include <spdlog/sinks/null_sink.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "capstan/data/dataset.h"
#include "daemons/data_worker/data_worker.h"
#include "async/mailbox.h"

namespace capstan::data_worker::testing {

// Loop thread only, as the DataWorker that calls it.
class FakeDispatcher : public DispatcherPeer {
 public:
  std::string address() const override { return "dispatcher:5050"; }

  // ---- Heartbeats
  // Every call fails with Unavailable while true (the dispatcher is away).
  bool down = false;
  std::vector<std::vector<int64_t>> heartbeats;  // the current tasks each heartbeat reported
  std::deque<HeartbeatReply> replies;            // the next heartbeats' replies (then empty ones)

  kj::Promise<Result<HeartbeatReply>> worker_heartbeat(std::string worker_address,
                                                       std::vector<int64_t> current_tasks) override {
    CHECK(worker_address == "worker:6000");
    if (down) return Result<HeartbeatReply>(Status::Unavailable("dispatcher:5050 is down"));
    heartbeats.push_back(std::move(current_tasks));
    HeartbeatReply reply;
    if (!replies.empty()) {
      reply = std::move(replies.front());
      replies.pop_front();
    }
    return Result<HeartbeatReply>(std::move(reply));
  }

  // ---- Splits (source 0 of each job): the first request for a task's
  // sequence number leases the job's next split to it; the same number
  // again gets the same split.
  std::map<int64_t, std::vector<Element>> splits;  // by job
  std::deque<Status> split_failures;               // answers for the next calls, before any lease
  bool splits_down = false;                        // every call fails with Unavailable while true
  std::vector<SplitRequest> split_calls;           // in order

  // The splits of range(n), `chunk` elements each, as the real dispatcher
  // makes them.
  void set_range_splits(int64_t job_id, int64_t n, int64_t chunk) {
    auto provider = data::Dataset::range(n).make_split_provider(chunk);
    REQUIRE(provider.ok());
    while (true) {
      auto split = (*provider)->get_next();
      REQUIRE(split.ok());
      if (!split->has_value()) break;
      splits[job_id].push_back(std::move(**split));
    }
  }
  // A lease the task got on another worker (before it moved here).
  void lease(int64_t job_id, int64_t task_id, int64_t sequence) {
    leases_[{job_id, task_id, sequence}] = next_split_[job_id]++;
  }

  kj::Promise<Result<std::optional<Element>>> get_split(SplitRequest request) override {
    split_calls.push_back(request);
    if (down || splits_down) {
      return Result<std::optional<Element>>(Status::Unavailable("dispatcher:5050 is down"));
    }
    if (!split_failures.empty()) {
      Status failure = split_failures.front();
      split_failures.pop_front();
      return Result<std::optional<Element>>(failure);
    }
    CHECK(request.split_provider_index == 0);
    auto key = std::make_tuple(request.job_id, request.task_id, request.sequence);
    auto it = leases_.find(key);
    if (it == leases_.end()) it = leases_.emplace(key, next_split_[request.job_id]++).first;
    const std::vector<Element>& job_splits = splits[request.job_id];
    if (it->second >= job_splits.size()) return Result<std::optional<Element>>(std::optional<Element>());
    return Result<std::optional<Element>>(std::optional<Element>(job_splits[it->second]));
  }

  // ---- finishTask
  std::vector<int64_t> finishes;     // task ids, in order
  std::deque<Status> finish_answers;  // the next calls' answers (then Ok)

  kj::Promise<Status> finish_task(std::string worker_address, int64_t task_id) override {
    CHECK(worker_address == "worker:6000");
    finishes.push_back(task_id);
    if (down) return Status::Unavailable("dispatcher:5050 is down");
    if (finish_answers.empty()) return Status::Ok();
    Status answer = finish_answers.front();
    finish_answers.pop_front();
    return answer;
  }

 private:
  std::map<std::tuple<int64_t, int64_t, int64_t>, size_t> leases_;  // job, task, sequence -> split
  std::map<int64_t, size_t> next_split_;                             // by job
};

// Short waits, so that tests run fast: a split retried every millisecond
// or few, for up to 30 s unless a test shortens it.
inline DataWorkerConfig fast_config() {
  DataWorkerConfig config;
  config.heartbeat_interval = std::chrono::milliseconds(200);
  config.max_heartbeat_backoff = std::chrono::milliseconds(1600);
  config.element_buffer_bytes = int64_t{1} << 20;
  config.split_retry.initial_backoff = std::chrono::milliseconds(1);
  config.split_retry.max_backoff = std::chrono::milliseconds(4);
  return config;
}

inline TaskSpec range_task(int64_t task_id, int64_t job_id, int64_t n,
                           wire::ProcessingMode mode = wire::ProcessingMode::OFF) {
  TaskSpec spec;
  spec.task_id = task_id;
  spec.job_id = job_id;
  spec.dataset_id = "ds-range-" + std::to_string(n);
  spec.definition = data::Dataset::range(n).serialize();
  spec.mode = mode;
  if (mode == wire::ProcessingMode::DYNAMIC) spec.num_split_providers = 1;
  return spec;
}

inline int64_t value_of(const Element& e) { return e.components.at(0).flat<int64_t>()[0]; }

// An event loop, a manual clock (it drives heartbeats; pipelines and the
// pool run in real time) and a DataWorker over a FakeDispatcher.
struct Harness {
  explicit Harness(DataWorkerConfig config = fast_config())
      : io(kj::setupAsyncIo()),
        mailbox(*io.lowLevelProvider),
        timer(kj::origin<kj::TimePoint>()),
        pool(2),
        interval(config.heartbeat_interval),
        worker(std::make_unique<DataWorker>(
            config, dispatcher, timer, pool, nullptr,
            std::make_shared<spdlog::logger>("data_worker_test", std::make_shared<spdlog::sinks::null_sink_mt>()))) {
  }
  ~Harness() {
    worker.reset();
    pool.join();
  }

  // The first heartbeat goes at once.
  void start() {
    worker->start("worker:6000");
    settle();
  }
  void settle() { io.waitScope.poll(); }
  // Moves the clock one heartbeat interval on (the next heartbeat goes).
  void next_heartbeat() {
    timer.advanceTo(timer.now() + interval.count() * kj::MILLISECONDS);
    settle();
  }

  // Runs the loop until `done()` holds, for up to 30 s of real time (the
  // pool and pipeline threads reach the loop through its mailbox).
  template <typename Done>
  bool run_until(Done done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      settle();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  Result<ElementsReply> get(int64_t task_id, int max_elements = 16, int64_t client = -1, int64_t sequence = 0) {
    ElementsRequest request;
    request.task_id = task_id;
    request.get.max_elements = max_elements;
    request.get.client_id = client;
    request.get.sequence = sequence;
    return worker->get_elements(std::move(request)).wait(io.waitScope);
  }

  // Every element of a task, until its end (then end_sent, as the service
  // does once the end has gone out) or its error.
  struct Read {
    std::vector<int64_t> values;
    bool ended = false;
    Status error;
  };
  Read read_all(int64_t task_id) {
    Read read;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      // An answer the loop has already (a task being built) does not poll
      // the loop's events, such as the end of the build: poll them here.
      settle();
      auto reply = get(task_id);
      if (!reply.ok()) {
        read.error = reply.status();
        return read;
      }
      for (const Element& e : reply->reply.elements) read.values.push_back(value_of(e));
      if (!reply->reply.pipeline_error.ok()) {
        read.error = reply->reply.pipeline_error;
        return read;
      }
      if (reply->reply.end_of_sequence) {
        read.ended = true;
        worker->end_sent(task_id);
        return read;
      }
      if (!reply->from_runner) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    FAIL("task " << task_id << " did not end within 30 s");
    return read;
  }

  kj::AsyncIoContext io;
  async::Mailbox mailbox;  // run_on_pool and the split bridge reach the loop through it
  kj::TimerImpl timer;
  boost::asio::thread_pool pool;
  const std::chrono::milliseconds interval;
  FakeDispatcher dispatcher;  // outlives the worker
  std::unique_ptr<DataWorker> worker;
};

}  // namespace capstan::data_worker::testing

#endif  // CAPSTAN_DAEMONS_DATA_WORKER_TEST_FAKES_H_
