// The data dispatcher's journaled state: datasets, workers, jobs, job clients,
// tasks and dynamic-sharding split counters.
//
// After TensorFlow's tensorflow/core/data/service/dispatcher_state.h: every
// state change is an `Update`, and all state modifications go through
// `DispatcherState::apply`. The dispatcher encodes an update, writes the
// record to its journal, and then applies it; on start it decodes and
// re-applies every journaled record, which rebuilds exactly the same state
// (including the `next_available_*_id()` counters).
//
// Division of work (as in TF's DataServiceDispatcherImpl / DispatcherState):
// Dispatcher (dispatcher.h) serves requests, reads this state, decides which updates to
// make (fingerprint lookup, "get or create" of named jobs, matching job
// parameters, GC policy, split providers themselves) and serializes access;
// DispatcherState validates and applies updates and answers queries.
#ifndef CAPSTAN_DAEMONS_DATA_DISPATCHER_DISPATCHER_STATE_H_
#define CAPSTAN_DAEMONS_DATA_DISPATCHER_DISPATCHER_STATE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "capstan/status.h"
#include "capstan_schemas/data_dispatcher.capnp.h"

namespace capstan::data_dispatcher {

// How a job's data is divided among workers (TF's ShardingPolicy).
enum class ProcessingMode : uint8_t {
  kOff = 0,          // every worker produces the whole dataset
  kDynamic = 1,      // the dispatcher hands out splits (DISTRIBUTED_EPOCH)
  kFile = 2,         // static sharding by files
  kData = 3,         // static sharding by elements
  kFileOrData = 4,   // by files if possible, else by elements
  kHint = 5,         // at shard hints in the pipeline
};
inline constexpr uint8_t kMaxProcessingMode = 5;
// Split providers of a job: the wire limit (schemas/data_dispatcher.capnp),
// which also bounds what one journal record can make the state allocate.
inline constexpr int64_t kMaxSplitProviders = wire::MAX_SPLIT_PROVIDERS;

// Which workers a job reads from (TF's TargetWorkers).
enum class TargetWorkers : uint8_t {
  kAuto = 0,   // the service decides (local workers for static sharding)
  kAny = 1,    // any worker
  kLocal = 2,  // only workers on the consumer's host
};
inline constexpr uint8_t kMaxTargetWorkers = 2;

std::string_view processing_mode_name(ProcessingMode mode);
std::string_view target_workers_name(TargetWorkers target);

// ---------------------------------------------------------------------------
// Updates: one struct per kind of state change.

// Registers a dataset under `dataset_id`. The service computes `fingerprint`
// from the serialized definition and the compression; one fingerprint maps
// to one id. `compression` is how its jobs' elements travel (every job of
// the dataset, for its life).
struct RegisterDataset {
  std::string dataset_id;
  uint64_t fingerprint = 0;
  wire::ElementCompression compression = wire::ElementCompression::AUTO;
  friend bool operator==(const RegisterDataset&, const RegisterDataset&) = default;
};

// Registers (or re-registers) a data worker. Re-registering a known address
// replaces its transfer address and tags and keeps its tasks.
struct RegisterWorker {
  std::string address;
  std::string transfer_address;  // where consumers fetch elements; may be empty
  std::vector<std::string> tags;
  friend bool operator==(const RegisterWorker&, const RegisterWorker&) = default;
};

// Creates a job reading `dataset_id`.
struct CreateJob {
  int64_t job_id = 0;
  std::string dataset_id;
  std::string job_name;  // empty: anonymous (only its creator reads it)
  ProcessingMode processing_mode = ProcessingMode::kOff;
  int64_t num_consumers = 0;        // > 0: coordinated (round-robin) reads
  int64_t num_split_providers = 1;  // split providers in the pipeline (DYNAMIC)
  TargetWorkers target_workers = TargetWorkers::kAuto;
  bool cross_trainer_cache = false;
  friend bool operator==(const CreateJob&, const CreateJob&) = default;
};

// A consumer starts reading `job_id` under the new id `job_client_id`.
struct AcquireJobClient {
  int64_t job_client_id = 0;
  int64_t job_id = 0;
  friend bool operator==(const AcquireJobClient&, const AcquireJobClient&) = default;
};

// A consumer stops reading (or its heartbeats timed out).
struct ReleaseJobClient {
  int64_t job_client_id = 0;
  int64_t release_time_micros = 0;
  friend bool operator==(const ReleaseJobClient&, const ReleaseJobClient&) = default;
};

// Assigns a task of `job_id` to the worker at `worker_address`.
struct CreateTask {
  int64_t task_id = 0;
  int64_t job_id = 0;
  std::string worker_address;
  friend bool operator==(const CreateTask&, const CreateTask&) = default;
};

// Coordinated reads: a worker that joins a running round-robin job gets a
// pending task, which becomes active at `starting_round` once every consumer
// has agreed (see ClientHeartbeat).
struct CreatePendingTask {
  int64_t task_id = 0;
  int64_t job_id = 0;
  std::string worker_address;
  int64_t starting_round = 0;
  friend bool operator==(const CreatePendingTask&, const CreatePendingTask&) = default;
};

// A consumer of a round-robin job answers about the job's first pending
// task: it accepted the task's target round, or rejected it and proposes
// `new_target_round` (which resets the acceptances). Exactly one of the two.
struct ClientHeartbeat {
  int64_t job_client_id = 0;
  bool task_accepted = false;
  std::optional<int64_t> task_rejected_new_target_round;
  friend bool operator==(const ClientHeartbeat&, const ClientHeartbeat&) = default;
};

// The worker reports that the task reached its end of sequence.
struct FinishTask {
  int64_t task_id = 0;
  friend bool operator==(const FinishTask&, const FinishTask&) = default;
};

// Removes a task (its worker left a round-robin job); the task id is gone.
struct RemoveTask {
  int64_t task_id = 0;
  friend bool operator==(const RemoveTask&, const RemoveTask&) = default;
};

// DYNAMIC: the dispatcher leased the next split of `repetition` from
// provider `split_provider_index` to task `task_id` (finished = false), or
// the provider reached its end in that repetition (finished = true: the next
// repetition starts). On replay the counters say how many splits to skip,
// and the leases which split each task's request number gets again.
// task_id -1 (journals from before leases): handed out to no task.
struct ProduceSplit {
  int64_t job_id = 0;
  int64_t repetition = 0;
  int64_t split_provider_index = 0;
  bool finished = false;
  int64_t task_id = -1;
  friend bool operator==(const ProduceSplit&, const ProduceSplit&) = default;
};

// Moves an unfinished task to the registered worker at `worker_address`
// (its own worker stopped heartbeating). The task keeps its id, its place in
// the job (so a statically sharded task keeps its shard) and its split
// leases: the new worker rebuilds it, asks for the same splits by number,
// and skips what each consumer says it has, as after a restart. The new
// worker may already run a task of the same job.
struct ReassignTask {
  int64_t task_id = 0;
  std::string worker_address;
  friend bool operator==(const ReassignTask&, const ReassignTask&) = default;
};

// Garbage-collects a job whose consumers left: its tasks end.
struct GarbageCollectJob {
  int64_t job_id = 0;
  friend bool operator==(const GarbageCollectJob&, const GarbageCollectJob&) = default;
};

using Update =
    std::variant<RegisterDataset, RegisterWorker, CreateJob, AcquireJobClient,
                 ReleaseJobClient, CreateTask, CreatePendingTask,
                 ClientHeartbeat, FinishTask, RemoveTask, ProduceSplit,
                 GarbageCollectJob, ReassignTask>;

// "RegisterDataset", "CreateJob", ... (for logs).
std::string_view update_name(const Update& update);

// The journal record of an update: one flat Cap'n Proto message, a
// DispatcherUpdate (schemas/dispatcher_journal.capnp).
std::string encode(const Update& update);
// InvalidArgument for empty, truncated, malformed, unknown-kind,
// out-of-range (enum) or over-long input.
Result<Update> decode(std::string_view bytes);

// ---------------------------------------------------------------------------

// DispatcherState is not thread-safe; Dispatcher serializes access.
// Pointers returned by queries stay valid until the next apply().
class DispatcherState {
 public:
  struct Dataset {
    std::string dataset_id;
    uint64_t fingerprint = 0;
    wire::ElementCompression compression = wire::ElementCompression::AUTO;
  };

