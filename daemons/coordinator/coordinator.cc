#include "daemons/coordinator/coordinator.h"

#include <algorithm>
#include <random>
#include <utility>

#include "async/status_exception.h"
#include "capstan/data/dataset.h"
#include "rpc/connection.h"
#include "training/initializer.h"

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
      incarnation_([] {
        std::random_device random;
        uint64_t id = (static_cast<uint64_t>(random()) << 32) | random();
        return id == 0 ? 1 : id;
      }()),
      changes_(timer, [this]() { update_stats(); }),
      loop_{timer, tasks_, changes_, *stats_, log_},
      workers_(log_, changes_,
               [this](int64_t worker_id) {
                 times_->forget(workers_.task_index(worker_id));
                 return queue_.worker_failed(worker_id).size();
               }),
      ps_health_(parameter_servers, timer.now() + kFirstContactWindow.count() * kj::MILLISECONDS,
                 config_.ps_recovery_timeout),
      variables_(parameter_servers, ps_health_, pool, log_, config_.work_dir,
                 [this](const PlacedVariable& variable) {
                   return journal_.variable(variable, variables_.placer_counter());
                 }),
      lanes_(config_, queue_, workers_, ps_health_, variables_, gate_, loop_,
             {[this]() { update_stats(); },
              [this](int64_t id, ClosureQueue::State state, const Status& error) { closure_ended(id, state, error); }},
             *times_),
      strategies_(workers_, variables_, gate_, loop_, pool_, *times_),
      policy_(config_, loop_, ps_health_, journal_,
              [this](std::string directory, int64_t step, int max_to_keep) {
                return save_checkpoint(std::move(directory), step, max_to_keep);
              }),
      recovery_(config_, parameter_servers, ps_health_, variables_, policy_, pool, loop_),
      clients_(config_.client_grace),
      datasets_(config_.expected_workers, log_,
                [this](int64_t id, const PerWorkerDataset& dataset) { return journal_.dataset(id, dataset); }),
      checkpoints_(variables_, strategies_, datasets_, workers_, pool, [this]() { return pause_dispatch(); }),
      tasks_(*this) {
  recovery_.start();
  policy_.start();
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
  const Worker& added = workers_.add(task_index, std::move(functions), std::move(peer));
  int64_t id = added.id;
  // Its per-worker iterators first, then closures.
  return datasets_.send_all({id, added.task_index, added.peer.get()}, workers_.size()).then([this, id]() {
    lanes_.start(id);
    changes_.notify();
    return id;
  });
}

int Coordinator::worker_task_index(int64_t worker_id) const { return workers_.task_index(worker_id); }

bool Coordinator::worker_alive(int64_t worker_id) const { return workers_.alive(worker_id); }

std::set<std::string> Coordinator::closure_names() const { return workers_.functions(); }

kj::Promise<Status> Coordinator::leave_worker(int64_t worker_id, std::string reason) {
  if (reason.size() > 1024) return Status::InvalidArgument("leaveWorker: reason longer than 1 KiB");
  Worker* worker = workers_.find(worker_id);
  if (worker == nullptr) {
    return Status::NotFound("leaveWorker: no worker " + std::to_string(worker_id) +
                            " (it was dropped, or registered with another coordinator)");
  }
  worker->leaving = true;
  log_->info("worker {} (task {}) is leaving ({}): no more closures; waiting for its {} running closure(s)", worker_id,
             worker->task_index, reason, queue_.running_on(worker_id));
  changes_.notify();  // its idle lanes end
  auto idle = [this, worker_id]() {
    if (!workers_.alive(worker_id)) return true;  // dropped meanwhile
    return queue_.running_on(worker_id) == 0 && !strategies_.busy_with(worker_id);
  };
  std::string why = "worker " + std::to_string(worker_id) + " leaving";
  return changes_.until(idle)
      .then([this, why]() { return policy_.before_leaving(why); })
      .then([this, worker_id, reason]() {
        const Worker* found = workers_.find(worker_id);
        if (found == nullptr) return Status::Ok();
        int task = found->task_index;
        workers_.remove(worker_id);
        log_->info("worker {} (task {}) left ({}); its closures finished", worker_id, task, reason);
        changes_.notify();
        return Status::Ok();
      });
}

