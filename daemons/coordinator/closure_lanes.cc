#include "daemons/coordinator/closure_lanes.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "async/status_exception.h"
#include "capstan/trace.h"

namespace capstan::coordinator {

// WorkerPeer's default (peers.h): the runs one after another.
kj::Promise<std::vector<ClosureOutcome>> WorkerPeer::run_closures(std::vector<ClosureRun> runs) {
  struct Batch {
    std::vector<ClosureRun> runs;
    std::vector<ClosureOutcome> outcomes;
  };
  auto batch = std::make_shared<Batch>();
  batch->runs = std::move(runs);
  kj::Promise<void> chain = kj::READY_NOW;
  for (size_t i = 0; i < batch->runs.size(); ++i) {
    chain = chain.then([this, batch, i]() -> kj::Promise<void> {
      bool failed = !batch->outcomes.empty() && !batch->outcomes.back().result.ok();
      if (failed) {
        batch->outcomes.push_back(ClosureOutcome{
            Status::Aborted("not run: an earlier closure of its batch failed"), batch->outcomes.back().worker_lost});
        return kj::READY_NOW;
      }
      return run_closure(std::move(batch->runs[i])).then([batch](ClosureOutcome outcome) {
        batch->outcomes.push_back(std::move(outcome));
      });
    });
  }
  return chain.then([batch]() { return std::move(batch->outcomes); });
}

ClosureLanes::ClosureLanes(const CoordinatorConfig& config, ClosureQueue& queue, Workers& workers,
                           const PsHealth& health, const PsVariables& variables, const DispatchGate& gate,
                           LoopContext loop, Hooks hooks, WorkerTimes& times)
    : config_(config),
      queue_(queue),
      workers_(workers),
      health_(health),
      variables_(variables),
      gate_(gate),
      loop_(std::move(loop)),
      hooks_(std::move(hooks)),
      times_(times) {}

void ClosureLanes::start(int64_t worker_id) {
  for (int i = 0; i < config_.closures_per_worker; ++i) loop_.tasks.add(lane(worker_id));
  loop_.tasks.add(watch(worker_id));
}

// Pings a worker every interval; one that does not answer in time (hung, or
// cut off without the link breaking) is dropped.
kj::Promise<void> ClosureLanes::watch(int64_t worker_id) {
  return loop_.timer.afterDelay(config_.worker_ping_interval.count() * kj::MILLISECONDS)
      .then([this, worker_id]() -> kj::Promise<void> {
        const Worker* worker = workers_.find(worker_id);
        if (worker == nullptr) return kj::READY_NOW;
        auto timeout = config_.worker_ping_timeout;
        auto late = loop_.timer.afterDelay(timeout.count() * kj::MILLISECONDS).then([timeout]() {
          return Status::DeadlineExceeded("ping did not finish within " + std::to_string(timeout.count()) +
                                          " ms");
        });
        auto ping = worker->peer->ping().catch_([](kj::Exception&& e) { return async::from_exception(e); });
        return ping.exclusiveJoin(kj::mv(late)).then([this, worker_id](Status status) -> kj::Promise<void> {
          if (!status.ok()) {
            workers_.drop(worker_id, status.with_context("no answer to a ping"));
            return kj::READY_NOW;
          }
          return watch(worker_id);
        });
      });
}

void ClosureLanes::cancel_runs() {
  for (auto [closure_id, worker_id] : queue_.take_cancelled_runs()) {
    const Worker* worker = workers_.find(worker_id);
    if (worker == nullptr) continue;
    int64_t id = closure_id;
    loop_.tasks.add(worker->peer->cancel_closure(id).then([this, id](Status status) {
      if (!status.ok()) loop_.log->debug("cancelling closure {}: {}", id, status.to_string());
    }));
  }
}

ClosureRun ClosureLanes::make_run(const Worker& worker, const ClosureQueue::Closure& closure) const {
  ClosureRun run;
  run.closure_id = closure.id;
  run.function = closure.function;
  run.args = closure.args;
  run.placement_version = variables_.version();
  run.attempt = static_cast<uint32_t>(closure.attempts);
  run.num_workers = static_cast<uint32_t>(workers_.size());
  run.worker_index = worker.task_index;
  return run;
}

int ClosureLanes::batch_size() const {
  if (config_.closure_batch <= 1 || config_.closure_timeout.count() > 0) return 1;
  // Deep enough that every lane gets a full batch and some are left: the
  // workers stay balanced up to one batch at the end of a burst.
  int64_t lanes = std::max<int64_t>(1, static_cast<int64_t>(workers_.size()) * config_.closures_per_worker);
  int64_t share = queue_.queued() / (2 * lanes);
  return static_cast<int>(std::clamp<int64_t>(share, 1, config_.closure_batch));
}

bool ClosureLanes::finish_run(int64_t worker_id, int64_t id, int64_t generation, ClosureOutcome outcome) {
  if (outcome.worker_lost) {
    workers_.drop(worker_id, outcome.result.status());
    return false;
  }
  if (!outcome.result.ok() && (generation != health_.generation() || !health_.status().ok())) {
    // A parameter server was lost or restored while it ran (a restarted one
    // answers NotFound until its shards are back): the run was lost, not
    // failed, and runs again (ClosureQueue re-queues Unavailable).
    outcome.result = Status::Unavailable("the run overlapped a parameter server's outage: " +
                                         outcome.result.status().to_string());
  }
  // Journaled from here when the program released the closure meanwhile
  // (its record goes as it completes).
  Status error = outcome.result.status();
  if (auto ended = queue_.complete(id, worker_id, std::move(outcome.result))) hooks_.ended(id, *ended, error);
  return true;
}

kj::Promise<void> ClosureLanes::next(int64_t worker_id) {
  cancel_runs();
  loop_.changes.notify();
  return lane(worker_id);
}

kj::Promise<void> ClosureLanes::lane(int64_t worker_id) {
  const Worker* worker = workers_.find(worker_id);
  if (worker == nullptr || worker->leaving || gate_.draining()) return kj::READY_NOW;
  if (!health_.status().ok() || gate_.paused()) {
    return loop_.changes.changed().then([this, worker_id]() { return lane(worker_id); });
  }
  int batch = batch_size();
  auto closure = queue_.next(worker_id);
  if (!closure) return loop_.changes.changed().then([this, worker_id]() { return lane(worker_id); });
  if (batch > 1) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<ClosureRun> runs;
    runs.push_back(make_run(*worker, *closure));
    double queued = std::chrono::duration<double>(now - closure->queued_since).count();
    while (static_cast<int>(runs.size()) < batch) {
      auto more = queue_.next(worker_id);
      if (!more) break;
      runs.push_back(make_run(*worker, *more));
      queued += std::chrono::duration<double>(now - more->queued_since).count();
    }
    if (runs.size() > 1) return run_batch(worker_id, std::move(runs), queued);
  }
  return run_one(worker_id, *worker, *closure);
}