  struct Worker {
    std::string address;
    std::string transfer_address;
    std::vector<std::string> tags;
  };

  // DYNAMIC jobs: per split provider, the current repetition and how many
  // splits of it were handed out.
  struct SplitState {
    int64_t repetition = 0;
    int64_t splits_produced = 0;
    friend bool operator==(const SplitState&, const SplitState&) = default;
  };

  // DYNAMIC jobs: a split leased to a task: split number `split_index` (0,
  // 1, ...) of the provider in `repetition`. A task's k-th lease answers its
  // k-th getSplit, however often it is asked.
  struct Lease {
    int64_t repetition = 0;
    int64_t split_index = 0;
    friend bool operator==(const Lease&, const Lease&) = default;
  };

  // A task waiting for every consumer of a round-robin job to accept it.
  struct PendingTask {
    int64_t task_id = 0;
    int64_t target_round = 0;
    std::set<int64_t> ready_consumers;  // job client ids that accepted
    int64_t failures = 0;               // rejections so far
  };

  struct Job {
    int64_t job_id = 0;
    std::string dataset_id;
    std::string job_name;  // empty: anonymous
    ProcessingMode processing_mode = ProcessingMode::kOff;
    int64_t num_consumers = 0;
    int64_t num_split_providers = 0;
    TargetWorkers target_workers = TargetWorkers::kAuto;
    bool cross_trainer_cache = false;
    // One entry per split provider for DYNAMIC jobs, empty otherwise.
    std::vector<SplitState> split_states;
    // DYNAMIC jobs: (provider index, task id) -> the task's leases in order.
    // A task's leases go when it finishes or is removed.
    std::map<std::pair<int64_t, int64_t>, std::vector<Lease>> leases;
    std::set<int64_t> job_client_ids;  // active clients
    int64_t last_client_released_micros = -1;  // -1: no client released yet
    std::vector<int64_t> task_ids;      // active tasks, in creation order
    std::deque<PendingTask> pending_tasks;
    // All tasks finished (or the job was garbage-collected).
    bool finished = false;
    bool garbage_collected = false;

