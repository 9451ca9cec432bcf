// DataWorker: the data worker's logic apart from Cap'n Proto (TF's
// DataServiceWorkerImpl; DataWorkerService in service.h adapts it to
// schemas/data_worker.capnp, as GrpcWorkerImpl does). It runs the pipelines
// of the tasks the dispatcher assigns and hands their elements out; it
// reaches the dispatcher through a DispatcherPeer (remote_dispatcher.h over
// Cap'n Proto, test_fakes.h in unit tests).
//
// Glossary:
//   task       - one job's pipeline running on this worker (a TaskSpec from
//                the dispatcher); a TaskRunner serves its elements. A worker
//                may run two tasks of one job: a task of a lost worker moves
//                here (the dispatcher's ReassignTask) beside its own.
//   heartbeat  - workerHeartbeat(address, current tasks) every
//                heartbeat_interval; the reply adds tasks (built on the
//                pool) and deletes tasks (destroyed on the pool).
//   split      - DYNAMIC tasks read their source's splits from the
//                dispatcher's getSplit, one at a time, through the loop;
//                request k of a task's provider carries sequence number k.
//   finished   - a task whose end of sequence reached a consumer; the
//                worker tells the dispatcher (finishTask) once, retrying
//                after heartbeats until the dispatcher has it.
//
// Example: a DYNAMIC job over range(100) on two workers. Each worker gets a
// task in its heartbeat reply, builds the pipeline with a split provider
// that asks the dispatcher, and serves get_elements(task) until getSplit
// says endOfSplits; once the end has gone out (end_sent) it calls
// finishTask, and a later heartbeat reply deletes the task.
//
// A dispatcher that is down or restarting does not stop the worker: tasks
// keep serving, heartbeats retry with backoff (logged once per outage), and
// getSplit calls retry for up to SplitRetryPolicy::window.
//
// Thread-safety: not thread-safe; lives on one KJ loop thread, which must
// have an async::Mailbox (every LoopThread has one). Pipelines run on their
// own threads and the pool, and reach the loop only through the split
// bridge (data_worker.cc), which never blocks the loop, so the destructor
// can join them.
#ifndef CAPSTAN_DAEMONS_DATA_WORKER_DATA_WORKER_H_
#define CAPSTAN_DAEMONS_DATA_WORKER_DATA_WORKER_H_

#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>
#include <kj/timer.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capstan/functions.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "daemons/data_worker/task_runner.h"
#include "daemons/data_worker/task_table.h"
#include "data/compression.h"
#include "data/shm_region.h"

namespace capstan::daemon {
class Config;
}  // namespace capstan::daemon

namespace capstan::data_worker {

class SplitBridge;
struct SplitCall;
struct WorkerTask;

// How a DYNAMIC task asks for its next split while the dispatcher is
// unreachable: attempts `initial_backoff` apart, doubling up to
// `max_backoff`, for up to `window` (a dispatcher restart takes a few
// seconds). Every attempt carries the same sequence number, so the
// dispatcher leases the same split however many replies were lost.
struct SplitRetryPolicy {
  std::chrono::milliseconds window{30000};
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{2000};
  // One getSplit attempt on the loop: connecting plus the call.
  std::chrono::milliseconds attempt_timeout{10000};
};

// The data worker's settings, read and checked once at start.
struct DataWorkerConfig {
  std::chrono::milliseconds heartbeat_interval{200};
  int64_t element_buffer_bytes = int64_t{64} << 20;
  // The memory budget of each task's pipeline (a job's own
  // Options::memory_budget may be lower).
  int64_t task_memory_bytes = int64_t{1024} << 20;

  // Not read from the configuration (unit tests shorten them).
  std::chrono::milliseconds max_heartbeat_backoff{5000};
  // How long get_elements waits for a first element before answering with none.
  std::chrono::milliseconds get_elements_wait{100};
  SplitRetryPolicy split_retry;