kj::Promise<void> Coordinator::drain(std::string reason) {
  gate_.drain();
  log_->info("{}: no more dispatch; waiting for {} running closure(s); {} queued closure(s) {}", reason,
             queue_.running(), queue_.queued(),
             durable() ? "stay in the journal and run when the coordinator restarts with its work_dir"
                       : "will not run (no work_dir)");
  changes_.notify();
  return changes_.until([this]() { return queue_.running() == 0 && !strategies_.busy(); })
      // The ends of the closures that finished are in the journal before
      // the process goes, so that a restart does not run them again.
      .then([this]() { return journal_synced().ignoreResult(); })
      .then([this, reason]() { return policy_.before_leaving(reason); });
}

void Coordinator::closure_ended(int64_t id, ClosureQueue::State state, const Status& error) {
  if (state == ClosureQueue::State::kDone || state == ClosureQueue::State::kFailed) {
    journal_.finished(id, error, queue_);
  }
  if (state == ClosureQueue::State::kDone) ++stats_->closures_succeeded;
  if (state == ClosureQueue::State::kFailed) ++stats_->closures_failed;
  if (state == ClosureQueue::State::kDone) policy_.closure_succeeded();
}

// ---- Per-worker datasets ----------------------------------------------------------

kj::Promise<Result<int64_t>> Coordinator::create_per_worker_dataset(std::string definition, std::string name) {
  Status valid = data::Dataset::deserialize(definition).status();
  if (!valid.ok()) return Result<int64_t>(valid.with_context("createPerWorkerDataset"));
  PerWorkerDataset dataset;
  dataset.definition = std::move(definition);
  dataset.name = std::move(name);
  return datasets_.add(std::move(dataset), workers_.targets());
}

kj::Promise<Result<int64_t>> Coordinator::create_per_worker_dataset_from_function(std::string function,
                                                                                   std::string name) {
  if (!workers_.empty() && !workers_.any_has("dataset:" + function)) {
    return Result<int64_t>(Status::NotFound("create_per_worker_dataset: no worker has a dataset function named '" +
                                            function + "'"));
  }
  PerWorkerDataset dataset;
  dataset.function = std::move(function);
  dataset.name = std::move(name);
  return datasets_.add(std::move(dataset), workers_.targets());
}

// ---- Variables ---------------------------------------------------------------------

namespace {

// What a createVariable request must hold (see Coordinator::create_variable).
Status check_variable_request(const VariableRequest& request) {
  const std::string what = "createVariable '" + request.name + "': ";
  const bool has_initializer = request.initializer.kind != Initializer::Kind::kNone;
  if (request.initial.valid()) {
    if (has_initializer) {
      return Status::InvalidArgument(what + "both an initial value and initializer " +
                                     training::initializer_debug_string(request.initializer) +
                                     " given; drop one of them");
    }
    if (request.value_from_program) {
      return Status::InvalidArgument(what + "an initial value given with valueFromProgram; drop one of them");
    }
    return Status::Ok();
  }
  if (has_initializer && request.value_from_program) {
    return Status::InvalidArgument(what + "initializer " + training::initializer_debug_string(request.initializer) +
                                   " given with valueFromProgram; drop one of them");
  }
  if (!has_initializer && !request.value_from_program) {
    return Status::InvalidArgument(what + "no initial value and no initializer; give one of them");
  }
  for (int64_t d : request.shape) {
    if (d < 0) return Status::InvalidArgument(what + "shape " + shape_string(request.shape) + " has a negative dim");
  }
  // The element count and the bytes must fit in 63 bits.
  const uint64_t limit = uint64_t{1} << 62;
  uint64_t elements = 1;
  for (int64_t d : request.shape) {
    if (d != 0 && elements > limit / static_cast<uint64_t>(d)) {
      return Status::InvalidArgument(what + "shape " + shape_string(request.shape) + " is too large");
    }
    elements *= static_cast<uint64_t>(d);
  }
  if (request.dtype == DType::kInvalid || request.dtype == DType::kString ||
      elements > limit / std::max<size_t>(1, dtype_size(request.dtype))) {
    if (request.dtype == DType::kInvalid || request.dtype == DType::kString) {
      return Status::InvalidArgument(what + "a variable cannot be " + std::string(dtype_name(request.dtype)));
    }
    return Status::InvalidArgument(what + "shape " + shape_string(request.shape) + " is too large");
  }
  const Initializer& init = has_initializer ? request.initializer : Initializer::zeros();
  return training::validate_initializer(init, request.dtype).with_context("createVariable '" + request.name + "'");
}

}  // namespace

