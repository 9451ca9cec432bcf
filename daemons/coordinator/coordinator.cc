#include "daemons/coordinator/coordinator.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <random>
#include <utility>

#include "capstan/data/dataset.h"
#include "journal/journal.h"
#include "rpc/connection.h"
#include "async/status_exception.h"
#include "async/pool.h"

namespace capstan::coordinator {
namespace {

bool finished(ClosureQueue::State state) {
  return state == ClosureQueue::State::kDone || state == ClosureQueue::State::kFailed ||
         state == ClosureQueue::State::kCancelled;
}

}  // namespace

Coordinator::Coordinator(CoordinatorConfig config, ParameterServers& parameter_servers, kj::Timer& timer,
                         boost::asio::thread_pool& pool, std::shared_ptr<spdlog::logger> log)
    : config_(std::move(config)),
      ps_(parameter_servers),
      timer_(timer),
      pool_(pool),
      log_(std::move(log)),
      changes_(timer, [this]() { update_stats(); }),
      ps_health_(parameter_servers, timer.now() + kFirstContactWindow.count() * kj::MILLISECONDS,
                 config_.ps_recovery_timeout),
      variables_(parameter_servers, ps_health_, pool, log_, config_.work_dir,
                 [this](const PlacedVariable& variable) { return journal_variable(variable); }),
      incarnation_([] {
        std::random_device random;
        uint64_t id = (static_cast<uint64_t>(random()) << 32) | random();
        return id == 0 ? 1 : id;
      }()),
      clients_(config_.client_grace),
      datasets_(config_.expected_workers, log_,
                [this](int64_t id, const PerWorkerDataset& dataset) { return journal_dataset(id, dataset); }),
      tasks_(*this) {
  for (int task = 0; task < ps_.size(); ++task) tasks_.add(watch_ps(task));
  if (!config_.checkpoint_dir.empty() && config_.checkpoint_every_seconds.count() > 0) {
    tasks_.add(checkpoint_timer());
  }
  if (config_.client_grace.count() > 0) tasks_.add(client_expiry_timer());
}

Coordinator::~Coordinator() = default;

void Coordinator::taskFailed(kj::Exception&& exception) {
  log_->error("coordinator task failed: {}", async::from_exception(exception).to_string());
}

void Coordinator::update_stats() {
  stats_->closures_queued = queue_.queued();
  stats_->closures_running = queue_.running();
  stats_->workers = static_cast<int64_t>(workers_.size());
  stats_->results_kept = queue_.finished();
  stats_->clients = static_cast<int64_t>(clients_.size());
}

// ---- Workers ---------------------------------------------------------------------

kj::Promise<int64_t> Coordinator::register_worker(int task_index, std::set<std::string> functions,
                                                  std::unique_ptr<WorkerPeer> peer) {
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
  worker.id = next_worker_id_++;
  worker.task_index = task_index;
  worker.peer = std::move(peer);
  worker.functions = std::move(functions);
  std::string names;
  for (const auto& f : worker.functions) names += (names.empty() ? "" : ", ") + f;
  int64_t id = worker.id;
  workers_.emplace(id, std::move(worker));
  log_->info("worker {} (task {}{}) joined; closures: {}", id, task_index, assigned ? ", assigned" : "",
             names.empty() ? "none" : names);
  // Its per-worker iterators first, then closures.
  const Worker& added = workers_.at(id);
  return datasets_.send_all({id, added.task_index, added.peer.get()}, workers_.size()).then([this, id]() {
    for (int i = 0; i < config_.closures_per_worker; ++i) tasks_.add(lane(id));
    tasks_.add(watch_worker(id));
    changes_.notify();
    return id;
  });
}

int Coordinator::worker_task_index(int64_t worker_id) const {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? -1 : it->second.task_index;
}

bool Coordinator::worker_alive(int64_t worker_id) const { return workers_.count(worker_id) != 0; }

std::set<std::string> Coordinator::closure_names() const {
  std::set<std::string> all;
  for (const auto& [id, worker] : workers_) all.insert(worker.functions.begin(), worker.functions.end());
  return all;
}

bool Coordinator::any_worker_has(const std::string& name) const {
  for (const auto& [id, worker] : workers_) {
    if (worker.functions.count(name) != 0) return true;
  }
  return false;
}

// Pings a worker every interval; one that does not answer in time (hung, or
// cut off without the link breaking) is dropped.
kj::Promise<void> Coordinator::watch_worker(int64_t worker_id) {
  return timer_.afterDelay(config_.worker_ping_interval.count() * kj::MILLISECONDS)
      .then([this, worker_id]() -> kj::Promise<void> {
        auto it = workers_.find(worker_id);
        if (it == workers_.end()) return kj::READY_NOW;
        auto timeout = config_.worker_ping_timeout;
        auto late = timer_.afterDelay(timeout.count() * kj::MILLISECONDS).then([timeout]() {
          return Status::DeadlineExceeded("ping did not finish within " + std::to_string(timeout.count()) +
                                          " ms");
        });
        auto ping = it->second.peer->ping().catch_([](kj::Exception&& e) { return async::from_exception(e); });
        return ping.exclusiveJoin(kj::mv(late)).then([this, worker_id](Status status) -> kj::Promise<void> {
          if (!status.ok()) {
            drop_worker(worker_id, status.with_context("no answer to a ping"));
            return kj::READY_NOW;
          }
          return watch_worker(worker_id);
        });
      });
}

void Coordinator::drop_worker(int64_t worker_id, const Status& why) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  auto requeued = queue_.worker_failed(worker_id);
  log_->warn("worker {} (task {}) lost ({}); {} running closure(s) re-queued", worker_id, it->second.task_index,
             why.message(), requeued.size());
  workers_.erase(it);
  auto waiting = drop_waiters_.find(worker_id);
  if (waiting != drop_waiters_.end()) {
    for (auto& w : waiting->second) w->fulfill();
    drop_waiters_.erase(waiting);
  }
  changes_.notify();
}

