// The tf.data service dispatcher's logic, apart from its transport (TF's
// DataServiceDispatcherImpl; service.cc is the GrpcDispatcherImpl-like shell
// that decodes Cap'n Proto requests, calls this class and encodes replies).
//
// Glossary:
//   dataset   a registered pipeline definition; the same bytes get the same
//             id (by fingerprint).
//   job       one reading of a dataset: anonymous (its creator only) or
//             named (shared by every consumer asking for that name).
//   task      a job's share on one data worker; consumers read tasks.
//   client    one consumer of a job (job client id), kept alive by its
//             heartbeats.
//   split     for DYNAMIC jobs, a piece of the source (range chunk, file)
//             handed to whichever worker asks next.
//
// Example:
//   CAPSTAN_ASSIGN_OR_RETURN(auto d, Dispatcher::open(config, log, clock));
//   CAPSTAN_ASSIGN_OR_RETURN(std::string id, d->register_dataset(bytes));
//   CAPSTAN_ASSIGN_OR_RETURN(JobClient c, d->get_or_create_job({id, "train"}));
//   d->worker_heartbeat("10.0.0.7:5000", {});  // -> the job's task for it
//
// Every state change goes through DispatcherState::apply. In fault-tolerant
// mode (work_dir set) it is first queued for the journal in work_dir/journal,
// and replayed by open(); dataset definitions live in work_dir/datasets, each
// durable before the journal record naming it. The journal commits in groups
// (journal/group_commit.h): a method returns once its change is applied and
// queued, and its caller answers only after
//
//   uint64_t ticket = d->journal_ticket();        // on the dispatcher thread, after the call
//   CAPSTAN_RETURN_IF_ERROR(d->wait_durable(ticket));  // on another thread
//
// so that the changes of calls made while an fsync is in flight share the
// next fsync. Every reply waits so, reads included: a reply never shows a
// change that a crash could still take back. After a failed fsync every
// change is refused and every wait fails (restart to recover). A damaged
// journal makes open() fail with kDataLoss.
//
// Dispatcher is not thread-safe, except wait_durable() and is_durable(), and
// blocks on disk I/O (definition files): DispatcherService calls it from one
// pool thread only, never from the RPC loop, and waits for durability on
// another.
#ifndef CAPSTAN_DAEMONS_DATA_DISPATCHER_DISPATCHER_H_
#define CAPSTAN_DAEMONS_DATA_DISPATCHER_DISPATCHER_H_

#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/status.h"
#include "daemons/data_dispatcher/dispatcher_state.h"
#include "io/file_system.h"
#include "journal/group_commit.h"

namespace capstan::data_dispatcher {

// Built once at start from the daemon's configuration.
struct DispatcherConfig {
  std::string work_dir;  // empty: state in memory only
  std::chrono::milliseconds job_gc_check_interval{1000};
  std::chrono::milliseconds job_gc_timeout{60000};  // negative: never collect
  std::chrono::milliseconds client_timeout{10000};
  std::chrono::milliseconds worker_timeout{10000};
  // Heartbeats per second asked for at most, workers' and consumers'
  // together (0: no limit); see Dispatcher::heartbeat_interval().
  int64_t max_heartbeats_per_s = 4000;
};

// Time as the dispatcher sees it; tests inject a fake.
class DispatcherClock {
 public:
  virtual ~DispatcherClock() = default;
  // For heartbeat timeouts (monotonic).
  virtual std::chrono::steady_clock::time_point steady_now() = 0;
  // For journaled times (job release), which must survive a restart.
  virtual int64_t wall_micros() = 0;
};

// The real clocks. Thread-safe.
class SystemDispatcherClock final : public DispatcherClock {
 public:
  std::chrono::steady_clock::time_point steady_now() override { return std::chrono::steady_clock::now(); }
  int64_t wall_micros() override;
};

struct GetOrCreateJobRequest {
  std::string dataset_id;
  std::string job_name;  // empty: anonymous
  ProcessingMode processing_mode = ProcessingMode::kOff;
  int64_t num_consumers = 0;  // > 0: coordinated reads
  bool cross_trainer_cache = false;
};

struct JobClient {
  int64_t job_id = 0;
  int64_t job_client_id = 0;
};

// A task as a consumer sees it.
struct TaskInfo {
  int64_t task_id = 0;
  int64_t job_id = 0;
  std::string worker_address;
  std::string dataset_id;
  // The task's worker stopped heartbeating and no live worker could take
  // the task: it waits for one (the next worker to heartbeat gets it).
  bool waiting_for_worker = false;
};

struct ClientHeartbeatResponse {
  std::vector<TaskInfo> tasks;  // active tasks of the client's job; empty when unchanged
  bool job_finished = false;
  // Of the job's task list as `tasks` would list it (never 0); `unchanged`:
  // it equals the fingerprint the client said it knows, and `tasks` is empty.
  uint64_t tasks_fingerprint = 0;
  bool unchanged = false;
  std::chrono::milliseconds interval{0};  // heartbeat_interval()
};

// What a data worker needs to run a task: the definition already sharded
// for its worker index (static sharding).
struct TaskDef {
  int64_t task_id = 0;
  int64_t job_id = 0;
  std::string dataset_id;
  std::string definition;
  ProcessingMode processing_mode = ProcessingMode::kOff;
  int64_t num_consumers = 0;
  int64_t num_workers = 0;
  int64_t worker_index = 0;
  bool cross_trainer_cache = false;
  int64_t cross_trainer_cache_bytes = 0;
  int64_t num_split_providers = 0;  // DYNAMIC: one per source
  wire::ElementCompression compression = wire::ElementCompression::AUTO;  // the dataset's
};

struct WorkerHeartbeatResponse {
  std::vector<TaskDef> new_tasks;         // tasks the worker does not run yet
  std::vector<int64_t> tasks_to_delete;   // tasks it runs that are gone
  std::chrono::milliseconds interval{0};  // heartbeat_interval()
};

struct SplitResponse {
  std::optional<Element> split;  // absent at the end of the splits
  bool end_of_splits = false;
};

struct DatasetInfo {
  std::string dataset_id;
  uint64_t fingerprint = 0;
  uint64_t bytes = 0;
  wire::ElementCompression compression = wire::ElementCompression::AUTO;
};

struct JobInfo {
  int64_t job_id = 0;
  std::string job_name;
  std::string dataset_id;
  ProcessingMode processing_mode = ProcessingMode::kOff;
  int64_t num_clients = 0;
  int64_t num_tasks = 0;
  bool finished = false;
};

struct WorkerInfo {
  std::string address;
  int64_t num_tasks = 0;
  double last_heartbeat_seconds_ago = -1.0;  // -1: none since the start
};

class Dispatcher {
 public:
  // Bytes of the cross-trainer cache each task gets.
  static constexpr int64_t kCrossTrainerCacheBytes = int64_t{256} << 20;