kj::Promise<Result<VariableLocation>> Coordinator::create_variable(VariableRequest request) {
  using Placed = Result<VariableLocation>;
  const std::string name = request.name;
  if (name.empty()) return Placed(Status::InvalidArgument("createVariable: empty name"));
  if (Status checked = check_variable_request(request); !checked.ok()) return Placed(checked);
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
  if (strategies_.is_mirrored(name)) {
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
    return changes_.changed_or(*until).then(
        [this, spec = std::move(spec)]() mutable { return create_table(std::move(spec)); });
  }
  Status up = ps_health_.status();
  if (!up.ok()) return Placed(up);
  if (strategies_.is_mirrored(name)) {
    return Placed(Status::AlreadyExists("createEmbeddingTable: '" + name + "' is a mirrored variable of a strategy"));
  }
  return variables_.create_table(std::move(spec));
}

Placements Coordinator::placements() const { return variables_.placements(); }

// ---- The status page ---------------------------------------------------------------

Coordinator::Overview Coordinator::overview() const {
  Overview out;
  for (const auto& [id, w] : workers_.all()) {
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
  out.last_checkpoint = policy_.last();
  return out;
}

// ---- Closures ----------------------------------------------------------------------

Result<int64_t> Coordinator::schedule(const std::string& function, std::string args, uint64_t client_id,
                                      int64_t request_seq) {
  client_seen(client_id);
  if (auto seen = clients_.find(client_id, request_seq)) return *seen;  // a retry: already scheduled
  if (queue_.has_error()) return take_closure_error();
  if (Status broken = journal_.broken(); !broken.ok()) return broken;
  if (gate_.draining()) return Status::Unavailable("schedule: the coordinator is shutting down (SIGTERM)");
  // Queued through a parameter server's outage when it can be recovered.
  if (!recovery_.pause_deadline()) CAPSTAN_RETURN_IF_ERROR(ps_health_.status());
  if (!workers_.empty() && !workers_.any_has(function)) {
    // The name list is only built for the error message, off the hot path.
    std::string names;
    for (const auto& n : closure_names()) names += (names.empty() ? "" : ", ") + n;
    return Status::NotFound("schedule: no worker has a closure named '" + function +
                            "' (workers have: " + (names.empty() ? "none" : names) + ")");
  }
  // Journaled first, then queued (the queue has no pending error now, so
  // the closure gets the next id): the arguments go to the journal as they
  // are, then move into the queue.
  journal_.scheduled(queue_.next_id(), function, args, {client_id, request_seq});
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
    auto until = recovery_.pause_deadline();
    if (!until) return up;
    return changes_.changed_or(*until).then([this]() { return join(); });
  }
  if (queue_.idle()) return Status::Ok();
  return changes_.changed().then([this]() { return join(); });
}