  // From the daemon's options, whose ranges were checked when they were
  // parsed (defined in service.cc).
  static DataWorkerConfig from(const daemon::Config& config);
};

// What the dispatcher asks this worker to run (a TaskDef, decoded).
struct TaskSpec {
  int64_t task_id = 0;
  int64_t job_id = 0;
  std::string dataset_id;
  std::string definition;  // Dataset::serialize()
  wire::ProcessingMode mode = wire::ProcessingMode::OFF;
  int64_t num_consumers = 0;
  bool cross_trainer_cache = false;
  int64_t cross_trainer_cache_bytes = 0;
  int64_t num_split_providers = 0;  // DYNAMIC: one per source
  wire::ElementCompression compression = wire::ElementCompression::AUTO;
};

struct HeartbeatReply {
  std::vector<TaskSpec> new_tasks;
  std::vector<int64_t> tasks_to_delete;
  std::chrono::milliseconds interval{0};  // the dispatcher's: heartbeat no more often (0: as configured)
};

// getSplit: split number `sequence` (0, 1, 2, ...) of `task_id` from
// provider `split_provider_index` of `job_id` (repetition 0).
struct SplitRequest {
  int64_t job_id = 0;
  int64_t split_provider_index = 0;
  int64_t task_id = 0;
  int64_t sequence = 0;
};

// The dispatcher, as the data worker calls it. Calls resolve with a Status
// whose code says what to do: Unavailable, DeadlineExceeded and
// ResourceExhausted are worth retrying (the dispatcher is away or busy);
// the rest are its answer. They reject only for a bug.
class DispatcherPeer {
 public:
  virtual ~DispatcherPeer() = default;
  virtual std::string address() const = 0;  // for logs
  virtual kj::Promise<Result<HeartbeatReply>> worker_heartbeat(std::string worker_address,
                                                               std::vector<int64_t> current_tasks) = 0;
  // The split, or nullopt for endOfSplits.
  virtual kj::Promise<Result<std::optional<Element>>> get_split(SplitRequest request) = 0;
  virtual kj::Promise<Status> finish_task(std::string worker_address, int64_t task_id) = 0;
};

// A tensor of a reply written into a consumer's shared region.
struct PlacedTensor {
  uint32_t element;
  uint32_t component;
  DType dtype;
  Shape shape;
  uint64_t offset;
  uint64_t length;
};

// A consumer's shared-memory part of a request (GetElementsRequest.shm).
struct ShmRequest {
  uint64_t client = 0;  // 0: no shared memory
  std::string boot_id;
  int64_t region_bytes = 0;
  uint64_t region = 0;  // the token of the region it mapped (0: none yet)
};

struct ElementsRequest {
  int64_t task_id = 0;
  // max_elements must be positive; max_bytes 0 is the runner's default and
  // a negative one is refused; `wait` is the worker's get_elements_wait.
  TaskRunner::Request get;
  bool local_consumer = false;  // on this host: AUTO compression sends raw
  ShmRequest shm;
};

struct ElementsReply {
  int64_t job_id = -1;
  // False when no runner answered: the task is being built (no elements,
  // ask again), was deleted after its end (end_of_sequence), or its
  // pipeline could not be built (pipeline_error).
  bool from_runner = false;
  TaskRunner::Reply reply;
  std::vector<data::ElementFrames> frames;  // one per element (WireCompressor::frames)
  std::vector<PlacedTensor> placed;         // in the region the consumer mapped
  std::shared_ptr<data::shm::ShmRegion> offer;  // a region to offer the consumer, or null
};

class DataWorker final : private kj::TaskSet::ErrorHandler {
 public:
  // `dispatcher`, `timer` and `pool` must outlive this; `functions` (the
  // modules' functions, may be null) too.
  DataWorker(DataWorkerConfig config, DispatcherPeer& dispatcher, kj::Timer& timer, boost::asio::thread_pool& pool,
             const FunctionRegistry* functions, std::shared_ptr<spdlog::logger> log);
  // Fails pending getSplit calls and destroys every task's runner (joining
  // its threads).
  ~DataWorker();
  DataWorker(const DataWorker&) = delete;
  DataWorker& operator=(const DataWorker&) = delete;