void Coordinator::cancel_runs() {
  for (auto [closure_id, worker_id] : queue_.take_cancelled_runs()) {
    auto it = workers_.find(worker_id);
    if (it == workers_.end()) continue;
    int64_t id = closure_id;
    tasks_.add(it->second.peer->cancel_closure(id).then([this, id](Status status) {
      if (!status.ok()) log_->debug("cancelling closure {}: {}", id, status.to_string());
    }));
  }
}

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

ClosureRun Coordinator::make_run(const Worker& worker, const ClosureQueue::Closure& closure) const {
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

int Coordinator::batch_size() const {
  if (config_.closure_batch <= 1 || config_.closure_timeout.count() > 0) return 1;
  // Deep enough that every lane gets a full batch and some are left: the
  // workers stay balanced up to one batch at the end of a burst.
  int64_t lanes = std::max<int64_t>(1, static_cast<int64_t>(workers_.size()) * config_.closures_per_worker);
  int64_t share = queue_.queued() / (2 * lanes);
  return static_cast<int>(std::clamp<int64_t>(share, 1, config_.closure_batch));
}

bool Coordinator::finish_run(int64_t worker_id, int64_t id, int64_t generation, ClosureOutcome outcome) {
  if (outcome.worker_lost) {
    drop_worker(worker_id, outcome.result.status());
    return false;
  }
  if (!outcome.result.ok() && (generation != ps_health_.generation() || !ps_health_.status().ok())) {
    // A parameter server was lost or restored while it ran (a restarted one
    // answers NotFound until its shards are back): the run was lost, not
    // failed, and runs again (ClosureQueue re-queues Unavailable).
    outcome.result = Status::Unavailable("the run overlapped a parameter server's outage: " +
                                         outcome.result.status().to_string());
  }
  bool succeeded = outcome.result.ok();
  // Journaled from here when the program released the closure meanwhile
  // (its record goes as it completes).
  Status error = outcome.result.status();
  if (auto ended = queue_.complete(id, worker_id, std::move(outcome.result))) {
    if (*ended == ClosureQueue::State::kDone || *ended == ClosureQueue::State::kFailed) journal_finished(id, error);
    if (*ended == ClosureQueue::State::kDone) ++stats_->closures_succeeded;
    if (*ended == ClosureQueue::State::kFailed) ++stats_->closures_failed;
    if (succeeded) {
      ++closures_completed_;
      maybe_checkpoint();
    }
  }
  return true;
}

kj::Promise<void> Coordinator::lane(int64_t worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.leaving || gate_.draining()) return kj::READY_NOW;
  if (!ps_health_.status().ok() || gate_.paused()) return changes_.changed().then([this, worker_id]() { return lane(worker_id); });
  int batch = batch_size();
  auto closure = queue_.next(worker_id);
  if (!closure) return changes_.changed().then([this, worker_id]() { return lane(worker_id); });
  if (batch > 1) {
    std::vector<ClosureRun> runs;
    runs.push_back(make_run(it->second, *closure));
    while (static_cast<int>(runs.size()) < batch) {
      auto more = queue_.next(worker_id);
      if (!more) break;
      runs.push_back(make_run(it->second, *more));
    }
    if (runs.size() > 1) return run_batch(worker_id, std::move(runs));
  }
  update_stats();
  ClosureRun run = make_run(it->second, *closure);
  std::optional<std::chrono::system_clock::time_point> deadline;
  if (config_.closure_timeout.count() > 0) {
    deadline = std::chrono::system_clock::now() + config_.closure_timeout;
    run.deadline_unix_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline->time_since_epoch()).count();
  }
  int64_t id = closure->id;
  std::string function = closure->function;
  const int64_t generation = ps_health_.generation();
  auto outcome = it->second.peer->run_closure(std::move(run)).catch_([](kj::Exception&& e) {
    ClosureOutcome lost;
    lost.result = async::from_exception(e);
    lost.worker_lost = true;
    return lost;
  });
  if (config_.closure_timeout.count() > 0) {
    auto timeout = config_.closure_timeout;
    auto timed_out = [id, function, timeout]() {
      return Status::DeadlineExceeded("closure " + std::to_string(id) + " (" + function +
                                      ") did not finish within closure_timeout_ms " + std::to_string(timeout.count()));
    };
    outcome = outcome
                  .then([deadline, timed_out](ClosureOutcome finished) {
                    // The worker saw the deadline pass (its context's
                    // cancelled()) before this loop's timer fired: the run
                    // timed out all the same.
                    if (!finished.worker_lost && std::chrono::system_clock::now() >= *deadline) {
                      finished.result = timed_out();
                    }
                    return finished;
                  })
                  .exclusiveJoin(timer_.afterDelay(timeout.count() * kj::MILLISECONDS)
                                     .then([this, worker_id, id, timed_out]() {
                                       // The worker is told to stop; the lane moves on meanwhile.
                                       auto found = workers_.find(worker_id);
                                       if (found != workers_.end()) {
                                         tasks_.add(found->second.peer->cancel_closure(id).then([](Status) {}));
                                       }
                                       return ClosureOutcome{timed_out(), false};
                                     }));
  }
  return kj::mv(outcome).then([this, worker_id, id, generation](ClosureOutcome outcome) -> kj::Promise<void> {
    if (!finish_run(worker_id, id, generation, std::move(outcome))) return kj::READY_NOW;
    cancel_runs();
    changes_.notify();
    return lane(worker_id);
  });
}