    bool is_dynamic() const { return processing_mode == ProcessingMode::kDynamic; }
    bool is_round_robin() const { return num_consumers > 0; }
    int64_t num_clients() const { return static_cast<int64_t>(job_client_ids.size()); }
  };

  struct Task {
    int64_t task_id = 0;
    int64_t job_id = 0;
    std::string worker_address;
    int64_t starting_round = 0;  // round-robin jobs: first round it serves
    bool pending = false;        // waiting in the job's pending_tasks
    bool finished = false;
  };

  DispatcherState() = default;
  DispatcherState(const DispatcherState&) = delete;
  DispatcherState& operator=(const DispatcherState&) = delete;

  // Validates `update` against the state and applies it. On error nothing
  // changed. NotFound: unknown dataset / worker / job / task / client;
  // AlreadyExists: duplicate id, fingerprint or live job name;
  // FailedPrecondition: the state forbids it (e.g. a garbage-collected job);
  // InvalidArgument: the update is malformed in itself.
  Status apply(const Update& update);

  // Datasets.
  Result<const Dataset*> dataset_from_id(std::string_view dataset_id) const;
  Result<const Dataset*> dataset_for_fingerprint(uint64_t fingerprint) const;
  // An unused numeric dataset id ("1000", "1001", ...), above every numeric
  // id registered so far.
  std::string next_available_dataset_id() const;
  std::vector<const Dataset*> list_datasets() const;  // by id

  // Workers.
  Result<const Worker*> worker_from_address(std::string_view address) const;
  std::vector<const Worker*> list_workers() const;  // by address

  // Jobs.
  Result<const Job*> job_from_id(int64_t job_id) const;
  // The latest job created with `job_name` (possibly garbage-collected: the
  // service then creates a new one under the same name).
  Result<const Job*> job_for_name(std::string_view job_name) const;
  std::vector<const Job*> list_jobs() const;  // by id
  int64_t next_available_job_id() const { return next_available_job_id_; }