  // Starts heartbeating as `address` (what consumers dial). Call once.
  void start(std::string address);

  // Elements of a task. NotFound for a task this worker has not heard of (a
  // consumer can hear of a task before this worker's next heartbeat does);
  // InvalidArgument for a bad request. A consumer's numbered requests to a
  // task reach the runner in their order, one after the other, however
  // many it keeps in flight.
  kj::Promise<Result<ElementsReply>> get_elements(ElementsRequest request);
  // A reply with task `task_id`'s end of sequence went to a consumer: the
  // first time, tells the dispatcher (finishTask), retrying after each
  // successful heartbeat while the dispatcher is away.
  void end_sent(int64_t task_id);

  // The tasks the next heartbeat reports (serving and building).
  std::vector<int64_t> current_tasks() const { return tasks_.current_ids(); }

  // Totals and levels for /metrics, read from any thread (the loop thread
  // writes them). Shared, so a metrics callback may outlive the worker.
  struct Stats {
    std::atomic<int64_t> heartbeat_failures{0};
    std::atomic<int64_t> splits_fetched{0};
    std::atomic<int64_t> tasks{0};  // building included
  };
  std::shared_ptr<const Stats> stats() const { return stats_; }

 private:
  void taskFailed(kj::Exception&& exception) override;

  kj::Promise<void> heartbeat_loop();
  kj::Promise<Status> heartbeat_once();
  void start_task(TaskSpec spec);
  void delete_task(int64_t task_id);
  void report_finished(int64_t task_id);
  // Answers the getSplit calls pipelines post to the split bridge.
  kj::Promise<void> serve_splits();
  kj::Promise<void> fetch_split(std::shared_ptr<SplitCall> call);
  void update_task_gauge();
  // The region a request's large tensors go to (the one the consumer says
  // it mapped), or, for a consumer on this host without one, its ask.
  struct ShmAsk {
    uint64_t client;
    int64_t bytes;
  };
  void shm_regions(const ShmRequest& shm, std::shared_ptr<data::shm::ShmRegion>* use, std::optional<ShmAsk>* ask);
  // The region to offer for `ask`, created on first use (null when none can be).
  std::shared_ptr<data::shm::ShmRegion> shm_offer(const ShmAsk& ask);

  // Constant after construction.
  const DataWorkerConfig config_;
  DispatcherPeer& dispatcher_;
  kj::Timer& timer_;
  boost::asio::thread_pool& pool_;
  const FunctionRegistry* const functions_;
  const std::shared_ptr<spdlog::logger> log_;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
  const std::shared_ptr<SplitBridge> splits_;  // thread-safe; shared with the pipelines

  // Loop thread only.
  std::string address_;  // set by start()
  bool heartbeat_ok_once_ = false;
  std::chrono::milliseconds heartbeat_asked_{0};  // the last reply's interval
  HeartbeatBackoff heartbeats_;
  TaskTable<WorkerTask> tasks_;
  // Each consumer's last numbered request to each task, which the next one
  // waits for (see get_elements); dropped when the last one ends.
  using ChainKey = std::pair<int64_t, int64_t>;  // task id, job client id
  struct RequestChain {
    uint64_t generation;
    kj::ForkedPromise<void> tail;
  };
  std::map<ChainKey, RequestChain> chains_;
  uint64_t chain_generation_ = 0;
  // Shared-memory regions of consumers on this host, by the id a consumer
  // gave itself for this worker (ShmRequest::client).
  struct ShmClient {
    std::shared_ptr<data::shm::ShmRegion> region;
    std::chrono::steady_clock::time_point used;
  };
  std::map<uint64_t, ShmClient> shm_clients_;
  bool shm_failure_logged_ = false;

  // Last, so its promises (which use everything above) go first.
  kj::TaskSet background_;
};

}  // namespace capstan::data_worker

#endif  // CAPSTAN_DAEMONS_DATA_WORKER_DATA_WORKER_H_