Result<bool> Coordinator::done() {
  if (queue_.has_error()) return take_closure_error();
  if (!ps_health_.status().ok()) {
    if (!recovery_.pause_deadline()) return ps_health_.status();
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
    if (!journal_.durable()) return queue_.value(id);
    return journal_.synced().then([this, id](Status) { return queue_.value(id); });
  }
  Status up = ps_health_.status();
  if (!up.ok()) {
    auto until = recovery_.pause_deadline();
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
  journal_.released(id);
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
  const auto period =
      std::clamp(config_.client_grace / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(10000));
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
  return checkpoints_.save(std::move(directory), step, max_to_keep).then([this](Path path) -> Path {
    CAPSTAN_RETURN_IF_ERROR(path.status().with_context("saveCheckpoint"));
    const ModelCheckpoints::SaveTimes& took = checkpoints_.last_save();
    log_->info("saved checkpoint {} in {:.0f} ms (dispatch paused {:.1f} ms for it)", *path, took.total_ms,
               took.pause_ms);
    ++stats_->checkpoints_saved;
    policy_.set_last(*path);
    return path;
  });
}

kj::Promise<std::shared_ptr<void>> Coordinator::pause_dispatch() {
  std::shared_ptr<void> guard = gate_.pause([this]() { changes_.notify(); });
  return changes_.until([this]() { return queue_.running() == 0 && !strategies_.busy(); })
      .then([guard = std::move(guard)]() mutable { return std::move(guard); });
}

kj::Promise<Result<Coordinator::Restored>> Coordinator::restore_checkpoint(std::string path, bool strict) {
  using Out = Result<Restored>;
  if (auto until = first_contact_deadline()) {
    return changes_.changed_or(*until).then([this, path = std::move(path), strict]() mutable {
      return restore_checkpoint(std::move(path), strict);
    });
  }
  // A parameter server that came back empty (lost) is what a restore by
  // hand is for; one that is unreachable or being recovered is not.
  if (!ps_health_.up_or_lost()) return Out(ps_health_.status());
  return checkpoints_.restore(path, strict).then([this, path](Out restored) -> Out {
    CAPSTAN_RETURN_IF_ERROR(restored.status().with_context("restoreCheckpoint"));
    policy_.set_last(restored->path);
    recovery_.restored_by_hand();
    std::string missing;
    for (const auto& n : restored->not_in_checkpoint) missing += (missing.empty() ? "" : ", ") + n;
    log_->info("restored checkpoint {} (step {}, {} per-worker iterator position(s)){}", path, restored->step,
               restored->iterators, missing.empty() ? "" : "; not in it, left as they were: " + missing);
    return restored;
  });
}

// ---- Synchronous training -----------------------------------------------------------

Status Coordinator::create_strategy(const std::string& name, std::vector<MirroredVariableInit> variables,
                                    StrategyConfig config) {
  return strategies_.create(name, std::move(variables), config);
}

kj::Promise<Result<StepOutcome>> Coordinator::run_step(std::string strategy, std::string function, std::string args) {
  return strategies_.run_step(std::move(strategy), std::move(function), std::move(args));
}

kj::Promise<Result<int64_t>> Coordinator::distribute_step_input(std::string strategy, std::string definition,
                                                                StepInputConfig config) {
  using Out = Result<int64_t>;
  Status valid = data::Dataset::deserialize(definition).status();
  if (!valid.ok()) return Out(valid.with_context("distributeStepInput"));
  // Checked before the dataset is added: set_input below then only fails
  // for a strategy that went away meanwhile.
  config.dataset_id = 0;
  if (!strategies_.has(strategy)) return Out(Status::NotFound("distributeStepInput: no strategy named '" + strategy + "'"));
  Status checked = Strategies::check_input(strategy, config);
  if (!checked.ok()) return Out(checked);
  PerWorkerDataset dataset;
  dataset.definition = std::move(definition);
  dataset.name = "step-input/" + strategy;
  dataset.step_input = true;
  return datasets_.add(std::move(dataset), workers_.targets())
      .then([this, strategy, config](Out id) mutable -> Out {
        CAPSTAN_RETURN_IF_ERROR(id.status());
        config.dataset_id = *id;
        CAPSTAN_RETURN_IF_ERROR(strategies_.set_input(strategy, config));
        return id;
      });
}

kj::Promise<Result<std::pair<Tensor, int64_t>>> Coordinator::read_mirrored(std::string strategy, std::string variable) {
  return strategies_.read_mirrored(std::move(strategy), std::move(variable));
}

kj::Promise<Result<StrategyStatus>> Coordinator::strategy_status(std::string strategy) {
  return strategies_.status(std::move(strategy));
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
