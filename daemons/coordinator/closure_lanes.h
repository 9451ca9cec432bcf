// ClosureLanes: closures from the queue to the workers (TF's closure
// dispatch). Each registered worker gets config.closures_per_worker lanes. A
// lane takes the next closure (several, as one call, when the queue is deep
// and closure_batch allows), runs it on its worker, records the outcome in
// the queue and takes the next; with nothing queued, or while the gate is
// paused or a parameter server is not up, it waits for a change. A lane
// ends when its worker is dropped or leaves, or the coordinator drains.
//
// Outcomes:
//   value or error   recorded by ClosureQueue::complete (an Unavailable or
//                    Aborted error re-queues the closure: the run was lost);
//   worker lost      the worker is dropped: its running closures go back to
//                    the front of the queue (Workers::drop);
//   PS outage        a run that failed while a parameter server was lost or
//                    restored (PsHealth's generation moved) was lost, not
//                    failed: it runs again;
//   closure_timeout  a run past it fails with DeadlineExceeded and its worker
//                    is told to stop it.
// The runs the queue cancels (its pending error) are cancelled on their
// workers. Each worker is also pinged every worker_ping_interval: one that
// does not answer within worker_ping_timeout is dropped.
//
// Example:
//   ClosureLanes lanes(config, queue, workers, health, variables, gate, loop, hooks);
//   lanes.start(worker_id);   // once the worker has its per-worker datasets
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_CLOSURE_LANES_H_
#define CAPSTAN_DAEMONS_COORDINATOR_CLOSURE_LANES_H_

#include <kj/async.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "capstan/status.h"
#include "daemons/coordinator/closure_queue.h"
#include "daemons/coordinator/config.h"
#include "daemons/coordinator/dispatch_gate.h"
#include "daemons/coordinator/loop_context.h"
#include "daemons/coordinator/peers.h"
#include "daemons/coordinator/ps_health.h"
#include "daemons/coordinator/ps_variables.h"
#include "daemons/coordinator/worker_times.h"
#include "daemons/coordinator/workers.h"

namespace capstan::coordinator {

class ClosureLanes {
 public:
  struct Hooks {
    // Before a dispatch: the coordinator's stats levels.
    std::function<void()> update_stats;
    // The queue ended closure `id` (`state` as ClosureQueue::complete
    // returned it, `error` the run's): the journal, the stats and the
    // checkpoint policy hear of it.
    std::function<void(int64_t id, ClosureQueue::State state, const Status& error)> ended;
  };
  // Everything given must outlive this.
  // Each run that ends is timed in `times`.
  ClosureLanes(const CoordinatorConfig& config, ClosureQueue& queue, Workers& workers, const PsHealth& health,
               const PsVariables& variables, const DispatchGate& gate, LoopContext loop, Hooks hooks,
               WorkerTimes& times);

  // Starts the lanes of registered worker `worker_id`, and its pings.
  void start(int64_t worker_id);

 private:
  kj::Promise<void> lane(int64_t worker_id);
  // Sends one run (`closure`, just taken from the queue) to the worker.
  kj::Promise<void> run_one(int64_t worker_id, const Worker& worker, const ClosureQueue::Closure& closure);
  // With closure_timeout: `outcome`, or DeadlineExceeded once the timeout
  // passes (the worker is told to stop the run).
  kj::Promise<ClosureOutcome> bounded(kj::Promise<ClosureOutcome> outcome, int64_t worker_id, int64_t id,
                                      const std::string& function,
                                      std::chrono::system_clock::time_point deadline);
  // Sends `runs` (taken from the queue for the worker) in one call;
  // `queued`: how long they waited in the queue, summed.
  kj::Promise<void> run_batch(int64_t worker_id, std::vector<ClosureRun> runs, double queued);
  // How many closures a lane takes for its next call (1 unless the queue is
  // deep and batching is on).
  int batch_size() const;
  ClosureRun make_run(const Worker& worker, const ClosureQueue::Closure& closure) const;
  // Records a run's outcome in the queue; false when it says the worker is
  // lost (then dropped, its closures re-queued).
  bool finish_run(int64_t worker_id, int64_t id, int64_t generation, ClosureOutcome outcome);
  // Tells the workers of runs the queue cancelled to stop them.
  void cancel_runs();
  // After a call's outcomes: cancellations, a wake-up, the lane's next call.
  kj::Promise<void> next(int64_t worker_id);
  kj::Promise<void> watch(int64_t worker_id);

  const CoordinatorConfig& config_;
  ClosureQueue& queue_;
  Workers& workers_;
  const PsHealth& health_;
  const PsVariables& variables_;
  const DispatchGate& gate_;
  const LoopContext loop_;
  const Hooks hooks_;
  WorkerTimes& times_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_CLOSURE_LANES_H_