kj::Promise<void> Coordinator::run_batch(int64_t worker_id, std::vector<ClosureRun> runs) {
  update_stats();
  std::vector<int64_t> ids;
  ids.reserve(runs.size());
  for (const auto& run : runs) ids.push_back(run.closure_id);
  const int64_t generation = ps_health_.generation();
  // The peer stays alive while its batch runs, even if the worker is dropped
  // meanwhile (another lane found it lost).
  std::shared_ptr<WorkerPeer> peer = workers_.at(worker_id).peer;
  size_t n = runs.size();
  return peer->run_closures(std::move(runs))
      .attach(kj::mv(peer))
      .catch_([n](kj::Exception&& e) {
        return std::vector<ClosureOutcome>(n, ClosureOutcome{async::from_exception(e), true});
      })
      .then([this, worker_id, ids = std::move(ids), generation](std::vector<ClosureOutcome> outcomes) -> kj::Promise<void> {
        if (outcomes.size() != ids.size()) {
          // A peer that answered the wrong number of outcomes cannot be
          // trusted with the others either.
          drop_worker(worker_id, Status::Internal("worker answered " + std::to_string(outcomes.size()) +
                                                  " outcomes for a batch of " + std::to_string(ids.size()) +
                                                  " closures"));
          return kj::READY_NOW;
        }
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
          // A lost worker re-queues what is left of the batch (drop_worker).
          if (!finish_run(worker_id, ids[i], generation, std::move(outcomes[i]))) return kj::READY_NOW;
        }
        for (auto it = errors.rbegin(); it != errors.rend(); ++it) {
          finish_run(worker_id, ids[*it], generation, std::move(outcomes[*it]));
        }
        cancel_runs();
        changes_.notify();
        return lane(worker_id);
      });
}