kj::Promise<void> ClosureLanes::run_one(int64_t worker_id, const Worker& worker,
                                        const ClosureQueue::Closure& closure) {
  hooks_.update_stats();
  ClosureRun run = make_run(worker, closure);
  std::optional<std::chrono::system_clock::time_point> deadline;
  if (config_.closure_timeout.count() > 0) {
    deadline = std::chrono::system_clock::now() + config_.closure_timeout;
    run.deadline_unix_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline->time_since_epoch()).count();
  }
  const int64_t id = closure.id;
  const int64_t generation = health_.generation();
  const int64_t ticket = times_.begin(
      worker.task_index, 1, std::chrono::duration<double>(std::chrono::steady_clock::now() - closure.queued_since).count());
  // The run in the flight recorder (and a trace), until its outcome.
  auto span = kj::heap<trace::Span>(trace::Kind::kClosure, closure.function,
                                    "closure " + std::to_string(id) + " on worker " + std::to_string(worker.task_index));
  span->set_async();
  trace::Span* dispatched = span.get();
  auto outcome = worker.peer->run_closure(std::move(run)).catch_([](kj::Exception&& e) {
    ClosureOutcome lost;
    lost.result = async::from_exception(e);
    lost.worker_lost = true;
    return lost;
  });
  if (deadline) outcome = bounded(kj::mv(outcome), worker_id, id, closure.function, *deadline);
  return kj::mv(outcome)
      .then([this, worker_id, id, generation, ticket, dispatched,
             function = closure.function](ClosureOutcome outcome) -> kj::Promise<void> {
        if (outcome.result.ok() && !outcome.worker_lost) {
          times_.end(ticket, function, outcome.phases);
        } else {
          times_.abandon(ticket);
          dispatched->fail(outcome.result.status().to_string());
        }
        dispatched->finish();
        if (!finish_run(worker_id, id, generation, std::move(outcome))) return kj::READY_NOW;
        return next(worker_id);
      })
      .attach(kj::mv(span));
}

