// The worker-server's core: runs closures and owns per-worker iterators,
// knowing nothing of the transport.
//
// Glossary:
//   closure          a function of the loaded modules, run with a
//                    ClosureContext (TF: a tf.function scheduled by the
//                    ClusterCoordinator onto this worker)
//   per-worker       an iterator this worker builds for a per-worker dataset
//   iterator         the coordinator names by id; a closure reaches it with
//                    ctx.iterator(PerWorkerDataset::arg())
//
// Example (what the Cap'n Proto service does):
//   Worker worker(functions, variables, /*task_index=*/0);
//   worker.create_dataset(1, Dataset::range(10).serialize());
//   auto result = worker.run_closure({"train_step", args, /*placement_version=*/3,
//                                     /*attempt=*/1, /*num_workers=*/2});
//
// Thread-safety: thread-safe. run_closure() runs the closure on the calling
// thread; several may run at once and share an iterator (its get_next is
// serialized). create_dataset*() build the iterator on the calling thread.
#ifndef CAPSTAN_DAEMONS_WORKER_SERVER_WORKER_H_
#define CAPSTAN_DAEMONS_WORKER_SERVER_WORKER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/functions.h"
#include "capstan/phases.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "daemons/worker_server/replicas.h"
#include "data/step_input.h"
#include "sync/mutex.h"
#include "training/variable_router.h"

namespace capstan::worker_server {

struct RunClosureRequest {
  std::string function;
  Element args;
  int64_t placement_version = 0;  // refresh placements older than this first
  int attempt = 1;                 // 1 for a closure's first run
  int num_workers = 1;             // registered workers at dispatch
  // This worker's task index as the coordinator knows it; -1: unknown (the
  // worker's own then). It reaches the worker with the closure, so a closure
  // dispatched before the registration reply is read sees the right one.
  int worker_index = -1;
  int64_t closure_id = 0;          // the coordinator's id; 0: cannot be cancelled
  // A synchronous step: the strategy whose replica it runs on, and the
  // epoch of the group it runs in (Replicas). Empty: a plain closure.
  std::string strategy = "";
  int64_t epoch = 0;
  // When the coordinator gives up on the run; max(): never.
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  // A synchronous step's share of its strategy's step input: the closure's
  // ctx.iterator() of that dataset yields the batch of these positions,
  // once (StepInputElements).
  std::optional<training::StepInput> step_input = std::nullopt;
};

// What a run of a closure did besides its result.
struct RunInfo {
  bool took_step_input = false;  // the closure read its step input
  PhaseTimes phases;             // where its time went (queued: 0)
};

class Worker {
 public:
  // `functions`, `variables` and `replicas` must outlive the Worker;
  // without `replicas`, synchronous steps fail with FailedPrecondition.
  Worker(const FunctionRegistry& functions, VariableAccess& variables, int task_index,
         Replicas* replicas = nullptr);
  ~Worker();

  // The names this worker reports when it registers: its closures and, as
  // "dataset:<name>", its per-worker dataset functions.
  std::vector<std::string> function_names() const;

  // NotFound naming the closure when no module registered it.
  Status check_closure(const std::string& function) const;
  // Runs the closure; its error comes back with the closure's name.
  // Cancelled when cancel_closure() named it before it returned.
  // *info (when given): whether it read its step input, and where its time
  // went (capstan/phases.h: the iterators, the parameter servers, the
  // collectives), set on every return.
  Result<Element> run_closure(const RunClosureRequest& request, RunInfo* info = nullptr);
  // Runs a batch (the coordinator's runClosures) one after another on the
  // calling thread; an outcome per request, in order. A request that is an
  // error (it could not be read) is that run's outcome. After a run fails,
  // the runs after it are not started: ABORTED, naming the failure.
  // *infos (when given): each run's RunInfo, in order.
  std::vector<Result<Element>> run_closures(const std::vector<Result<RunClosureRequest>>& requests,
                                            std::vector<RunInfo>* infos = nullptr);
  // Cancels closure `closure_id`, running or about to run (the cancel may
  // arrive first: the last kRememberedCancels such ids are kept).
  void cancel_closure(int64_t closure_id);
  static constexpr size_t kRememberedCancels = 4096;

