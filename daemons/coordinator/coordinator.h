// The coordinator (TensorFlow's ClusterCoordinator, as a daemon), apart from
// its transport. CoordinatorService (service.h) adapts it to Cap'n Proto;
// remote_peers.h reaches the other daemons for it.
//
// Glossary:
//   worker     a worker-server that registered; the coordinator runs
//              closures through its WorkerPeer.
//   lane       one closure in flight on a worker; each worker gets
//              `closures_per_worker` lanes that take closures from the queue.
//   attempt    1 for a closure's first run, +1 each time it runs again
//              because the run before was lost (its worker failed).
//   placement  where each shard of each variable lives (ps task, rows); its
//              version goes up with every variable created.
//
// Coordinator is a facade: it checks each call, makes it wait where it must
// (for a parameter server), and forwards it to the part that does the work,
// each with its own header and unit tests:
//   Workers            who is registered; dropping one (workers.h)
//   ClosureQueue       TF's closure semantics (closure_queue.h)
//   ClosureLanes       closures from the queue to the workers (closure_lanes.h)
//   PsVariables        the variables on the parameter servers (ps_variables.h)
//   PsHealth           the parameter servers' states (ps_health.h)
//   PsRecovery         watching them; recovering one that comes back empty
//                      (ps_recovery.h)
//   Strategies         synchronous training (strategies.h)
//   ModelCheckpoints   saving and restoring the model (model_checkpoints.h)
//   CheckpointPolicy   the coordinator's own saves; the last checkpoint
//                      (checkpoint_policy.h)
//   CoordinatorJournal what survives a restart (coordinator_journal.h)
//   PerWorkerDatasets, ClientTable, ReportedScalars, DispatchGate, ChangeSignal
//
// A worker whose link breaks, or that stops answering pings, is dropped: its
// running closures go back to the queue (ClosureQueue::worker_failed).
//
// Parameter servers (ps_recovery.h): dispatch pauses while one is
// unreachable. With a checkpoint to recover from, join/fetch/schedule wait
// through the outage (up to ps_recovery_timeout), and one that comes back
// empty is restored from it. Without, calls fail with Unavailable naming it
// until it is back, and with DataLoss once it came back empty until a
// checkpoint is restored by hand. One not reached yet since the start (or a
// restart from the journal) is waited for, up to kFirstContactWindow.
//
// Example (a test's view):
//   Coordinator c(config, parameter_servers, timer, pool, log);
//   c.register_worker(0, {"train_step"}, std::make_unique<MyWorker>()).wait(ws);
//   int64_t id = c.schedule("train_step", args_bytes).value();
//   c.join().wait(ws);                      // OK once the worker answered
//   c.fetch(id).wait(ws);                   // the value's bytes
//
// Not thread-safe: every method runs on the thread of the KJ event loop that
// `timer` and the peers belong to.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_COORDINATOR_H_
#define CAPSTAN_DAEMONS_COORDINATOR_COORDINATOR_H_

#include <boost/asio/thread_pool.hpp>
#include <kj/async.h>
#include <kj/timer.h>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "capstan/status.h"
#include "capstan/tensor.h"
#include "daemons/coordinator/checkpoint_policy.h"
#include "daemons/coordinator/client_table.h"
#include "daemons/coordinator/closure_lanes.h"
#include "daemons/coordinator/closure_queue.h"
#include "daemons/coordinator/config.h"
#include "daemons/coordinator/coordinator_journal.h"
#include "daemons/coordinator/dispatch_gate.h"
#include "daemons/coordinator/loop_context.h"
#include "daemons/coordinator/model_checkpoints.h"
#include "daemons/coordinator/peers.h"
#include "daemons/coordinator/per_worker_datasets.h"
#include "daemons/coordinator/ps_health.h"
#include "daemons/coordinator/ps_recovery.h"
#include "daemons/coordinator/ps_variables.h"
#include "daemons/coordinator/reported_scalars.h"
#include "daemons/coordinator/requests.h"
#include "daemons/coordinator/stats.h"
#include "daemons/coordinator/strategies.h"
#include "daemons/coordinator/workers.h"

namespace capstan::coordinator {

class Coordinator final : private kj::TaskSet::ErrorHandler {
 public:
  // `parameter_servers` and `pool` (checkpoint I/O) must outlive this.
  Coordinator(CoordinatorConfig config, ParameterServers& parameter_servers, kj::Timer& timer,
              boost::asio::thread_pool& pool, std::shared_ptr<spdlog::logger> log);
  ~Coordinator();