// ---- Per-worker datasets ----------------------------------------------------------

std::vector<DatasetTarget> Coordinator::dataset_targets() const {
  std::vector<DatasetTarget> out;
  out.reserve(workers_.size());
  for (const auto& [id, worker] : workers_) out.push_back({id, worker.task_index, worker.peer.get()});
  return out;
}

kj::Promise<Result<int64_t>> Coordinator::create_per_worker_dataset(std::string definition, std::string name) {
  Status valid = data::Dataset::deserialize(definition).status();
  if (!valid.ok()) return Result<int64_t>(valid.with_context("createPerWorkerDataset"));
  PerWorkerDataset dataset;
  dataset.definition = std::move(definition);
  dataset.name = std::move(name);
  return datasets_.add(std::move(dataset), dataset_targets());
}

kj::Promise<Result<int64_t>> Coordinator::create_per_worker_dataset_from_function(std::string function,
                                                                                   std::string name) {
  if (!workers_.empty() && !any_worker_has("dataset:" + function)) {
    return Result<int64_t>(Status::NotFound("create_per_worker_dataset: no worker has a dataset function named '" +
                                            function + "'"));
  }
  PerWorkerDataset dataset;
  dataset.function = std::move(function);
  dataset.name = std::move(name);
  return datasets_.add(std::move(dataset), dataset_targets());
}

// ---- Variables ---------------------------------------------------------------------

kj::Promise<Result<VariableLocation>> Coordinator::create_variable(VariableRequest request) {
  using Placed = Result<VariableLocation>;
  const std::string name = request.name;
  if (name.empty()) return Placed(Status::InvalidArgument("createVariable: empty name"));
  if (ps_.size() == 0) {
    return Placed(Status::FailedPrecondition(
        "createVariable: the coordinator has no parameter servers (set --ps or a 'ps' job)"));
  }
  if (auto until = first_contact_deadline()) {
    return changes_.changed_or(*until).then([this, request = std::move(request)]() mutable {
      return create_variable(std::move(request));
    });
  }
  Status up = ps_health_.status();
  if (!up.ok()) return Placed(up);
  if (is_mirrored(name)) {
    return Placed(Status::AlreadyExists("createVariable: '" + name +
                                        "' is a mirrored variable of a strategy; a variable lives in one place"));
  }
  return variables_.create(std::move(request));
}
kj::Promise<Result<VariableLocation>> Coordinator::create_table(EmbeddingTableSpec spec) {
  using Placed = Result<VariableLocation>;
  const std::string name = spec.name;
  if (name.empty()) return Placed(Status::InvalidArgument("createEmbeddingTable: empty name"));
  if (ps_.size() == 0) {
    return Placed(Status::FailedPrecondition(
        "createEmbeddingTable: the coordinator has no parameter servers (set --ps or a 'ps' job)"));
  }
  if (auto until = first_contact_deadline()) {
    return changes_.changed_or(*until).then([this, spec = std::move(spec)]() mutable { return create_table(std::move(spec)); });
  }
  Status up = ps_health_.status();
  if (!up.ok()) return Placed(up);
  if (is_mirrored(name)) {
    return Placed(Status::AlreadyExists("createEmbeddingTable: '" + name + "' is a mirrored variable of a strategy"));
  }
  return variables_.create_table(std::move(spec));
}

