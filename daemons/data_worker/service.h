// The data-worker service (TF's DataServiceWorkerImpl behind the DataWorker
// interface of schemas/data_worker.capnp): runs the pipelines of the tasks
// the dispatcher assigns and serves their elements to consumers.
//
// Glossary:
//   task       - one job's pipeline running on this worker (a TaskDef from
//                the dispatcher); a TaskRunner serves its elements.
//   heartbeat  - workerHeartbeat(address, current tasks) every
//                heartbeat_interval_ms; the reply adds tasks (built on the
//                pool) and deletes tasks (destroyed on the pool).
//   split      - DYNAMIC tasks read their source's splits from the
//                dispatcher's getSplit, one at a time, through the loop.
//   finished   - a task whose runner reported end of sequence; the worker
//                tells the dispatcher (finishTask) once, retrying after
//                heartbeats until the dispatcher has it.
//
// Example: a DYNAMIC job over range(100) on two workers. Each worker gets a
// task in its heartbeat reply, builds the pipeline with a RemoteSplitProvider
// and serves getElements(task) until getSplit says endOfSplits; then it calls
// finishTask, and a later heartbeat reply deletes the task.
//
// A dispatcher that is down or restarting does not stop the worker: tasks
// keep serving, heartbeats retry with backoff (logged once per outage), and
// getSplit calls retry for up to 30 s.
//
// Thread-safety: lives on the RPC loop thread; its task table and dispatcher
// bookkeeping are touched only there. Pipelines run on their own threads and
// the pool, and reach the loop only through the SplitBridge (service.cc),
// which never blocks the loop, so the destructor can join them.
#ifndef CAPSTAN_DAEMONS_DATA_WORKER_SERVICE_H_
#define CAPSTAN_DAEMONS_DATA_WORKER_SERVICE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "capstan_schemas/data_dispatcher.capnp.h"
#include "capstan_schemas/data_worker.capnp.h"
#include "daemons/common/node_service.h"
#include "daemons/data_worker/task_runner.h"
#include "daemons/data_worker/task_table.h"
#include "data/shm_region.h"

namespace capstan::data_service {

class SplitBridge;
struct SplitCall;
struct WorkerTask;

// A tensor of a reply written into a consumer's shared region.
struct PlacedTensor {
  uint32_t element;
  uint32_t component;
  DType dtype;
  Shape shape;
  uint64_t offset;
  uint64_t length;
};

// The data worker's settings, read and checked once at start.
struct DataWorkerConfig {
  std::chrono::milliseconds heartbeat_interval{200};
  int64_t element_buffer_bytes = int64_t{64} << 20;
  // The memory budget of each task's pipeline (a job's own
  // Options::memory_budget may be lower).
  int64_t task_memory_bytes = int64_t{1024} << 20;

  // InvalidArgument naming the key and the value.
  static Result<DataWorkerConfig> from(const daemon::Config& config);
};

class DataWorkerService : public daemon::NodeService<wire::DataWorker::Server>,
                          private kj::TaskSet::ErrorHandler {
 public:
  // Reads its settings once (DataWorkerConfig::from(ctx.config)).
  explicit DataWorkerService(daemon::DaemonContext& ctx);
  // Fails pending getSplit calls and destroys every task's runner (joining
  // its threads) before the service goes.
  ~DataWorkerService();

 protected:
  kj::Promise<void> getElements(GetElementsContext context) override;

 private:
  // Per-job figures on /metrics (loop thread only).
  struct JobCounters {
    daemon::Counter* elements;
    daemon::Counter* bytes;
    daemon::Counter* starved;
  };
  JobCounters& job_counters(int64_t job_id);
  std::map<int64_t, JobCounters> job_counters_;  // at most 64 jobs
  std::optional<JobCounters> other_job_counters_;  // job="other": the jobs after those

  void taskFailed(kj::Exception&& exception) override;

  kj::Promise<void> heartbeat_loop();
  kj::Promise<void> heartbeat_once();
  void start_task(wire::TaskDef::Reader def);
  void delete_task(int64_t task_id);
  void report_finished(int64_t task_id);
  // Answers the getSplit calls pipelines post to the SplitBridge.
  kj::Promise<void> serve_splits();
  kj::Promise<void> fetch_split(std::shared_ptr<SplitCall> call);
  void update_task_gauge();
  // The region a request's large tensors go to (the one the consumer says
  // it mapped), or, for a consumer on this host without one, its ask.
  struct ShmAsk {
    uint64_t client;
    int64_t bytes;
  };
  void shm_regions(wire::GetElementsRequest::Shm::Reader shm, std::shared_ptr<data::shm::ShmRegion>* use,
                   std::optional<ShmAsk>* ask);
  // The region to offer for `ask`, created on first use (null when none can be).
  std::shared_ptr<data::shm::ShmRegion> shm_offer(const ShmAsk& ask);
  void write_shm(wire::DataWorker::GetElementsResults::Builder results, const std::vector<PlacedTensor>& placed,
                 const std::shared_ptr<data::shm::ShmRegion>& offer);

  // Constant after construction.
  const DataWorkerConfig config_;
  const std::chrono::milliseconds heartbeat_interval_;
  const int64_t element_buffer_bytes_;
  daemon::Counter* elements_served_;
  daemon::Counter* bytes_served_;
  daemon::Counter* heartbeat_failures_;
  daemon::Counter* splits_fetched_;
  daemon::Counter* shm_bytes_;
  daemon::Counter* compressed_raw_bytes_;   // tensors sent compressed: their raw bytes
  daemon::Counter* compressed_wire_bytes_;  //   and their frames' bytes
  daemon::Gauge* tasks_gauge_;
  std::shared_ptr<SplitBridge> splits_;  // thread-safe; shared with the pipelines

  // Loop thread only.
  kj::Own<rpc::Connection> dispatcher_;
  std::string address_;  // what consumers dial; read once the daemon is ready
  bool heartbeat_ok_once_ = false;
  bool waiting_logged_ = false;
  HeartbeatBackoff heartbeats_;
  TaskTable<WorkerTask> tasks_;
  // Each consumer's last numbered request to each task, which the next one
  // waits for (see getElements); dropped when the last one ends.
  using ChainKey = std::pair<int64_t, int64_t>;  // task id, job client id
  struct RequestChain {
    uint64_t generation;
    kj::ForkedPromise<void> tail;
  };
  std::map<ChainKey, RequestChain> chains_;
  uint64_t chain_generation_ = 0;
  // Shared-memory regions of consumers on this host, by the id a consumer
  // gave itself for this worker (GetElementsRequest.shm.client).
  struct ShmClient {
    std::shared_ptr<data::shm::ShmRegion> region;
    std::chrono::steady_clock::time_point used;
  };
  std::map<uint64_t, ShmClient> shm_clients_;
  bool shm_failure_logged_ = false;

  // Last, so its promises (which use everything above) go first.
  kj::TaskSet background_;
};

}  // namespace capstan::data_service

#endif  // CAPSTAN_DAEMONS_DATA_WORKER_SERVICE_H_