  // With config.work_dir: replays its journal (a restarted coordinator
  // knows its variables, their placement, the per-worker datasets and the
  // checkpoint to recover from again) and keeps it open for what changes
  // next. DataLoss for a damaged journal, FailedPrecondition when another
  // coordinator has it open. Call once, before serving.
  Status open_journal();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // How long calls that need the parameter servers wait for one not reached
  // yet since this coordinator started (see the header comment).
  static constexpr std::chrono::milliseconds kFirstContactWindow{10000};

  // ---- Workers
  // A worker joins with the functions its modules have (closures, and
  // dataset functions as "dataset:<fn>"). Resolves to its id once it has
  // been sent every per-worker dataset; then its lanes start. A negative
  // `task_index` (a worker started without one) gets the lowest index no
  // registered worker has: TF needs every worker's index, Capstan need not.
  kj::Promise<int64_t> register_worker(int task_index, std::set<std::string> functions,
                                       std::unique_ptr<WorkerPeer> peer);
  // The task index of registered worker `worker_id` (given or assigned); -1
  // if it is not registered.
  int worker_task_index(int64_t worker_id) const;
  // Whether `worker_id` is still counted (a dropped worker registers again).
  bool worker_alive(int64_t worker_id) const;
  // Preemption (TF's PreemptionCheckpointHandler, without its limits): the
  // worker gets no more closures or steps; resolves once the closures it
  // runs have finished (their results kept), a checkpoint was saved when
  // checkpoint_dir is set and checkpoint_on_preemption holds, and the worker
  // is no longer counted. NotFound for an unknown id.
  kj::Promise<Status> leave_worker(int64_t worker_id, std::string reason);
  // The coordinator's own SIGTERM: no more dispatch; resolves once every
  // running closure and step has finished and, as above, a checkpoint was
  // saved. Closures still queued are not run here: with work_dir they are
  // journaled and run once the coordinator restarts with it; without, they
  // are lost with this process.
  kj::Promise<void> drain(std::string reason);
  int num_workers() const { return static_cast<int>(workers_.size()); }
  // Every function the registered workers have (union).
  std::set<std::string> closure_names() const;

  // ---- Variables
  // Creates the variable's shards on the parameter servers. A variable that
  // exists with the same dtype and shape is handed back as it is (a
  // reconnecting program); AlreadyExists when they differ. InvalidArgument
  // for a request that gives its value twice or not at all (initial,
  // initializer, value_from_program), a bad dtype or shape, or a bad
  // initializer (naming the value); the coordinator never holds the value
  // of a variable made by an initializer or value_from_program.
  kj::Promise<Result<VariableLocation>> create_variable(VariableRequest request);
  // Whether variable `name` waits for the program to write its value
  // (created with value_from_program; see PsVariables::written).
  bool awaiting_value(const std::string& name) const { return variables_.awaiting_value(name); }
  // The program wrote the value of `name`; NotFound for an unknown variable.
  Status variable_written(const std::string& name) { return variables_.written(name); }
  // Creates an embedding table: one shard on every parameter server. One
  // that exists with the same spec is handed back; AlreadyExists when it
  // differs or a variable has the name.
  kj::Promise<Result<VariableLocation>> create_table(EmbeddingTableSpec spec);
  // Writes the rows of table `name` changed since checkpoint `since` (a
  // ckpt-N path, or a directory: its latest; empty: every row) to the
  // safetensors file `path` ("keys" int64[n], "values" [n, dim], "meta"
  // int64[n, 4]); the number of rows. For online serving: apply it on top
  // of the checkpoint's rows.
  kj::Promise<Result<int64_t>> export_table(std::string name, std::string since, std::string path);
  Placements placements() const;

  // ---- Closures (TF semantics; see closure_queue.h)
  // `args` is a serialized Element, passed to the worker as it is.
  // (client_id, request_seq), client_id non-zero, names the request: a
  // retry of one seen before returns the same id and queues nothing.
  Result<int64_t> schedule(const std::string& function, std::string args, uint64_t client_id = 0,
                           int64_t request_seq = 0);
  // With work_dir: resolves once every closure change so far (schedules,
  // results, errors raised, releases) is in the journal, fsynced, or to
  // the journal's failure. Without: at once.
  kj::Promise<Status> journal_synced();
  bool durable() const { return journal_.durable(); }
  // Resolves once fewer than max_queued_closures closures are queued (at
  // once when so). The service answers a schedule after it.
  kj::Promise<void> queue_room();