  // Starts a dispatcher; in fault-tolerant mode replays the journal first.
  // `log` may be null. `clock` and `fs` (where work_dir lives) must outlive
  // the dispatcher.
  // kDataLoss: damaged journal or a missing dataset definition;
  // kFailedPrecondition: work_dir unusable or its journal open elsewhere.
  static Result<std::unique_ptr<Dispatcher>> open(DispatcherConfig config, std::shared_ptr<spdlog::logger> log,
                                                  DispatcherClock& clock,
                                                  io::FileSystem& fs = io::local_file_system());

  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // ---- Datasets. The same definition bytes with the same compression get
  // the same id; with another compression, another id (the compression is
  // the dataset's, journaled with it).
  // InvalidArgument: not a valid serialized dataset, or a compression
  // parse_compression (data/compression.h) refuses.
  Result<std::string> register_dataset(const std::string& definition, const std::string& compression = "AUTO");
  // NotFound: unknown id.
  Result<std::string> dataset_definition(const std::string& dataset_id) const;

  // ---- Jobs and clients.
  // Gets the live job named `job_name` (creating it if none) or creates an
  // anonymous one, and a new client of it. InvalidArgument: a live job of
  // that name has other parameters, negative num_consumers, or a
  // cross-trainer cache without a name; FailedPrecondition: coordinated
  // reads on a finite dataset, static sharding without (enough) workers or
  // files; NotFound: unknown dataset.
  Result<JobClient> get_or_create_job(const GetOrCreateJobRequest& request);
  Status release_job_client(int64_t job_client_id);
  // NotFound: unknown (or released) client. `known_tasks`: the fingerprint
  // of the list the client has (0: none); when it is current, the reply
  // says so instead of listing the tasks again.
  Result<ClientHeartbeatResponse> client_heartbeat(int64_t job_client_id, uint64_t known_tasks = 0);

  // ---- Workers and tasks.
  // Registers an unknown worker (it joins the running OFF and DYNAMIC jobs),
  // and tells it which tasks to start and which to drop.
  Result<WorkerHeartbeatResponse> worker_heartbeat(const std::string& worker_address,
                                                   const std::vector<int64_t>& current_tasks);
  // The longest interval between heartbeats the dispatcher asks of each
  // data worker and consumer, so that all of them together send at most
  // about max_heartbeats_per_s: (live workers + consumers) /
  // max_heartbeats_per_s, capped at a quarter of worker_timeout and of
  // client_timeout (a sender that follows it is never taken for gone).
  // Senders keep their own interval when it is longer; a small cluster gets
  // a value below theirs. 0 when max_heartbeats_per_s is 0 (no limit).
  std::chrono::milliseconds heartbeat_interval() const;
  Status finish_task(int64_t task_id);
  // DYNAMIC jobs: split number `sequence` of task `task_id` from one
  // provider. The first request for a number leases the job's next split of
  // `repetition` to the task, journaled before it is returned; asking for
  // the same number again, before or after a restart of the dispatcher, gets
  // the same split, and no other task ever gets it. NotFound: unknown job or
  // task; InvalidArgument: the task is another job's, or `sequence` skips
  // ahead; DataLoss: the dataset no longer has a leased split.
  Result<SplitResponse> get_split(int64_t job_id, int64_t repetition, int64_t split_provider_index,
                                  int64_t task_id, int64_t sequence);