Placements Coordinator::placements() const { return variables_.placements(); }

// ---- The status page ---------------------------------------------------------------

Coordinator::Overview Coordinator::overview() const {
  Overview out;
  for (const auto& [id, w] : workers_) {
    out.workers.push_back({id, w.task_index, w.peer->address(), w.leaving});
  }
  for (int task = 0; task < ps_health_.size(); ++task) {
    Overview::PsRow row;
    row.task = task;
    row.address = ps_.address(task);
    row.state = ps_health_.describe(task);
    row.shards = variables_.shards_on(task).size();
    out.ps.push_back(std::move(row));
  }
  out.placements = placements();
  out.per_worker_datasets = datasets_.size();
  out.last_checkpoint = last_checkpoint_;
  return out;
}

// ---- Closures ----------------------------------------------------------------------

Result<int64_t> Coordinator::schedule(const std::string& function, std::string args, uint64_t client_id,
                                      int64_t request_seq) {
  client_seen(client_id);
  if (auto seen = clients_.find(client_id, request_seq)) return *seen;  // a retry: already scheduled
  if (queue_.has_error()) return take_closure_error();
  if (journal_ && !journal_->broken().ok()) return journal_->broken();
  if (gate_.draining()) return Status::Unavailable("schedule: the coordinator is shutting down (SIGTERM)");
  // Queued through a parameter server's outage when it can be recovered.
  if (!ps_pause_deadline()) CAPSTAN_RETURN_IF_ERROR(ps_health_.status());
  if (!workers_.empty() && !any_worker_has(function)) {
    // The name list is only built for the error message, off the hot path.
    std::string names;
    for (const auto& n : closure_names()) names += (names.empty() ? "" : ", ") + n;
    return Status::NotFound("schedule: no worker has a closure named '" + function +
                            "' (workers have: " + (names.empty() ? "none" : names) + ")");
  }
  // Journaled first, then queued (the queue has no pending error now, so
  // the closure gets the next id): the arguments go to the journal as they
  // are, then move into the queue.
  journal_scheduled(queue_.next_id(), function, args, client_id, request_seq);
  auto id = queue_.schedule(function, std::move(args), {client_id, request_seq});
  if (!id.ok()) return id;
  clients_.remember(client_id, request_seq, *id);
  ++stats_->closures_scheduled;
  changes_.notify();
  return id;
}

kj::Promise<void> Coordinator::queue_room() {
  if (queue_.queued() < config_.max_queued_closures) return kj::READY_NOW;
  return changes_.changed().then([this]() { return queue_room(); });
}

kj::Promise<Status> Coordinator::join() {
  if (queue_.has_error()) return take_closure_error();
  Status up = ps_health_.status();
  if (!up.ok()) {
    // A pause while a parameter server comes back and is recovered.
    auto until = ps_pause_deadline();
    if (!until) return up;
    return changes_.changed_or(*until).then([this]() { return join(); });
  }
  if (queue_.idle()) return Status::Ok();
  return changes_.changed().then([this]() { return join(); });
}

Result<bool> Coordinator::done() {
  if (queue_.has_error()) return take_closure_error();
  if (!ps_health_.status().ok()) {
    if (!ps_pause_deadline()) return ps_health_.status();
    return false;  // recovering: not done yet
  }
  return queue_.idle();
}

kj::Promise<Result<std::string>> Coordinator::fetch(int64_t closure_id) { return wait_for_value(closure_id); }

kj::Promise<Result<std::string>> Coordinator::wait_for_value(int64_t id) {
  auto state = queue_.state(id);
  if (!state.ok()) return Result<std::string>(state.status());
  if (finished(*state)) {
    // A value goes out once its closure's end is in the journal: a program
    // never holds a value whose closure a restart would run again.
    if (!journal_) return queue_.value(id);
    return journal_->synced().then([this, id](Status) { return queue_.value(id); });
  }
  Status up = ps_health_.status();
  if (!up.ok()) {
    auto until = ps_pause_deadline();
    if (!until) return Result<std::string>(up);
    return changes_.changed_or(*until).then([this, id]() { return wait_for_value(id); });
  }
  return changes_.changed().then([this, id]() { return wait_for_value(id); });
}