  // Builds the iterator of per-worker dataset `id` from a serialized
  // definition (SHARD_HINT already resolved), replacing an earlier one; but
  // an iterator built for the same non-zero `uid` (the same dataset, sent
  // again by a restarted coordinator) is kept where it is.
  Status create_dataset(int64_t id, const std::string& definition, uint64_t uid = 0);
  // The same from a dataset function of the modules, called with TF's
  // InputContext. NotFound for an unknown function.
  Status create_dataset_from_function(int64_t id, const std::string& function, InputContext input,
                                      uint64_t uid = 0);
  // Forgets every iterator.
  void clear_datasets();
  // The most a step input's elements may take in memory (StepInputElements).
  void set_step_input_budget(int64_t bytes) { step_input_budget_.store(bytes); }
  // Registering again: the datasets the coordinator does not send again
  // before drop_stale_datasets() are forgotten then; those it sends again
  // with their uid keep their iterators.
  void mark_datasets_stale();
  void drop_stale_datasets();

  // The position of per-worker dataset `id`'s iterator (data::Iterator::
  // save), for a model checkpoint. NotFound when this worker has no such
  // dataset.
  Result<std::string> save_iterator(int64_t id);
  // Replaces that iterator with a new one of the same dataset restored to
  // `state` (a checkpoint's). InvalidArgument for a state of another
  // dataset; the old iterator then stays.
  Status restore_iterator(int64_t id, const std::string& state);

  // The task index closures see (ClosureContext::worker_index): the one the
  // worker was started with, else the one the coordinator assigned.
  int task_index() const { return task_index_.load(); }
  void set_task_index(int index) { task_index_.store(index); }

 private:
  class Context;
  using IteratorMaker = std::function<Result<std::unique_ptr<data::Iterator>>()>;
  // Builds the iterator with `make` and keeps `make` for restore_iterator().
  Status install(int64_t id, IteratorMaker make);
  // Whether the iterator of `id` was built for `uid` (non-zero) and stays;
  // else records `uid` for the one about to be built.
  bool keep(int64_t id, uint64_t uid);
  // Remembers how building dataset `id` ended; returns `status`.
  Status record(int64_t id, Status status);
  Result<data::Iterator*> iterator(const Tensor& arg);
  // The elements of step input `id`, read from its iterator the first time.
  Result<std::shared_ptr<const data::StepInputElements>> step_input_elements(int64_t id);
  // Runs `fn` for `request`, with the step input's weight on the replica's
  // gradients; moves the replica's input position when the step took its
  // input (the closure succeeded, or its variables took the update).
  // run_closure() inside its span (the flight recorder, a trace).
  Result<Element> run_closure_timed(const RunClosureRequest& request, RunInfo* info);
  Result<Element> run_step_closure(const ClosureFunction& fn, const RunClosureRequest& request, Context& context,
                                   Replicas::Lease& replica);

  const FunctionRegistry& functions_;
  VariableAccess& variables_;
  Replicas* const replicas_;
  std::atomic<int> task_index_;

  Mutex mutex_;
  std::map<int64_t, std::shared_ptr<data::Iterator>> iterators_ GUARDED_BY(mutex_);
  std::map<int64_t, IteratorMaker> makers_ GUARDED_BY(mutex_);  // of the built iterators
  // Why building a per-worker dataset failed, for the closure that asks for
  // its iterator.
  std::map<int64_t, Status> failures_ GUARDED_BY(mutex_);
  std::map<int64_t, uint64_t> uids_ GUARDED_BY(mutex_);  // of the built iterators
  std::set<int64_t> stale_ GUARDED_BY(mutex_);
  // Step inputs' elements, by dataset id; dropped with their iterator.
  std::map<int64_t, std::shared_ptr<const data::StepInputElements>> step_inputs_ GUARDED_BY(mutex_);
  Mutex step_input_read_mutex_;  // one read of a step input's elements at a time
  std::atomic<int64_t> step_input_budget_{int64_t{4} << 30};
  // Running closures' cancel flags, by closure id.
  std::map<int64_t, std::shared_ptr<std::atomic<bool>>> running_ GUARDED_BY(mutex_);
  // Cancels that arrived before their run, oldest first.
  std::deque<int64_t> early_cancels_ GUARDED_BY(mutex_);
};

}  // namespace capstan::worker_server

#endif  // CAPSTAN_DAEMONS_WORKER_SERVER_WORKER_H_
