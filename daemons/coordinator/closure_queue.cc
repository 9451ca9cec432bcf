#include "daemons/coordinator/closure_queue.h"

#include <algorithm>

namespace capstan::coordinator {

Result<int64_t> ClosureQueue::schedule(std::string function, std::string args, Owner owner) {
  if (!error_.ok()) return take_error();
  int64_t id = next_id_++;
  add_queued(id, std::move(function), std::move(args), owner);
  return id;
}

void ClosureQueue::add_queued(int64_t id, std::string function, std::string args, Owner owner) {
  Record record;
  record.closure.id = id;
  record.closure.function = std::move(function);
  record.closure.args = std::move(args);
  record.owner = owner;
  records_.emplace_hint(records_.end(), id, std::move(record));
  queue_.push_back(id);
}

std::optional<ClosureQueue::Closure> ClosureQueue::next(int64_t worker) {
  if (queue_.empty()) return std::nullopt;
  int64_t id = queue_.front();
  queue_.pop_front();
  Record& record = records_.at(id);
  record.state = State::kRunning;
  record.worker = worker;
  ++record.closure.attempts;
  running_.insert(id);
  return record.closure;
}

std::optional<ClosureQueue::State> ClosureQueue::complete(int64_t id, int64_t worker, Result<std::string> result) {
  auto it = records_.find(id);
  if (it == records_.end()) return std::nullopt;
  Record& record = it->second;
  if (record.state != State::kRunning || record.worker != worker) return std::nullopt;
  running_.erase(id);
  record.worker = -1;
  if (result.ok()) {
    record.state = State::kDone;
    record.value = std::move(*result);
    drop_if_released(it);
    return State::kDone;
  }
  Status error = result.status();
  if (error.code() == StatusCode::kUnavailable || error.code() == StatusCode::kAborted) {
    // The run was lost, not failed: try again elsewhere, first in line.
    record.state = State::kQueued;
    record.closure.queued_since = std::chrono::steady_clock::now();
    queue_.push_front(id);
    return State::kQueued;
  }
  record.state = State::kFailed;
  record.error = error;
  if (error_.ok()) {
    // Raised to the program even when it let the closure's value go.
    error_ = error;
    cancel_pending();
  }
  drop_if_released(it);
  return State::kFailed;
}

void ClosureQueue::drop_if_released(std::map<int64_t, Record>::iterator it) {
  if (it->second.released) records_.erase(it);
}

int64_t ClosureQueue::running_on(int64_t worker) const {
  int64_t n = 0;
  for (int64_t id : running_) n += records_.at(id).worker == worker ? 1 : 0;
  return n;
}

std::vector<int64_t> ClosureQueue::worker_failed(int64_t worker) {
  std::vector<int64_t> requeued;
  for (int64_t id : running_) {
    if (records_.at(id).worker == worker) requeued.push_back(id);
  }
  // Back to the front in their original order.
  for (auto it = requeued.rbegin(); it != requeued.rend(); ++it) {
    Record& record = records_.at(*it);
    running_.erase(*it);
    record.state = State::kQueued;
    record.worker = -1;
    record.closure.queued_since = std::chrono::steady_clock::now();
    queue_.push_front(*it);
  }
  return requeued;
}

Status ClosureQueue::cancelled_status(int64_t id, const Record& record) const {
  return Status::Cancelled("closure " + std::to_string(id) + " (" + record.closure.function +
                           ") was cancelled because another closure failed: " + error_.to_string());
}

void ClosureQueue::cancel_pending() {
  for (int64_t id : queue_) {
    auto it = records_.find(id);
    Record& record = it->second;
    record.state = State::kCancelled;
    record.error = cancelled_status(id, record);
    drop_if_released(it);
  }
  queue_.clear();
  for (int64_t id : running_) {
    auto it = records_.find(id);
    Record& record = it->second;
    cancelled_runs_.emplace_back(id, record.worker);
    record.state = State::kCancelled;
    record.error = cancelled_status(id, record);
    record.worker = -1;
    drop_if_released(it);
  }
  running_.clear();
}

std::vector<std::pair<int64_t, int64_t>> ClosureQueue::take_cancelled_runs() {
  return std::exchange(cancelled_runs_, {});
}

Status ClosureQueue::take_error() {
  Status error = error_;
  error_ = Status::Ok();
  return error;
}

Status ClosureQueue::released_status(int64_t id) const {
  return Status::NotFound("closure " + std::to_string(id) +
                          " was released: its value is no longer kept (its RemoteValue was dropped or fetched with "
                          "fetch_once, or its program was gone longer than the coordinator's client_grace_ms); keep "
                          "the RemoteValue to fetch it again");
}

Status ClosureQueue::check_id(int64_t id) const {
  if (id <= 0) {
    return Status::InvalidArgument("closure id " + std::to_string(id) + ": closure ids start at 1");
  }
  if (id >= next_id_) {
    return Status::InvalidArgument("closure id " + std::to_string(id) + ": no such closure was scheduled (the last is " +
                                   std::to_string(next_id_ - 1) + ")");
  }
  return Status::Ok();
}

Result<ClosureQueue::State> ClosureQueue::state(int64_t id) const {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.released) {
    if (id > 0 && id < next_id_) return released_status(id);
    return Status::NotFound("no closure " + std::to_string(id));
  }
  return it->second.state;
}