Status Coordinator::release(const std::vector<int64_t>& closure_ids, uint64_t client_id, uint64_t incarnation) {
  client_seen(client_id);
  if (closure_ids.size() > kMaxReleasePerCall) {
    return Status::InvalidArgument("release: " + std::to_string(closure_ids.size()) + " closure ids; at most " +
                                   std::to_string(kMaxReleasePerCall) + " per call (send the rest in another call)");
  }
  // Ids of the coordinator before a restart without a journal: other
  // closures here, not the program's to release.
  if (incarnation != 0 && incarnation != incarnation_) return Status::Ok();
  // All or none: a bad id in the middle leaves nothing half done.
  for (int64_t id : closure_ids) CAPSTAN_RETURN_IF_ERROR(queue_.check_id(id));
  for (int64_t id : closure_ids) {
    Result<bool> changed = queue_.release(id);
    if (changed.ok() && *changed) released(id);
  }
  update_stats();
  return Status::Ok();
}

void Coordinator::released(int64_t id) {
  ++stats_->closures_released;
  // Journaled for a queued or running closure too: a restarted coordinator
  // drops its value when it finishes there.
  journal_released(id);
}

void Coordinator::client_seen(uint64_t client_id) { clients_.seen(client_id, timer_.now()); }

void Coordinator::expire_clients() {
  for (uint64_t client : clients_.expire(timer_.now())) {
    std::vector<int64_t> ids = queue_.release_client(client);
    for (int64_t id : ids) released(id);
    if (!ids.empty()) {
      log_->info("client {:x} has not called for {} ms (client_grace_ms): released its {} closure value(s)", client,
                 config_.client_grace.count(), ids.size());
    }
  }
  update_stats();
}

kj::Promise<void> Coordinator::client_expiry_timer() {
  const auto period = std::clamp(config_.client_grace / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(10000));
  return timer_.afterDelay(period.count() * kj::MILLISECONDS).then([this]() {
    expire_clients();
    return client_expiry_timer();
  });
}

// ---- Checkpoints -------------------------------------------------------------------

kj::Promise<Result<int64_t>> Coordinator::export_table(std::string name, std::string since, std::string path) {
  if (auto until = first_contact_deadline()) {
    return changes_.changed_or(*until).then([this, name = std::move(name), since = std::move(since),
                                             path = std::move(path)]() mutable {
      return export_table(std::move(name), std::move(since), std::move(path));
    });
  }
  return variables_.export_table(std::move(name), std::move(since), std::move(path));
}

