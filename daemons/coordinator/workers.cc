#include "daemons/coordinator/workers.h"

#include <algorithm>
#include <utility>

namespace capstan::coordinator {

Workers::Workers(std::shared_ptr<spdlog::logger> log, ChangeSignal& changes, Requeue requeue)
    : log_(std::move(log)), changes_(changes), requeue_(std::move(requeue)) {}

const Worker& Workers::add(int task_index, std::set<std::string> functions, std::unique_ptr<WorkerPeer> peer) {
  bool assigned = task_index < 0;
  std::set<int> taken;
  for (const auto& [id, w] : workers_) taken.insert(w.task_index);
  if (assigned) {
    task_index = 0;
    while (taken.count(task_index) != 0) ++task_index;
  } else if (taken.count(task_index) != 0) {
    log_->warn("a worker registers with task index {}, which a registered worker has: both read the same shard "
               "of each per-worker dataset (give each worker its own --task-index, or none)",
               task_index);
  }
  Worker worker;
  worker.id = next_id_++;
  worker.task_index = task_index;
  worker.peer = std::move(peer);
  worker.functions = std::move(functions);
  std::string names;
  for (const auto& f : worker.functions) names += (names.empty() ? "" : ", ") + f;
  int64_t id = worker.id;
  workers_.emplace(id, std::move(worker));
  log_->info("worker {} (task {}{}) joined; closures: {}", id, task_index, assigned ? ", assigned" : "",
             names.empty() ? "none" : names);
  return workers_.at(id);
}

void Workers::drop(int64_t worker_id, const Status& why) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  size_t requeued = requeue_(worker_id);
  log_->warn("worker {} (task {}) lost ({}); {} running closure(s) re-queued", worker_id, it->second.task_index,
             why.message(), requeued);
  forget(it);
  changes_.notify();
}

bool Workers::remove(int64_t worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return false;
  forget(it);
  return true;
}

void Workers::forget(std::map<int64_t, Worker>::iterator it) {
  int64_t worker_id = it->first;
  workers_.erase(it);
  auto waiting = drop_waiters_.find(worker_id);
  if (waiting != drop_waiters_.end()) {
    for (auto& w : waiting->second) w->fulfill();
    drop_waiters_.erase(waiting);
  }
}

kj::Promise<void> Workers::dropped(int64_t worker_id) {
  if (workers_.count(worker_id) == 0) return kj::READY_NOW;
  auto& waiting = drop_waiters_[worker_id];
  // Each step waits on this once per member, and most steps end without a
  // drop: forget the waits that were given up (their promise is gone).
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> live;
  for (auto& w : waiting) {
    if (w->isWaiting()) live.add(kj::mv(w));
  }
  waiting = kj::mv(live);
  auto paf = kj::newPromiseAndFulfiller<void>();
  waiting.add(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

const Worker* Workers::find(int64_t worker_id) const {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

Worker* Workers::find(int64_t worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

int Workers::task_index(int64_t worker_id) const {
  const Worker* worker = find(worker_id);
  return worker == nullptr ? -1 : worker->task_index;
}

std::set<std::string> Workers::functions() const {
  std::set<std::string> all;
  for (const auto& [id, worker] : workers_) all.insert(worker.functions.begin(), worker.functions.end());
  return all;
}

bool Workers::any_has(const std::string& function) const {
  for (const auto& [id, worker] : workers_) {
    if (worker.functions.count(function) != 0) return true;
  }
  return false;
}

std::vector<int64_t> Workers::replica_candidates(const std::string& function) const {
  std::vector<std::pair<int, int64_t>> found;
  for (const auto& [id, worker] : workers_) {
    if (worker.functions.count(function) != 0 && !worker.leaving) found.emplace_back(worker.task_index, id);
  }
  std::sort(found.begin(), found.end());
  std::vector<int64_t> ids;
  for (const auto& [task, id] : found) ids.push_back(id);
  return ids;
}

std::vector<DatasetTarget> Workers::targets() const {
  std::vector<DatasetTarget> out;
  out.reserve(workers_.size());
  for (const auto& [id, worker] : workers_) out.push_back({id, worker.task_index, worker.peer.get()});
  return out;
}

}  // namespace capstan::coordinator