  // Totals and levels for /metrics (stats.h).
  using Stats = CoordinatorStats;
  std::shared_ptr<const Stats> stats() const { return stats_; }
  // Each worker's phase totals and straggler score (worker_times.h).
  std::shared_ptr<WorkerTimes> worker_times() const { return times_; }

  // ---- The status page (loop thread, as everything here)
  // A program's training figure (ClusterCoordinator::report_scalar): the
  // last kReportedPoints of at most kReportedTags tags are kept.
  // InvalidArgument for an empty tag or one over 128 bytes, a value that is
  // not finite; ResourceExhausted for a new tag beyond kReportedTags.
  static constexpr size_t kReportedPoints = ReportedScalars::kPoints;
  static constexpr size_t kReportedTags = ReportedScalars::kTags;
  using ReportedPoint = ReportedScalars::Point;
  using ReportedScalar = ReportedScalars::Scalar;
  Status report_scalar(const std::string& tag, double value, int64_t step, double unix_seconds) {
    return reported_.add({{tag, value, step}}, unix_seconds);
  }
  // All of them or, with any refused (as report_scalar would), none.
  Status report_scalars(const std::vector<ReportedScalar>& scalars, double unix_seconds) {
    return reported_.add(scalars, unix_seconds);
  }
  const std::map<std::string, std::deque<ReportedPoint>>& reported() const { return reported_.points(); }
  // Members and state for the page (requests.h).
  using Overview = CoordinatorOverview;
  Overview overview() const;
  void update_stats();  // the levels, from the queue and the workers
  // OK once nothing is queued or running; the pending error, or
  // Unavailable while a parameter server is unreachable.
  kj::Promise<Status> join();
  Result<bool> done();
  // The value's bytes once the closure finished (with work_dir: and its end
  // is journaled, so that a restart never runs again a closure whose value
  // the program has), or its error; NotFound saying so for a released one.
  kj::Promise<Result<std::string>> fetch(int64_t closure_id);
  // The program will not fetch these closures again: their values go (those
  // still queued or running go when they finish), journaled. Releasing one
  // twice is fine (a retried call). InvalidArgument, releasing none, for
  // more than kMaxReleasePerCall ids or an id never handed out.
  // `client_id` (non-zero) counts as heard from (see client_grace), so an
  // empty list is a heartbeat.
  // `incarnation` (non-zero): the incarnation() the program had the ids
  // from; ids from another one are ignored (OK).
  Status release(const std::vector<int64_t>& closure_ids, uint64_t client_id = 0, uint64_t incarnation = 0);
  // Random and non-zero for a coordinator without a journal, whose closure
  // ids start again at 1 when it restarts (a program's releases of ids of
  // the one before would hit other closures); 0 with a journal, whose ids
  // outlive a restart.
  uint64_t incarnation() const { return journal_.durable() ? 0 : incarnation_; }
  static constexpr size_t kMaxReleasePerCall = 1 << 16;
  // How often a live SDK client calls the coordinator at least (a
  // heartbeat); client_grace must be well above it.
  static constexpr std::chrono::milliseconds kClientHeartbeat{5000};
  // Releases the results of every client not heard from for client_grace
  // (also run by a timer every client_grace / 4, at most every 10 s).
  void expire_clients();

  // ---- Per-worker datasets. Resolves to the dataset's id once every
  // worker registered now has been sent it (a worker that fails to build it
  // is logged); each worker that registers later gets it too. A non-empty
  // `name` hands back the dataset of that name when it exists with the same
  // definition (a program that restarted: its iterators keep their
  // positions); AlreadyExists when the definition differs.
  kj::Promise<Result<int64_t>> create_per_worker_dataset(std::string definition, std::string name = "");
  kj::Promise<Result<int64_t>> create_per_worker_dataset_from_function(std::string function, std::string name = "");

  // ---- Checkpoints (see checkpointing.h)
  kj::Promise<Result<std::string>> save_checkpoint(std::string directory, int64_t step, int max_to_keep);
  // TF's default: the variables the checkpoint has are restored, the others
  // (created since) keep their values and are listed; `strict` refuses them.
  using Restored = RestoredCheckpoint;
  kj::Promise<Result<Restored>> restore_checkpoint(std::string path, bool strict = false);
  // The checkpoint a lost parameter server would be restored from: the last
  // one saved or restored here, else "" (checkpoint_dir's newest is looked
  // up when needed).
  const std::string& last_checkpoint() const { return policy_.last(); }
  // Parameter servers restored from a checkpoint after coming back empty.
  int64_t ps_recoveries() const { return recovery_.recoveries(); }