std::optional<ClosureQueue::Owner> ClosureQueue::owner(int64_t id) const {
  auto it = records_.find(id);
  if (it == records_.end()) return std::nullopt;
  return it->second.owner;
}

Result<std::string> ClosureQueue::value(int64_t id) const {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.released) {
    if (id > 0 && id < next_id_) return released_status(id);
    return Status::NotFound("no closure " + std::to_string(id));
  }
  const Record& record = it->second;
  switch (record.state) {
    case State::kDone: return record.value;
    case State::kFailed:
    case State::kCancelled: return record.error;
    default: return Status::Unavailable("closure " + std::to_string(id) + " has not finished");
  }
}

void ClosureQueue::restore_scheduled(int64_t id, std::string function, std::string args, Owner owner) {
  if (records_.count(id) != 0) return;
  add_queued(id, std::move(function), std::move(args), owner);
  next_id_ = std::max(next_id_, id + 1);
}

void ClosureQueue::restore_finished(int64_t id, Result<std::string> result) {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.state != State::kQueued) return;
  queue_.erase(std::find(queue_.begin(), queue_.end(), id));
  // Through complete(), as a run on no worker, so the two cannot differ.
  it->second.state = State::kRunning;
  it->second.worker = kReplayWorker;
  running_.insert(id);
  complete(id, kReplayWorker, std::move(result));
  cancelled_runs_.clear();  // runs of a coordinator that is gone
}

ClosureQueue::Snapshot ClosureQueue::snapshot() const {
  Snapshot out;
  for (const auto& [id, record] : records_) {
    Snapshot::Entry entry;
    entry.closure = record.closure;
    entry.state = record.state == State::kRunning ? State::kQueued : record.state;
    entry.value = record.value;
    entry.error = record.error;
    entry.owner = record.owner;
    entry.released = record.released;
    out.entries.push_back(std::move(entry));
  }
  out.pending_error = error_;
  out.next_id = next_id_;
  return out;
}

void ClosureQueue::restore_entry(Snapshot::Entry entry) {
  int64_t id = entry.closure.id;
  if (id <= 0 || records_.count(id) != 0) return;
  Record record;
  record.closure = std::move(entry.closure);
  record.closure.attempts = 0;
  record.closure.queued_since = std::chrono::steady_clock::now();
  record.state = entry.state == State::kRunning ? State::kQueued : entry.state;
  record.value = std::move(entry.value);
  record.error = std::move(entry.error);
  record.owner = entry.owner;
  record.released = entry.released;
  // A finished closure is only kept when not released (snapshot() never
  // writes one), but a hand-made journal is no reason to keep it.
  if (record.released && record.state != State::kQueued) return;
  if (record.state == State::kQueued) queue_.push_back(id);
  records_.emplace(id, std::move(record));
  next_id_ = std::max(next_id_, id + 1);
}

void ClosureQueue::restore_pending(Status error, int64_t next_id) {
  error_ = std::move(error);
  next_id_ = std::max(next_id_, next_id);
}

Result<bool> ClosureQueue::release(int64_t id) {
  CAPSTAN_RETURN_IF_ERROR(check_id(id));
  auto it = records_.find(id);
  if (it == records_.end() || it->second.released) return false;
  // A closure still queued or running keeps its record until it finishes.
  it->second.released = true;
  if (it->second.state != State::kQueued && it->second.state != State::kRunning) records_.erase(it);
  return true;
}

std::vector<int64_t> ClosureQueue::release_client(uint64_t client) {
  std::vector<int64_t> ids;
  if (client == 0) return ids;
  for (auto it = records_.begin(); it != records_.end();) {
    Record& record = it->second;
    if (record.owner.client != client || record.released) {
      ++it;
      continue;
    }
    ids.push_back(it->first);
    record.released = true;
    if (record.state != State::kQueued && record.state != State::kRunning) {
      it = records_.erase(it);
    } else {
      ++it;
    }
  }
  return ids;
}

}  // namespace capstan::coordinator
