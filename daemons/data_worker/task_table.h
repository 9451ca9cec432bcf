// The data worker's bookkeeping of its tasks and of its heartbeats, apart
// from the transport (TF's DataServiceWorkerImpl keeps the same table).
//
// A task moves through: assigned (a heartbeat reply names it) -> building
// (its pipeline is built on the pool) -> serving -> finished (its runner
// reached the end; the dispatcher is told with finishTask until it
// acknowledges) -> deleted (a heartbeat reply says so; a task deleted while
// building is dropped when its build ends). `Task` is what DataWorker keeps
// for a serving task (its runner); the table only stores it.
//
// Example:
//   TaskTable<MyTask> table;
//   if (table.assign(7)) build_on_pool(7);            // heartbeat reply: new task 7
//   table.built(7, task);                              // returns null: now serving
//   table.current_ids();                               // {7}: sent with the next heartbeat
//   if (table.start_finish(7)) send_finish_task(7);    // end of sequence
//   table.finish_acknowledged(7);
//
// Thread-safety: not thread-safe; DataWorker (data_worker.h) uses it on its
// loop thread.
#ifndef CAPSTAN_DAEMONS_DATA_WORKER_TASK_TABLE_H_
#define CAPSTAN_DAEMONS_DATA_WORKER_TASK_TABLE_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

namespace capstan::data_worker {

template <typename Task>
class TaskTable {
 public:
  enum class State {
    kServing,             // built: serve its elements
    kBuilding,            // not built yet: the consumer asks again
    kFinishedAndDeleted,  // reached its end, then deleted: end of sequence
    kUnknown,             // never heard of (a consumer may hear of it first)
  };

  // A heartbeat reply assigns task `id`. True when it must be built now;
  // false when it is serving or building already (a task deleted while
  // building and assigned again is kept).
  bool assign(int64_t id) {
    if (tasks_.count(id) > 0) return false;
    if (building_.count(id) > 0) {
      deleted_while_building_.erase(id);
      return false;
    }
    building_.insert(id);
    return true;
  }

  // The build of `id` ended with `task`. Returns it back when the dispatcher
  // deleted the task meanwhile (the caller destroys it); else it serves.
  std::shared_ptr<Task> built(int64_t id, std::shared_ptr<Task> task) {
    building_.erase(id);
    if (deleted_while_building_.erase(id) > 0) return task;
    tasks_[id] = std::move(task);
    return nullptr;
  }

  // The build of `id` failed: forgotten, so a later assignment builds it again.
  void build_failed(int64_t id) {
    building_.erase(id);
    deleted_while_building_.erase(id);
  }

  // A heartbeat reply deletes task `id`. Returns the serving task to destroy,
  // or null (building: dropped when built; unknown: nothing to do).
  std::shared_ptr<Task> remove(int64_t id) {
    finish_unacknowledged_.erase(id);
    if (building_.count(id) > 0) {
      deleted_while_building_.insert(id);
      return nullptr;
    }
    auto it = tasks_.find(id);
    if (it == tasks_.end()) return nullptr;
    std::shared_ptr<Task> task = std::move(it->second);
    tasks_.erase(it);
    return task;
  }

  // Every serving task, removed from the table (the worker is shutting down).
  std::vector<std::shared_ptr<Task>> take_all() {
    std::vector<std::shared_ptr<Task>> out;
    for (auto& entry : tasks_) out.push_back(std::move(entry.second));
    tasks_.clear();
    return out;
  }

  // The tasks a heartbeat reports: serving and building, not those deleted.
  std::vector<int64_t> current_ids() const {
    std::vector<int64_t> ids;
    for (const auto& entry : tasks_) ids.push_back(entry.first);
    for (int64_t id : building_) {
      if (deleted_while_building_.count(id) == 0) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  size_t size() const { return tasks_.size() + building_.size() - deleted_while_building_.size(); }

  // Where task `id` stands for a consumer; `*task` is set when serving.
  State lookup(int64_t id, std::shared_ptr<Task>* task) const {
    auto it = tasks_.find(id);
    if (it != tasks_.end()) {
      *task = it->second;
      return State::kServing;
    }
    if (building_.count(id) > 0 && deleted_while_building_.count(id) == 0) return State::kBuilding;
    if (finished_.count(id) > 0) return State::kFinishedAndDeleted;
    return State::kUnknown;
  }

  // Task `id` reached its end. True the first time (the caller starts
  // telling the dispatcher).
  bool mark_finished(int64_t id) { return finished_.insert(id).second; }

  // finishTask for `id`: true when the caller sends one now (none is in
  // flight); the task stays unacknowledged until one succeeds or is refused.
  bool start_finish(int64_t id) {
    finish_unacknowledged_.insert(id);
    return finish_in_flight_.insert(id).second;
  }
  // The dispatcher accepted, or refused for good: nothing more to send.
  void finish_done(int64_t id) {
    finish_in_flight_.erase(id);
    finish_unacknowledged_.erase(id);
  }
  // The call failed in a way worth retrying (the dispatcher is away).
  void finish_failed(int64_t id) { finish_in_flight_.erase(id); }
  // finishTask calls to send again once the dispatcher answers heartbeats.
  std::vector<int64_t> finishes_to_retry() const {
    std::vector<int64_t> ids;
    for (int64_t id : finish_unacknowledged_) {
      if (finish_in_flight_.count(id) == 0) ids.push_back(id);
    }
    return ids;
  }

 private:
  std::map<int64_t, std::shared_ptr<Task>> tasks_;  // serving
  std::set<int64_t> building_;
  std::set<int64_t> deleted_while_building_;  // dropped when their build ends
  std::set<int64_t> finished_;                // kept after deletion
  std::set<int64_t> finish_unacknowledged_;
  std::set<int64_t> finish_in_flight_;
};

// When to send the next heartbeat: every `interval` while the dispatcher
// answers (or the longer interval its reply asks for: it spreads its
// heartbeat budget over a large cluster); after a failure the delay
// doubles, up to max(interval, `max`).
class HeartbeatBackoff {
 public:
  HeartbeatBackoff(std::chrono::milliseconds interval, std::chrono::milliseconds max)
      : interval_(interval), max_(std::max(max, interval)), delay_(interval) {}

  std::chrono::milliseconds delay() const { return delay_; }
  bool dispatcher_down() const { return down_; }

  // A heartbeat succeeded; `asked`: the interval its reply asks for. True
  // when the dispatcher was down until now.
  bool succeeded(std::chrono::milliseconds asked = std::chrono::milliseconds(0)) {
    bool was_down = down_;
    down_ = false;
    delay_ = std::max(interval_, asked);
    return was_down;
  }
  // A heartbeat failed. True when this starts an outage (log it once).
  bool failed() {
    bool newly_down = !down_;
    down_ = true;
    delay_ = std::min(delay_ * 2, max_);
    return newly_down;
  }

 private:
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds max_;
  std::chrono::milliseconds delay_;
  bool down_ = false;
};

}  // namespace capstan::data_worker

#endif  // CAPSTAN_DAEMONS_DATA_WORKER_TASK_TABLE_H_