  // ---- Synchronous training: TF's MultiWorkerMirroredStrategy with the
  // worker-servers as replicas (strategies.h). The group is (re-)formed at a
  // step boundary when the workers changed or the last step failed.
  // Creates a strategy (the values are held here until the first group forms and
  // takes them), or hands back the one of that name with the same
  // variables (a reconnecting program); AlreadyExists when they differ or
  // a parameter-server variable has one of the names.
  Status create_strategy(const std::string& name, std::vector<MirroredVariableInit> variables, StrategyConfig config);
  // One synchronous step. Unavailable naming the workers lost when a member
  // died or stopped answering (the next step goes on with the others); the
  // closure's own error when one failed; steps of one strategy run one at
  // a time (a second caller waits).
  kj::Promise<Result<StepOutcome>> run_step(std::string strategy, std::string function, std::string args);
  // Gives a strategy its step input (exactly-once input for its steps):
  // `definition`, a finite dataset of examples, becomes the per-worker
  // dataset "step-input/<strategy>" (every worker holds all of it), and
  // each step hands each replica its share of the step's batch
  // (Strategies::set_input). Its id, which the closures' argument names.
  kj::Promise<Result<int64_t>> distribute_step_input(std::string strategy, std::string definition,
                                                     StepInputConfig config);
  // Replica 0's value of a mirrored variable, and the optimizer step.
  kj::Promise<Result<std::pair<Tensor, int64_t>>> read_mirrored(std::string strategy, std::string variable);
  kj::Promise<Result<StrategyStatus>> strategy_status(std::string strategy);

 private:
  void taskFailed(kj::Exception&& exception) override;

  // While a parameter server not reached yet is waited for: until when.
  std::optional<kj::TimePoint> first_contact_deadline() const {
    return ps_health_.first_contact_deadline(timer_.now());
  }
  // durable.cc: a replayed journal record, applied to the part it concerns;
  // the state as records (a compacted journal).
  Status apply_journal_record(const std::string& record);
  std::vector<std::string> snapshot_records() const;
  // queue_.take_error(), journaled when it raises one.
  Status take_closure_error();
  // ClosureLanes' hook: the queue ended closure `id` (the journal, the
  // stats and the checkpoint policy hear of it).
  void closure_ended(int64_t id, ClosureQueue::State state, const Status& error);
  // ModelCheckpoints' pause: no closure or step starts until the guard goes;
  // resolves once none runs.
  kj::Promise<std::shared_ptr<void>> pause_dispatch();
  kj::Promise<Result<std::string>> wait_for_value(int64_t id);
  // `client_id` made a call now (0: nobody).
  void client_seen(uint64_t client_id);
  kj::Promise<void> client_expiry_timer();
  // Records (and journals) that `id` was released.
  void released(int64_t id);

  const CoordinatorConfig config_;
  ParameterServers& ps_;
  kj::Timer& timer_;
  boost::asio::thread_pool& pool_;
  const std::shared_ptr<spdlog::logger> log_;
  const uint64_t incarnation_;
  std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
  // Where the workers' time goes; their straggler scores (shared with the
  // status page and /metrics).
  std::shared_ptr<WorkerTimes> times_ = std::make_shared<WorkerTimes>(log_);

  // The parts (see the header comment), each given what it uses of those
  // before it. Waiters wake at changes_.notify(), after update_stats().
  ChangeSignal changes_;
  const LoopContext loop_;  // the above and tasks_, as the parts share them
  DispatchGate gate_;       // closed by drain() and pause_dispatch()
  CoordinatorJournal journal_;  // closed without work_dir
  ClosureQueue queue_;
  ReportedScalars reported_;
  Workers workers_;
  PsHealth ps_health_;
  PsVariables variables_;
  ClosureLanes lanes_;
  Strategies strategies_;
  CheckpointPolicy policy_;
  PsRecovery recovery_;
  ClientTable clients_;  // schedule retries; clients silent for client_grace
  PerWorkerDatasets datasets_;
  ModelCheckpoints checkpoints_;
  kj::TaskSet tasks_;  // last: its promises use everything above
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_COORDINATOR_H_