  // Job clients.
  Result<const Job*> job_for_job_client_id(int64_t job_client_id) const;
  Result<std::vector<int64_t>> job_clients_for_job(int64_t job_id) const;
  Result<int64_t> num_job_clients(int64_t job_id) const;
  std::vector<int64_t> list_active_job_client_ids() const;  // ascending
  int64_t next_available_job_client_id() const { return next_available_job_client_id_; }

  // Tasks.
  Result<const Task*> task_from_id(int64_t task_id) const;
  // Active (not pending) tasks of the job, finished ones included, in
  // creation order.
  Result<std::vector<const Task*>> tasks_for_job(int64_t job_id) const;
  // Pending tasks of the job, first in line first.
  Result<std::vector<const Task*>> pending_tasks_for_job(int64_t job_id) const;
  // Unfinished tasks (pending ones included) on the worker, by task id.
  // NotFound for an unregistered worker.
  Result<std::vector<const Task*>> tasks_for_worker(std::string_view address) const;
  int64_t next_available_task_id() const { return next_available_task_id_; }

  // DYNAMIC jobs: repetition and splits produced for one split provider.
  // NotFound: unknown job; FailedPrecondition: not DYNAMIC; InvalidArgument:
  // index out of range.
  Result<SplitState> split_state(int64_t job_id, int64_t split_provider_index) const;
  // DYNAMIC jobs: the splits leased to `task_id` from one provider, in order
  // (empty when none). Errors as split_state.
  Result<const std::vector<Lease>*> leases(int64_t job_id, int64_t split_provider_index,
                                           int64_t task_id) const;

  // Jobs to garbage-collect at `now_micros` (TF's GcOldJobs): not finished,
  // not collected, no clients, and the last client left at least
  // `timeout_micros` ago. A negative timeout means never. Ascending ids.
  std::vector<int64_t> jobs_to_collect(int64_t now_micros, int64_t timeout_micros) const;

  // Every field, deterministically ordered: two states that answer every
  // query alike print alike.
  std::string debug_string() const;

 private:
  Status apply_register_dataset(const RegisterDataset& u);
  Status apply_register_worker(const RegisterWorker& u);
  Status apply_create_job(const CreateJob& u);
  Status apply_acquire_job_client(const AcquireJobClient& u);
  Status apply_release_job_client(const ReleaseJobClient& u);
  Status apply_create_task(const CreateTask& u);
  Status apply_create_pending_task(const CreatePendingTask& u);
  Status apply_client_heartbeat(const ClientHeartbeat& u);
  Status apply_finish_task(const FinishTask& u);
  Status apply_remove_task(const RemoveTask& u);
  Status apply_produce_split(const ProduceSplit& u);
  Status apply_garbage_collect_job(const GarbageCollectJob& u);
  Status apply_reassign_task(const ReassignTask& u);

  // Checks shared by CreateTask and CreatePendingTask.
  Status validate_new_task(int64_t task_id, int64_t job_id,
                           const std::string& worker_address) const;
  Job* mutable_job(int64_t job_id);
  // finished = at least one task and all tasks finished.
  void update_job_finished(Job& job);
  // Forgets the task's split leases (it will not ask for them again).
  void drop_leases(Job& job, int64_t task_id);

  // Ordered maps: deterministic listings and debug_string().
  std::map<std::string, Dataset, std::less<>> datasets_by_id_;
  std::map<uint64_t, std::string> dataset_id_by_fingerprint_;
  int64_t next_available_dataset_id_ = 1000;

  std::map<std::string, Worker, std::less<>> workers_;

  std::map<int64_t, Job> jobs_;
  std::map<std::string, int64_t, std::less<>> job_id_by_name_;  // latest per name
  int64_t next_available_job_id_ = 2000;

  std::map<int64_t, int64_t> job_id_by_client_id_;  // active clients only
  int64_t next_available_job_client_id_ = 3000;

  std::map<int64_t, Task> tasks_;  // removed tasks are erased
  // Unfinished tasks per registered worker.
  std::map<std::string, std::set<int64_t>, std::less<>> tasks_by_worker_;
  int64_t next_available_task_id_ = 4000;
};

}  // namespace capstan::data_dispatcher

#endif  // CAPSTAN_DAEMONS_DATA_DISPATCHER_DISPATCHER_STATE_H_