kj::Promise<Result<std::string>> Coordinator::save_checkpoint(std::string directory, int64_t step,
                                                              int max_to_keep) {
  using Path = Result<std::string>;
  if (directory.empty()) return Path(Status::InvalidArgument("saveCheckpoint: empty directory"));
  if (auto until = first_contact_deadline()) {
    return changes_.changed_or(*until).then([this, directory = std::move(directory), step, max_to_keep]() mutable {
      return save_checkpoint(std::move(directory), step, max_to_keep);
    });
  }
  struct Saved {
    std::shared_ptr<void> pause;  // dispatch resumes when it goes
    std::map<std::string, std::string> iterators;
  };
  auto saved = std::make_shared<Saved>();
  // Without per-worker datasets there is nothing to keep in step with the
  // variables: closures go on running meanwhile, as in TF.
  kj::Promise<void> ready = kj::READY_NOW;
  if (!datasets_.empty()) {
    ready = pause_dispatch()
                .then([this, saved](std::shared_ptr<void> pause) {
                  saved->pause = std::move(pause);
                  return datasets_.iterator_states(dataset_targets());
                })
                .then([saved](std::map<std::string, std::string> iterators) { saved->iterators = std::move(iterators); });
  }
  return ready.then([this]() { return variables_.snapshot(); })
      .then([this](Result<std::vector<VariableState>> states) -> kj::Promise<Result<std::vector<VariableState>>> {
        // The strategies' mirrored variables go into the same checkpoint.
        if (!states.ok() || strategies_.empty()) return kj::mv(states);
        return mirrored_snapshot().then(
            [states = std::move(*states)](Result<std::vector<VariableState>> mirrored) mutable
            -> Result<std::vector<VariableState>> {
              CAPSTAN_RETURN_IF_ERROR(mirrored.status());
              for (auto& m : *mirrored) states.push_back(std::move(m));
              return std::move(states);
            });
      })
      .then([this, directory, step, max_to_keep, saved](Result<std::vector<VariableState>> states) -> kj::Promise<Path> {
        saved->pause = nullptr;  // everything is read: dispatch resumes while the files are written
        if (!states.ok()) return Path(states.status());
        return async::run_on_pool(pool_, [directory, step, max_to_keep, states = std::move(*states),
                                        iterators = std::move(saved->iterators)]() {
          return write_checkpoint(directory, step, max_to_keep, states, iterators);
        });
      })
      .then([this](Path path) -> Path {
        CAPSTAN_RETURN_IF_ERROR(path.status().with_context("saveCheckpoint"));
        log_->info("saved checkpoint {}", *path);
        ++stats_->checkpoints_saved;
        set_last_checkpoint(*path);
        return path;
      });
}

kj::Promise<std::shared_ptr<void>> Coordinator::pause_dispatch() {
  std::shared_ptr<void> guard = gate_.pause([this]() { changes_.notify(); });
  return changes_.until([this]() {
           if (queue_.running() > 0) return false;
           for (const auto& [name, strategy] : strategies_) {
             if (*strategy.busy) return false;
           }
           return true;
         })
      .then([guard = std::move(guard)]() mutable { return std::move(guard); });
}

