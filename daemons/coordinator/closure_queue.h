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
// Release: the program says it will not fetch a closure again (its
// RemoteValue went, or its client has been gone too long). A finished
// closure's record is dropped at once; a queued or running one is marked
// and dropped when it finishes (its error is still raised as the pending
// error). So the records kept are those in flight plus those the program
// still holds. Ids are handed out in order and a record only ever goes by
// release, so an id below next_id() without a record was released: no
// per-id memory is needed to say so.
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

#include <chrono>
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
    // When it was queued last (scheduled, or re-queued after a lost run).
    std::chrono::steady_clock::time_point queued_since = std::chrono::steady_clock::now();
  };
  enum class State { kQueued, kRunning, kDone, kFailed, kCancelled };

  // Who scheduled a closure: the program's client and its request number
  // (0: a caller that names neither; its values go only by release()).
  // Owner{} is all zeros (no member initializers: GCC refuses them in a
  // default argument inside the class).
  struct Owner {
    uint64_t client;
    int64_t request_seq;
  };

  // Queues a closure and returns its id; or returns the pending error
  // (clearing it) without queueing anything, as TF's schedule() raises it.
  Result<int64_t> schedule(std::string function, std::string args, Owner owner = {});

  // The next queued closure for `worker`, now running there; nullopt when
  // the queue is empty.
  std::optional<Closure> next(int64_t worker);

  // A worker's report. `result` is the value or the closure's error. An
  // Unavailable or Aborted error means the run was lost (not the closure's
  // fault): the closure goes back to the queue. Returns the closure's state
  // now (kQueued: it runs again; kDone or kFailed even when it was released
  // and its record is gone), or nullopt when the report is stale (the
  // closure already finished, was cancelled, or now runs elsewhere) and was
  // ignored.
  std::optional<State> complete(int64_t id, int64_t worker, Result<std::string> result);

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

  // State of a closure; NotFound for an unknown id, and NotFound saying so
  // for a released one (released but still running included).
  Result<State> state(int64_t id) const;
  // The value of a finished closure: its bytes, its error, or Cancelled;
  // Unavailable while it has not finished (callers wait and ask again).
  Result<std::string> value(int64_t id) const;
  // The program will not fetch `id` again: a finished closure's record goes
  // now, a queued or running one's when it finishes. True when this call
  // released it; false when it was released before (a retried release).
  // InvalidArgument for an id that was never handed out (<= 0, or past
  // the last one).
  Result<bool> release(int64_t id);
  // InvalidArgument unless `id` was handed out (release() would accept it).
  Status check_id(int64_t id) const;
  // Releases every closure `client` scheduled (its program is gone); the
  // ids this call released, in order.
  std::vector<int64_t> release_client(uint64_t client);
  // The id the next closure gets.
  int64_t next_id() const { return next_id_; }
  // The owner of a kept closure (nullopt: none kept under `id`).
  std::optional<Owner> owner(int64_t id) const;

  // Replaying the coordinator's journal. Closure `id` was scheduled (later
  // ids continue after it); it is queued.
  void restore_scheduled(int64_t id, std::string function, std::string args, Owner owner = {});
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
      Owner owner{};
      bool released = false;  // kQueued: dropped when it finishes
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
    Owner owner{};
    bool released = false;  // queued or running: dropped when it finishes
  };

  void add_queued(int64_t id, std::string function, std::string args, Owner owner);
  void cancel_pending();
  Status cancelled_status(int64_t id, const Record& record) const;
  Status released_status(int64_t id) const;
  // Drops the record of a closure that just finished when it was released.
  void drop_if_released(std::map<int64_t, Record>::iterator it);

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
