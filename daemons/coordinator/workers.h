// Workers: the worker-servers registered with the coordinator, by id. A
// worker joins with the functions its modules have and a task index (given,
// or the lowest one free); it is counted until it leaves (leave_worker) or
// is dropped (its link broke, it stopped answering pings, a step lost it).
// Dropping one hands its running closures back to the queue (the callback
// given at construction) and wakes whatever waits for it to go (dropped()).
//
// Example:
//   Workers workers(log, changes, [&](int64_t id) { return queue.worker_failed(id).size(); });
//   int64_t id = workers.add(-1, {"train_step"}, std::move(peer)).id;  // task index 0
//   workers.replica_candidates("train_step");   // {id}
//   workers.drop(id, Status::Unavailable("link broken"));
//
// Not thread-safe: the Coordinator uses it on its loop thread.
#ifndef CAPSTAN_DAEMONS_COORDINATOR_WORKERS_H_
#define CAPSTAN_DAEMONS_COORDINATOR_WORKERS_H_

#include <kj/async.h>
#include <kj/vector.h>
#include <spdlog/logger.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "capstan/status.h"
#include "daemons/coordinator/loop_context.h"
#include "daemons/coordinator/peers.h"
#include "daemons/coordinator/per_worker_datasets.h"

namespace capstan::coordinator {

struct Worker {
  int64_t id = 0;
  int task_index = 0;
  std::shared_ptr<WorkerPeer> peer;  // shared: a batch in flight keeps it
  std::set<std::string> functions;
  bool leaving = false;  // leave_worker(): no more closures or steps
};

class Workers {
 public:
  // Called when a worker is dropped, before it is forgotten: its running
  // closures go back to the queue; returns how many.
  using Requeue = std::function<size_t(int64_t worker_id)>;
  // `changes` must outlive this.
  Workers(std::shared_ptr<spdlog::logger> log, ChangeSignal& changes, Requeue requeue);

  // Registers a worker. A negative `task_index` gets the lowest index no
  // registered worker has; one that another has is kept (and warned about:
  // both read the same shard of each per-worker dataset).
  const Worker& add(int task_index, std::set<std::string> functions, std::unique_ptr<WorkerPeer> peer);
  // The worker is lost: its running closures are re-queued, it is
  // forgotten, and what waits for it to go wakes. Nothing for an unknown id.
  void drop(int64_t worker_id, const Status& why);
  // The worker left (it ran nothing any more): forgotten, and what waits for
  // it to go wakes. False for an unknown id.
  bool remove(int64_t worker_id);
  // Resolves when `worker_id` is dropped or removed (at once if it is not
  // registered).
  kj::Promise<void> dropped(int64_t worker_id);

  const Worker* find(int64_t worker_id) const;
  Worker* find(int64_t worker_id);
  // The task index of `worker_id`; -1 if it is not registered.
  int task_index(int64_t worker_id) const;
  bool alive(int64_t worker_id) const { return workers_.count(worker_id) != 0; }
  size_t size() const { return workers_.size(); }
  bool empty() const { return workers_.empty(); }
  const std::map<int64_t, Worker>& all() const { return workers_; }

  // Every function the workers have (union).
  std::set<std::string> functions() const;
  bool any_has(const std::string& function) const;
  // The workers that have `function` and are not leaving, by task index:
  // the replicas of a synchronous step.
  std::vector<int64_t> replica_candidates(const std::string& function) const;
  // The workers as the per-worker datasets reach them, by id.
  std::vector<DatasetTarget> targets() const;

 private:
  void forget(std::map<int64_t, Worker>::iterator it);

  const std::shared_ptr<spdlog::logger> log_;
  ChangeSignal& changes_;
  const Requeue requeue_;
  std::map<int64_t, Worker> workers_;
  int64_t next_id_ = 1;
  std::map<int64_t, kj::Vector<kj::Own<kj::PromiseFulfiller<void>>>> drop_waiters_;
};

}  // namespace capstan::coordinator

#endif  // CAPSTAN_DAEMONS_COORDINATOR_WORKERS_H_