kj::Promise<Result<Coordinator::Restored>> Coordinator::restore_checkpoint(std::string path, bool strict) {
  using Reader = std::shared_ptr<checkpoint::CheckpointReader>;
  struct Read {
    int64_t step;
    std::vector<VariableState> states;
    std::vector<std::string> missing;
    MirroredRestore mirrored;
    std::map<std::string, std::string> iterators;
  };
  using Restored = Result<Read>;
  using Step = Result<Coordinator::Restored>;
  if (auto until = first_contact_deadline()) {
    return changes_.changed_or(*until).then([this, path = std::move(path), strict]() mutable {
      return restore_checkpoint(std::move(path), strict);
    });
  }
  // A parameter server that came back empty (lost) is what a restore by
  // hand is for; one that is unreachable or being recovered is not.
  if (!ps_health_.up_or_lost()) return Step(ps_health_.status());
  auto resolved = std::make_shared<std::string>();
  return async::run_on_pool(pool_, [path, resolved]() -> Result<Reader> {
           CAPSTAN_ASSIGN_OR_RETURN(*resolved, resolve_checkpoint(path));
           CAPSTAN_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::open(*resolved));
           return Reader(std::move(reader));
         })
      .then([this](Result<Reader> reader) -> kj::Promise<Result<Reader>> {
        if (!reader.ok()) return Result<Reader>(reader.status());
        // Variables the program has not created (again) get the
        // checkpoint's number of shards on the current parameter servers.
        auto is_mirrored_variable = [this](const std::string& name) { return is_mirrored(name); };
        return variables_.create_absent((*reader)->manifest(), is_mirrored_variable)
            .then([reader = *reader](Status status) -> Result<Reader> {
              CAPSTAN_RETURN_IF_ERROR(status);
              return reader;
            });
      })
      .then([this, strict](Result<Reader> reader) -> kj::Promise<Restored> {
        if (!reader.ok()) return Restored(reader.status());
        std::map<std::string, std::vector<training::MirroredSpec>> mirrored;
        for (const auto& [name, strategy] : strategies_) mirrored[name] = strategy.specs;
        return async::run_on_pool(pool_, [reader = *reader, states = variables_.layout(), strict,
                                        mirrored = std::move(mirrored)]() mutable -> Restored {
          std::vector<std::string> missing;
          CAPSTAN_RETURN_IF_ERROR(read_into(*reader, &states, strict, &missing));
          CAPSTAN_ASSIGN_OR_RETURN(MirroredRestore from, read_mirrored_checkpoint(*reader, mirrored));
          if (strict && !from.missing.empty()) {
            std::string names;
            for (const auto& n : from.missing) names += (names.empty() ? "'" : ", '") + n + "'";
            return Status::NotFound("the checkpoint has no mirrored variable " + names +
                                    " (strict restore; the default restores the variables it has and leaves these "
                                    "as they are)");
          }
          missing.insert(missing.end(), from.missing.begin(), from.missing.end());
          CAPSTAN_ASSIGN_OR_RETURN(auto iterators, read_iterator_states(*reader));
          return Read{reader->manifest().step, std::move(states), std::move(missing), std::move(from),
                      std::move(iterators)};
        });
      })
      .then([this](Restored restored) -> kj::Promise<Step> {
        if (!restored.ok()) return Step(restored.status());
        auto out = std::make_shared<Coordinator::Restored>();
        out->step = restored->step;
        out->not_in_checkpoint = std::move(restored->missing);
        auto mirrored = std::move(restored->mirrored);
        auto iterators = std::move(restored->iterators);
        auto states = std::make_shared<std::vector<VariableState>>(std::move(restored->states));
        // A parameter server that restarted gets its shards back first.
        return variables_.recreate_missing(states.get())
            .then([this, states](Status status) -> kj::Promise<Status> {
              if (!status.ok()) return status;
              return variables_.write_shards(std::move(*states));
            })
            .then([this, mirrored = std::move(mirrored)](Status status) mutable -> kj::Promise<Status> {
              if (!status.ok()) return status;
              return seed_strategies(std::move(mirrored));
            })
            .then([this, iterators = std::move(iterators), out](Status status) mutable -> kj::Promise<Status> {
              if (!status.ok()) return status;
              return datasets_.restore_iterators(std::move(iterators), dataset_targets())
                  .then([out](Result<int> restored) {
                    if (restored.ok()) out->iterators = *restored;
                    return restored.status();
                  });
            })
            .then([out](Status status) mutable -> Step {
              CAPSTAN_RETURN_IF_ERROR(status);
              return std::move(*out);
            });
      })
      .then([this, path, resolved](Step restored) -> Step {
        CAPSTAN_RETURN_IF_ERROR(restored.status().with_context("restoreCheckpoint"));
        set_last_checkpoint(*resolved);
        for (int task = 0; task < ps_.size(); ++task) {
          if (ps_health_.state(task) == PsState::kLost) {
            log_->info("parameter server ps:{} at {} has its shards again (restored by hand); dispatch resumes", task,
                       ps_.address(task));
            set_ps_state(task, PsState::kUp);
          }
        }
        std::string missing;
        for (const auto& n : restored->not_in_checkpoint) missing += (missing.empty() ? "" : ", ") + n;
        log_->info("restored checkpoint {} (step {}, {} per-worker iterator position(s)){}", path, restored->step,
                   restored->iterators, missing.empty() ? "" : "; not in it, left as they were: " + missing);
        return restored;
      });
}

Result<std::vector<std::string>> ps_addresses_of_service(const std::string& service, int64_t n) {
  std::string host;
  uint16_t port = 0;
  if (Status parsed = rpc::parse_host_port(service, &host, &port); !parsed.ok()) {
    return Status::InvalidArgument("ps_service: '" + service + "': " + parsed.message() +
                                   " (give the headless Service as NAME[.NAMESPACE.svc]:PORT)");
  }
  if (n < 1 || n > 100000) {
    return Status::InvalidArgument("num_ps: " + std::to_string(n) +
                                   " must be the parameter servers' StatefulSet replicas (at least 1) with ps_service");
  }
  const std::string statefulset = host.substr(0, host.find('.'));
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(statefulset + "-" + std::to_string(i) + "." + host + ":" + std::to_string(port));
  }
  return out;
}

}  // namespace capstan::coordinator