kj::Promise<ClosureOutcome> ClosureLanes::bounded(kj::Promise<ClosureOutcome> outcome, int64_t worker_id, int64_t id,
                                                  const std::string& function,
                                                  std::chrono::system_clock::time_point deadline) {
  auto timeout = config_.closure_timeout;
  auto timed_out = [id, function, timeout]() {
    return Status::DeadlineExceeded("closure " + std::to_string(id) + " (" + function +
                                    ") did not finish within closure_timeout_ms " + std::to_string(timeout.count()));
  };
  return outcome
      .then([deadline, timed_out](ClosureOutcome finished) {
        // The worker saw the deadline pass (its context's cancelled())
        // before this loop's timer fired: the run timed out all the same.
        if (!finished.worker_lost && std::chrono::system_clock::now() >= deadline) finished.result = timed_out();
        return finished;
      })
      .exclusiveJoin(
          loop_.timer.afterDelay(timeout.count() * kj::MILLISECONDS).then([this, worker_id, id, timed_out]() {
            // The worker is told to stop; the lane moves on meanwhile.
            const Worker* found = workers_.find(worker_id);
            if (found != nullptr) loop_.tasks.add(found->peer->cancel_closure(id).then([](Status) {}));
            return ClosureOutcome{timed_out(), false};
          }));
}

kj::Promise<void> ClosureLanes::run_batch(int64_t worker_id, std::vector<ClosureRun> runs, double queued) {
  hooks_.update_stats();
  std::vector<int64_t> ids;
  std::vector<std::string> functions;
  ids.reserve(runs.size());
  for (const auto& run : runs) {
    ids.push_back(run.closure_id);
    functions.push_back(run.function);
  }
  const int64_t generation = health_.generation();
  // The peer stays alive while its batch runs, even if the worker is dropped
  // meanwhile (another lane found it lost).
  const Worker* worker = workers_.find(worker_id);
  std::shared_ptr<WorkerPeer> peer = worker->peer;
  const int64_t ticket = times_.begin(worker->task_index, static_cast<int>(runs.size()), queued);
  size_t n = runs.size();
  // The batch in the flight recorder (and a trace), until its outcomes.
  auto span = kj::heap<trace::Span>(trace::Kind::kClosure, "batch of " + std::to_string(n),
                                    (ids.empty() ? std::string("no closures")
                                                 : "closures " + std::to_string(ids.front()) + ".." +
                                                       std::to_string(ids.back())) +
                                        " on worker " + std::to_string(worker->task_index));
  span->set_async();
  return peer->run_closures(std::move(runs))
      .attach(kj::mv(peer), kj::mv(span))
      .catch_([n](kj::Exception&& e) {
        return std::vector<ClosureOutcome>(n, ClosureOutcome{async::from_exception(e), true});
      })
      .then([this, worker_id, ids = std::move(ids), functions = std::move(functions), generation,
             ticket](std::vector<ClosureOutcome> outcomes) -> kj::Promise<void> {
        if (outcomes.size() != ids.size()) {
          times_.close(ticket);
          // A peer that answered the wrong number of outcomes cannot be
          // trusted with the others either.
          workers_.drop(worker_id, Status::Internal("worker answered " + std::to_string(outcomes.size()) +
                                                    " outcomes for a batch of " + std::to_string(ids.size()) +
                                                    " closures"));
          return kj::READY_NOW;
        }
        // The values' times, at once.
        std::vector<std::pair<const std::string*, PhaseTimes>> values;
        values.reserve(outcomes.size());
        for (size_t i = 0; i < outcomes.size(); ++i) {
          if (outcomes[i].result.ok() && !outcomes[i].worker_lost) values.emplace_back(&functions[i], outcomes[i].phases);
        }
        times_.end_batch(ticket, values);
        // Values first, in order. Errors after them, last run first: the
        // runs lost (not started after a failure, or overlapping a PS outage)
        // go back to the front of the queue one by one, so the last to go
        // back (the first of them) is the first to run again.
        std::vector<size_t> errors;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (!outcomes[i].worker_lost && !outcomes[i].result.ok()) {
            errors.push_back(i);
            continue;
          }
          // A lost worker re-queues what is left of the batch (Workers::drop).
          if (!finish_run(worker_id, ids[i], generation, std::move(outcomes[i]))) return kj::READY_NOW;
        }
        for (auto it = errors.rbegin(); it != errors.rend(); ++it) {
          finish_run(worker_id, ids[*it], generation, std::move(outcomes[*it]));
        }
        return next(worker_id);
      });
}

}  // namespace capstan::coordinator
