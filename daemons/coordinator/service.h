// The coordinator service (TensorFlow's ClusterCoordinator, as a daemon).
//
// Glossary:
//   worker     a worker-server that registered, handing over a capability to
//              itself; the coordinator runs closures through it.
//   lane       one closure in flight on a worker; each worker gets
//              `closures_per_worker` lanes that take closures from the queue.
//   placement  where each shard of each variable lives (ps task, rows).
//
// A worker whose link breaks is dropped: its running closures go back to
// the queue (ClosureQueue::worker_failed). A parameter server that is
// unreachable makes join/fetch/schedule fail with Unavailable until it is
// back; dispatch pauses meanwhile.
//
// Not thread-safe: lives on the RPC loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_SERVICE_H_
#define CAPSTAN_DAEMONS_COORDINATOR_SERVICE_H_

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/ps.capnp.h"
#include "daemons/common/node_service.h"
#include "daemons/coordinator/checkpointing.h"
#include "daemons/coordinator/closure_queue.h"
#include "placement/placement.h"

namespace capstan::coordinator {

// The coordinator's settings, read and checked once at start.
struct CoordinatorConfig {
  std::vector<std::string> ps;  // addresses, ps task order
  int closures_per_worker = 1;
  std::chrono::milliseconds worker_ping_interval{2000};
  std::chrono::milliseconds worker_ping_timeout{5000};
  // Workers per-worker datasets are sharded for (0: the workers registered).
  int expected_workers = 0;

  // InvalidArgument naming the key and the value.
  static Result<CoordinatorConfig> from(const daemon::Config& config);
};

class CoordinatorService : public daemon::NodeService<wire::Coordinator::Server>,
                           private kj::TaskSet::ErrorHandler {
 public:
  explicit CoordinatorService(daemon::DaemonContext& ctx);
  ~CoordinatorService();

 protected:
  kj::Promise<void> registerWorker(RegisterWorkerContext context) override;
  kj::Promise<void> createVariable(CreateVariableContext context) override;
  kj::Promise<void> placements(PlacementsContext context) override;
  kj::Promise<void> schedule(ScheduleContext context) override;
  kj::Promise<void> join(JoinContext context) override;
  kj::Promise<void> done(DoneContext context) override;
  kj::Promise<void> fetch(FetchContext context) override;
  kj::Promise<void> release(ReleaseContext context) override;
  kj::Promise<void> createPerWorkerDataset(CreatePerWorkerDatasetContext context) override;
  kj::Promise<void> numWorkers(NumWorkersContext context) override;
  kj::Promise<void> closureNames(ClosureNamesContext context) override;
  kj::Promise<void> workerAlive(WorkerAliveContext context) override;
  kj::Promise<void> createPerWorkerDatasetFromFunction(
      CreatePerWorkerDatasetFromFunctionContext context) override;
  kj::Promise<void> saveCheckpoint(SaveCheckpointContext context) override;
  kj::Promise<void> restoreCheckpoint(RestoreCheckpointContext context) override;

 private:
  struct Worker {
    int64_t id = 0;
    int task_index = 0;
    wire::Worker::Client client = nullptr;
    std::set<std::string> functions;
    bool alive = true;
  };
  struct Ps {
    std::string address;
    kj::Own<rpc::Connection> connection;
    bool up = false;
  };
  struct Shard {
    std::string name;
    int ps_task = 0;
    int64_t first_row = 0;
    int64_t rows = 0;
  };
  struct Variable {
    std::string name;
    DType dtype = DType::kInvalid;
    Shape shape;
    std::vector<Shard> shards;
    Optimizer optimizer;
  };

  void taskFailed(kj::Exception&& exception) override;

  // Wakes everything waiting for a change (join, fetch, idle lanes).
  void notify();
  kj::Promise<void> changed();
  // Unavailable naming the first unreachable parameter server, or OK.
  Status ps_status() const;

  kj::Promise<void> watch_ps(size_t index);
  // Whether some registered worker has `name` (a closure, or "dataset:<fn>").
  bool any_worker_has(const std::string& name) const;
  // Every name the registered workers have, sorted.
  std::set<std::string> worker_functions() const;
  kj::Promise<void> lane(int64_t worker_id);
  // Pings a worker every few seconds; one that does not answer in time
  // (hung, or cut off without the link breaking) is dropped.
  kj::Promise<void> watch_worker(int64_t worker_id);
  void drop_worker(int64_t worker_id, const Status& why);
  kj::Promise<void> send_datasets(int64_t worker_id);
  int num_workers_for_datasets() const;
  void fill_placement(const Variable& variable, wire::VariablePlacement::Builder out) const;
  kj::Promise<void> wait_for_join();
  // Creates the shards of a new variable on the parameter servers.
  kj::Promise<void> create_shards(Variable variable, Tensor initial);
  // Values, slots and steps of every shard, read from the parameter servers.
  kj::Promise<std::vector<VariableState>> snapshot();
  kj::Promise<void> write_shards(std::vector<VariableState> states);
  kj::Promise<std::string> wait_for_value(int64_t id);

  const CoordinatorConfig config_;
  const int closures_per_worker_;
  const std::chrono::milliseconds worker_ping_interval_;
  const std::chrono::milliseconds worker_ping_timeout_;
  const int expected_workers_;
  ClosureQueue queue_;
  std::map<int64_t, Worker> workers_;
  int64_t next_worker_id_ = 1;
  std::vector<Ps> ps_;
  placement::Placer placer_;
  std::map<std::string, Variable> variables_;
  int64_t placement_version_ = 0;
  // A per-worker dataset: a definition (SHARD_HINT resolved per worker) or
  // the name of a dataset function in the workers' modules.
  struct PerWorkerDataset {
    std::string definition;
    std::string function;
  };
  kj::Promise<void> send_dataset(Worker& worker, int64_t id, const PerWorkerDataset& dataset);
  std::map<int64_t, PerWorkerDataset> datasets_;
  int64_t next_dataset_id_ = 1;
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> waiters_;
  kj::TaskSet tasks_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_SERVICE_H_