  // ---- Listing (capstanctl data ...).
  std::vector<DatasetInfo> list_datasets() const;
  std::vector<JobInfo> list_jobs() const;
  std::vector<WorkerInfo> list_workers();

  // Releases clients whose heartbeats stopped, moves the tasks of workers
  // whose heartbeats stopped (reassign_lost_tasks) and garbage-collects jobs
  // their consumers left (run every job_gc_check_interval).
  void collect();

  // A worker silent for longer than worker_timeout is lost: each of its
  // unfinished tasks moves to the live worker with the fewest tasks
  // (ReassignTask), which rebuilds it from its split leases and skips what
  // its consumers have, so nothing is lost or repeated. With no live worker
  // the tasks wait, and the first worker to heartbeat takes them. A lost
  // worker that heartbeats again is live again and joins the running
  // DYNAMIC jobs (not OFF ones: their copy of the data moved on without it).
  Status reassign_lost_tasks();
  // Tasks moved off lost workers since the start; tasks waiting for a live
  // worker now.
  int64_t tasks_reassigned() const { return tasks_reassigned_; }
  int64_t tasks_waiting_for_worker() const { return static_cast<int64_t>(waiting_tasks_.size()); }

  // ---- Durability (see the top of this file).
  // The ticket of the last change queued for the journal (0 in memory only).
  uint64_t journal_ticket() const { return journal_ ? journal_->last_ticket() : 0; }
  // Thread-safe. Blocks until the changes up to `ticket` are durable; the
  // journal's failure when they cannot be. OK at once in memory only.
  [[nodiscard]] Status wait_durable(uint64_t ticket) { return journal_ ? journal_->wait_durable(ticket) : Status::Ok(); }
  // Thread-safe. Whether wait_durable(ticket) would return OK at once.
  bool is_durable(uint64_t ticket) const { return !journal_ || journal_->is_durable(ticket); }

  const DispatcherConfig& config() const { return config_; }
  const DispatcherState& state() const { return state_; }

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;
  // A split provider of one job, at split `position` of `repetition`.
  struct Splits {
    int64_t repetition = -1;
    int64_t position = 0;
    std::unique_ptr<data::SplitProvider> provider;
  };

  Dispatcher(DispatcherConfig config, std::shared_ptr<spdlog::logger> log, DispatcherClock& clock,
             io::FileSystem& fs);

  Status replay();
  // Queues for the journal (in fault-tolerant mode) and applies one update.
  Status apply(const Update& update);
  Result<data::Dataset> dataset(const std::string& dataset_id) const;
  // Creates the tasks `job_id` lacks on the live workers.
  Status create_tasks(int64_t job_id);
  Result<TaskDef> task_def(const DispatcherState::Task& task) const;
  // Heard from within worker_timeout.
  bool alive(const std::string& address, SteadyTime now) const;
  // Split `split_index` of `repetition` from provider `index`, moving
  // `cursor` forward (or starting it over when it is past that split).
  Result<std::optional<Element>> split_at(const DispatcherState::Job& job, int64_t index, int64_t repetition,
                                          int64_t split_index, Splits& cursor);

  const DispatcherConfig config_;
  const std::shared_ptr<spdlog::logger> log_;  // may be null
  DispatcherClock& clock_;
  io::FileSystem& fs_;
  // Null in memory only. Thread-safe: wait_durable() uses it from any thread.
  std::unique_ptr<journal::GroupCommitter> journal_;

  DispatcherState state_;
  std::map<std::string, std::string> definitions_;   // dataset id -> serialized definition
  std::map<std::string, SteadyTime> worker_seen_;
  std::set<std::string> lost_workers_;  // silent past worker_timeout (logged once)
  std::set<int64_t> waiting_tasks_;     // on a lost worker, no live one to take them
  int64_t tasks_reassigned_ = 0;
  std::map<int64_t, SteadyTime> client_seen_;
  std::map<std::pair<int64_t, int64_t>, Splits> splits_;  // (job, provider index) -> the next split
  // (job, provider index, task) -> where a task asking for its leased splits
  // again has got to (dropped once it caught up).
  std::map<std::tuple<int64_t, int64_t, int64_t>, Splits> replays_;
};

}  // namespace capstan::data_dispatcher

#endif  // CAPSTAN_DAEMONS_DATA_DISPATCHER_DISPATCHER_H_
