// ClosureQueue: the coordinator's record of scheduled closures, with
// TensorFlow ClusterCoordinator semantics.
//
// Glossary:
//   closure   a named function plus its (serialized) arguments, scheduled by
//             the training program and run by some worker.
//   value     what a closure returned (serialized); the RemoteValue.
//   pending error
//             the first non-retryable error a closure raised. It is raised
//             once by the next schedule()/join()/done() (take_error()), then
//             cleared. When it is recorded, every queued and every running
//             closure is cancelled (its fetch says Cancelled, as TF's
//             RemoteValue raises CancelledError); running ones are listed by
//             take_cancelled_runs() so their workers can be told to stop, and
//             their late results are dropped.
//
// At-least-once execution: when a worker fails, its running closures go back
// to the front of the queue and run elsewhere; a result that arrives for a
// closure already completed is dropped, so each value is delivered once.
//
// Example:
//   ClosureQueue q;
//   int64_t id = q.schedule("train_step", args).value();
//   auto c = q.next(/*worker=*/0);         // {id, "train_step", args}
//   q.complete(c->id, 0, std::string("loss bytes"));
//   q.value(id);                            // "loss bytes"
//
// Not thread-safe: the coordinator service uses it on its RPC loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_CLOSURE_QUEUE_H_
#define CAPSTAN_DAEMONS_COORDINATOR_CLOSURE_QUEUE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "capstan/status.h"

namespace capstan::coordinator {

class ClosureQueue {
 public:
  struct Closure {
    int64_t id = 0;
    std::string function;
    std::string args;  // serialized by the client, opaque here
    int attempts = 0;  // times handed to a worker, this one included
  };
  enum class State { kQueued, kRunning, kDone, kFailed, kCancelled };

  // Queues a closure and returns its id; or returns the pending error
  // (clearing it) without queueing anything, as TF's schedule() raises it.
  Result<int64_t> schedule(std::string function, std::string args);

  // The next queued closure for `worker`, now running there; nullopt when
  // the queue is empty.
  std::optional<Closure> next(int64_t worker);

  // A worker's report. `result` is the value or the closure's error. An
  // Unavailable or Aborted error means the run was lost (not the closure's
  // fault): the closure goes back to the queue. Returns false when the
  // report is stale (the closure already finished, was cancelled, or now
  // runs elsewhere) and was ignored.
  bool complete(int64_t id, int64_t worker, Result<std::string> result);

  // `worker` is gone: its running closures go back to the front of the
  // queue (each once). Returns their ids.
  std::vector<int64_t> worker_failed(int64_t worker);

  // Runs cancelled since the last call, as (closure id, worker): the
  // coordinator asks those workers to stop them.
  std::vector<std::pair<int64_t, int64_t>> take_cancelled_runs();

  // The pending error, cleared by this call (OK when there is none).
  Status take_error();
  bool has_error() const { return !error_.ok(); }

  // Nothing queued or running.
  bool idle() const { return queue_.empty() && running_.empty(); }
  int64_t queued() const { return static_cast<int64_t>(queue_.size()); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  // Closures that ended and are kept for fetch (not released).
  int64_t finished() const {
    return static_cast<int64_t>(records_.size() - queue_.size() - running_.size());
  }
  // Closures running on `worker`.
  int64_t running_on(int64_t worker) const;

  // State of a closure; NotFound for an unknown or released id.
  Result<State> state(int64_t id) const;
  // The value of a finished closure: its bytes, its error, or Cancelled;
  // Unavailable while it has not finished (callers wait and ask again).
  Result<std::string> value(int64_t id) const;
  // The client will not fetch `id` again: drop what is kept for it.
  void release(int64_t id);

  // Replaying the coordinator's journal. Closure `id` was scheduled (later
  // ids continue after it); it is queued.
  void restore_scheduled(int64_t id, std::string function, std::string args);
  // Closure `id` (queued by the replay) finished with `result`, as
  // complete() recorded it: a value, or an error that also cancels what was
  // queued then.
  void restore_finished(int64_t id, Result<std::string> result);

  // A compacted journal: every record as it is (queued and running ones are
  // queued again), the pending error, and the next id.
  struct Snapshot {
    struct Entry {
      Closure closure;
      State state = State::kQueued;
      std::string value;  // kDone
      Status error;       // kFailed, kCancelled
    };
    std::vector<Entry> entries;  // by id
    Status pending_error;
    int64_t next_id = 1;
  };
  Snapshot snapshot() const;
  void restore_entry(Snapshot::Entry entry);
  void restore_pending(Status error, int64_t next_id);
  // Records kept (queued, running, and ended but not released).
  int64_t size() const { return static_cast<int64_t>(records_.size()); }

 private:
  struct Record {
    Closure closure;
    State state = State::kQueued;
    int64_t worker = -1;  // while running
    Status error;         // kFailed / kCancelled
    std::string value;    // kDone
  };

  void add_queued(int64_t id, std::string function, std::string args);
  void cancel_pending();
  Status cancelled_status(int64_t id, const Record& record) const;

  static constexpr int64_t kReplayWorker = -2;

  int64_t next_id_ = 1;
  std::map<int64_t, Record> records_;
  std::deque<int64_t> queue_;   // ids, front first
  std::set<int64_t> running_;   // ids
  Status error_;                // the pending error
  std::vector<std::pair<int64_t, int64_t>> cancelled_runs_;  // (id, worker)
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_CLOSURE_QUEUE_H_
