#include "daemons/data_dispatcher/dispatcher.h"

#include <functional>
#include <set>

#include "data/compression.h"
#include "data/sharding.h"
#include "io/durable_file.h"

namespace capstan::data_dispatcher {
namespace {

// FNV-1a: a stable fingerprint of a definition's bytes (the same across runs).
uint64_t fingerprint(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

data::ShardingPolicy sharding_for(ProcessingMode m) {
  switch (m) {
    case ProcessingMode::kFile: return data::ShardingPolicy::kFile;
    case ProcessingMode::kData: return data::ShardingPolicy::kData;
    case ProcessingMode::kFileOrData: return data::ShardingPolicy::kFileOrData;
    case ProcessingMode::kHint: return data::ShardingPolicy::kHint;
    default: return data::ShardingPolicy::kOff;
  }
}

bool is_static(ProcessingMode m) {
  return m == ProcessingMode::kFile || m == ProcessingMode::kData || m == ProcessingMode::kFileOrData ||
         m == ProcessingMode::kHint;
}

std::string mode_name(ProcessingMode m) { return std::string(processing_mode_name(m)); }

}  // namespace

int64_t SystemDispatcherClock::wall_micros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Dispatcher::Dispatcher(DispatcherConfig config, std::shared_ptr<spdlog::logger> log, DispatcherClock& clock,
                       io::FileSystem& fs)
    : config_(std::move(config)), log_(std::move(log)), clock_(clock), fs_(fs) {}

Result<std::unique_ptr<Dispatcher>> Dispatcher::open(DispatcherConfig config, std::shared_ptr<spdlog::logger> log,
                                                     DispatcherClock& clock, io::FileSystem& fs) {
  std::unique_ptr<Dispatcher> dispatcher(new Dispatcher(std::move(config), std::move(log), clock, fs));
  if (!dispatcher->config_.work_dir.empty()) CAPSTAN_RETURN_IF_ERROR(dispatcher->replay());
  return dispatcher;
}

Status Dispatcher::replay() {
  const std::string& work_dir = config_.work_dir;
  if (Status made = io::create_dirs(fs_, work_dir + "/datasets", /*sync=*/true); !made.ok()) {
    return Status::FailedPrecondition("work_dir '" + work_dir + "': " + made.message());
  }
  auto records = journal::read_all(work_dir + "/journal", fs_);
  if (!records.ok()) return records.status().with_context("replaying the journal");
  int64_t applied = 0;
  for (const auto& record : *records) {
    auto update = decode(record);
    if (!update.ok()) {
      return Status::DataLoss("journal record " + std::to_string(applied) + ": " + update.status().message());
    }
    // An update the state refused when it was first applied is refused
    // again, identically: that keeps the replay faithful.
    (void)state_.apply(*update);
    ++applied;
  }
  for (const auto* dataset : state_.list_datasets()) {
    auto bytes = io::read_file(fs_, work_dir + "/datasets/" + dataset->dataset_id);
    if (!bytes.ok()) {
      return Status::DataLoss("the definition of dataset " + dataset->dataset_id + " is missing from " + work_dir +
                              "/datasets (" + bytes.status().message() + ")");
    }
    definitions_[dataset->dataset_id] = std::move(*bytes);
  }
  auto writer = journal::JournalWriter::open(work_dir + "/journal", /*sync=*/true, 64 << 20, fs_);
  if (!writer.ok()) return writer.status().with_context("opening the journal");
  journal_ = std::make_unique<journal::GroupCommitter>(std::move(*writer));
  if (log_) log_->info("fault-tolerant mode: replayed {} journal record(s) from {}", applied, work_dir);
  // Workers and clients get their grace period from now.
  for (const auto* worker : state_.list_workers()) worker_seen_[worker->address] = clock_.steady_now();
  for (int64_t client : state_.list_active_job_client_ids()) client_seen_[client] = clock_.steady_now();
  return Status::Ok();
}

Status Dispatcher::apply(const Update& update) {
  if (journal_) {
    // After a failed fsync the journal no longer matches the state: refuse
    // changes (LevelDB's DBImpl::Write).
    CAPSTAN_RETURN_IF_ERROR(journal_->health());
    journal_->enqueue(encode(update));
  }
  return state_.apply(update);
}

Result<data::Dataset> Dispatcher::dataset(const std::string& dataset_id) const {
  auto it = definitions_.find(dataset_id);
  if (it == definitions_.end()) return Status::NotFound("no dataset with id '" + dataset_id + "'");
  return data::Dataset::deserialize(it->second);
}

// ---- Datasets ---------------------------------------------------------------------

Result<std::string> Dispatcher::register_dataset(const std::string& definition, const std::string& compression_name) {
  auto compression = data::parse_compression(compression_name);
  if (!compression.ok()) return compression.status().with_context("registerDataset");
  auto parsed = data::Dataset::deserialize(definition);
  if (!parsed.ok()) return parsed.status().with_context("registerDataset");
  // AUTO keeps the fingerprints (and ids) datasets had before compression.
  uint64_t fp = fingerprint(*compression == wire::ElementCompression::AUTO
                                ? definition
                                : definition + "\ncompression=" + data::compression_name(*compression));
  if (auto existing = state_.dataset_for_fingerprint(fp); existing.ok()) return (*existing)->dataset_id;
  std::string id = state_.next_available_dataset_id();
  if (!config_.work_dir.empty()) {
    // The definition is durable before the journal names it.
    CAPSTAN_RETURN_IF_ERROR(io::write_file_durably(fs_, config_.work_dir + "/datasets/" + id, definition));
  }
  CAPSTAN_RETURN_IF_ERROR(apply(RegisterDataset{id, fp, *compression}));
  definitions_[id] = definition;
  if (log_) {
    log_->info("registered dataset {} ({}), compression {}", id, parsed->debug_string(),
               data::compression_name(*compression));
  }
  return id;
}

Result<std::string> Dispatcher::dataset_definition(const std::string& dataset_id) const {
  auto it = definitions_.find(dataset_id);
  if (it == definitions_.end()) return Status::NotFound("no dataset with id '" + dataset_id + "'");
  return it->second;
}

// ---- Jobs and clients --------------------------------------------------------------

Result<JobClient> Dispatcher::get_or_create_job(const GetOrCreateJobRequest& request) {
  const std::string& dataset_id = request.dataset_id;
  const std::string& job_name = request.job_name;
  const ProcessingMode mode = request.processing_mode;
  const int64_t num_consumers = request.num_consumers;
  const bool cache = request.cross_trainer_cache;
  CAPSTAN_ASSIGN_OR_RETURN(data::Dataset ds, dataset(dataset_id));
  if (num_consumers < 0) {
    return Status::InvalidArgument("num_consumers must not be negative, got " + std::to_string(num_consumers));
  }
  if (num_consumers > 0 && ds.cardinality() != data::kInfiniteCardinality) {
    return Status::FailedPrecondition(
        "coordinated reads (num_consumers " + std::to_string(num_consumers) + ") need an infinite dataset; dataset " +
        dataset_id + " has cardinality " +
        (ds.cardinality() == data::kUnknownCardinality ? std::string("unknown") : std::to_string(ds.cardinality())));
  }
  if (cache && job_name.empty()) return Status::InvalidArgument("the cross-trainer cache needs a named job");
  int64_t num_split_providers = 0;
  if (mode == ProcessingMode::kDynamic) {
    auto providers = ds.make_split_providers();
    if (!providers.ok()) return providers.status().with_context("DYNAMIC sharding");
    num_split_providers = static_cast<int64_t>(providers->size());
  }
  std::optional<int64_t> job_id;
  if (!job_name.empty()) {
    auto existing = state_.job_for_name(job_name);
    if (existing.ok() && !(*existing)->garbage_collected) {
      const DispatcherState::Job* job = *existing;
      if (job->dataset_id != dataset_id || job->processing_mode != mode || job->num_consumers != num_consumers ||
          job->cross_trainer_cache != cache) {
        return Status::InvalidArgument("job '" + job_name + "' exists with other parameters (dataset " +
                                       job->dataset_id + ", mode " + mode_name(job->processing_mode) +
                                       ", num_consumers " + std::to_string(job->num_consumers) +
                                       "); asked for dataset " + dataset_id + ", mode " + mode_name(mode) +
                                       ", num_consumers " + std::to_string(num_consumers));
      }
      job_id = job->job_id;
    }
  }
  if (!job_id) {
    if (is_static(mode)) {
      // Static sharding needs every worker that will read: check it fits now.
      auto workers = state_.list_workers();
      if (workers.empty()) {
        return Status::FailedPrecondition(mode_name(mode) + " sharding needs registered data workers; none yet");
      }
      CAPSTAN_RETURN_IF_ERROR(data::apply_sharding(ds, sharding_for(mode), static_cast<int64_t>(workers.size()), 0)
                                  .status()
                                  .with_context(mode_name(mode) + " sharding"));
    }
    CreateJob create;
    create.job_id = state_.next_available_job_id();
    create.dataset_id = dataset_id;
    create.job_name = job_name;
    create.processing_mode = mode;
    create.num_consumers = num_consumers;
    create.num_split_providers = num_split_providers;
    create.cross_trainer_cache = cache;
    CAPSTAN_RETURN_IF_ERROR(apply(create));
    CAPSTAN_RETURN_IF_ERROR(create_tasks(create.job_id));
    job_id = create.job_id;
    if (log_) {
      log_->info("created job {} ({}) over dataset {}, mode {}", create.job_id,
                 job_name.empty() ? "anonymous" : "'" + job_name + "'", dataset_id, mode_name(mode));
    }
  }
  int64_t client_id = state_.next_available_job_client_id();
  CAPSTAN_RETURN_IF_ERROR(apply(AcquireJobClient{client_id, *job_id}));
  client_seen_[client_id] = clock_.steady_now();
  return JobClient{*job_id, client_id};
}

Status Dispatcher::create_tasks(int64_t job_id) {
  CAPSTAN_ASSIGN_OR_RETURN(const DispatcherState::Job* job, state_.job_from_id(job_id));
  if (job->finished || job->garbage_collected) return Status::Ok();
  CAPSTAN_ASSIGN_OR_RETURN(auto existing, state_.tasks_for_job(job_id));
  // Statically sharded jobs are split over the workers present at creation.
  if (is_static(job->processing_mode) && !existing.empty()) return Status::Ok();
  std::set<std::string> covered;
  for (const auto* task : existing) covered.insert(task->worker_address);
  std::vector<std::string> addresses;
  for (const auto* worker : state_.list_workers()) addresses.push_back(worker->address);
  const SteadyTime now = clock_.steady_now();
  for (const std::string& address : addresses) {
    if (covered.count(address) != 0 || !alive(address, now)) continue;
    CAPSTAN_RETURN_IF_ERROR(apply(CreateTask{state_.next_available_task_id(), job_id, address}));
  }
  return Status::Ok();
}

bool Dispatcher::alive(const std::string& address, SteadyTime now) const {
  auto seen = worker_seen_.find(address);
  return seen != worker_seen_.end() && now - seen->second <= config_.worker_timeout;
}

Status Dispatcher::reassign_lost_tasks() {
  const SteadyTime now = clock_.steady_now();
  std::vector<std::string> lost;
  std::map<std::string, size_t> load;  // live workers: their unfinished tasks
  for (const auto* worker : state_.list_workers()) {
    if (!alive(worker->address, now)) {
      lost.push_back(worker->address);
      continue;
    }
    CAPSTAN_ASSIGN_OR_RETURN(auto tasks, state_.tasks_for_worker(worker->address));
    load[worker->address] = tasks.size();
  }
  std::set<int64_t> waiting;
  for (const std::string& address : lost) {
    CAPSTAN_ASSIGN_OR_RETURN(auto tasks, state_.tasks_for_worker(address));
    std::vector<std::pair<int64_t, int64_t>> movable;  // task, job
    for (const auto* task : tasks) {
      // A pending task (coordinated reads) has served nothing: it is never
      // activated on a lost worker, and the consumers go on without it.
      if (!task->finished && !task->pending) movable.emplace_back(task->task_id, task->job_id);
    }
    if (lost_workers_.insert(address).second && log_) {
      log_->warn("data worker {} sent no heartbeat for over {} ms (worker_timeout_ms): lost; {} task(s) to move",
                 address, config_.worker_timeout.count(), movable.size());
    }
    for (auto [task_id, job_id] : movable) {
      if (load.empty()) {
        waiting.insert(task_id);
        if (waiting_tasks_.count(task_id) == 0 && log_) {
          log_->warn("task {} (job {}) of lost data worker {} waits for a live data worker: none is heartbeating",
                     task_id, job_id, address);
        }
        continue;
      }
      auto target = std::min_element(load.begin(), load.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
      CAPSTAN_RETURN_IF_ERROR(apply(ReassignTask{task_id, target->first}));
      ++target->second;
      ++tasks_reassigned_;
      if (log_) {
        log_->info("task {} (job {}) moved from lost data worker {} to {}: it replays its splits there", task_id,
                   job_id, address, target->first);
      }
    }
  }
  waiting_tasks_ = std::move(waiting);
  return Status::Ok();
}

Status Dispatcher::release_job_client(int64_t job_client_id) {
  CAPSTAN_RETURN_IF_ERROR(apply(ReleaseJobClient{job_client_id, clock_.wall_micros()}));
  client_seen_.erase(job_client_id);
  return Status::Ok();
}

Result<ClientHeartbeatResponse> Dispatcher::client_heartbeat(int64_t job_client_id, uint64_t known_tasks) {
  CAPSTAN_ASSIGN_OR_RETURN(const DispatcherState::Job* job, state_.job_for_job_client_id(job_client_id));
  client_seen_[job_client_id] = clock_.steady_now();
  CAPSTAN_ASSIGN_OR_RETURN(auto tasks, state_.tasks_for_job(job->job_id));
  ClientHeartbeatResponse response;
  response.job_finished = job->finished;
  // Everything a TaskInfo carries, in list order (SplitMix64 steps; strings
  // through std::hash): hashing the list costs a fraction of sending it.
  auto mix = [](uint64_t h, uint64_t v) {
    h = (h ^ v) + 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
  };
  uint64_t fingerprint = mix(mix(static_cast<uint64_t>(job->job_id), std::hash<std::string>{}(job->dataset_id)),
                             tasks.size());
  for (const auto* task : tasks) {
    fingerprint = mix(fingerprint, static_cast<uint64_t>(task->task_id));
    fingerprint = mix(fingerprint, std::hash<std::string>{}(task->worker_address));
    fingerprint = mix(fingerprint, waiting_tasks_.count(task->task_id));
  }
  response.tasks_fingerprint = fingerprint == 0 ? 1 : fingerprint;  // 0 means "none known"
  response.interval = heartbeat_interval();
  if (known_tasks == response.tasks_fingerprint) {
    response.unchanged = true;
    return response;
  }
  response.tasks.reserve(tasks.size());
  for (const auto* task : tasks) {
    response.tasks.push_back(TaskInfo{task->task_id, task->job_id, task->worker_address, job->dataset_id,
                                      waiting_tasks_.count(task->task_id) != 0});
  }
  return response;
}

// ---- Workers and tasks ----------------------------------------------------------------

std::chrono::milliseconds Dispatcher::heartbeat_interval() const {
  if (config_.max_heartbeats_per_s <= 0) return std::chrono::milliseconds(0);
  const auto live_workers = static_cast<int64_t>(worker_seen_.size() - std::min(worker_seen_.size(), lost_workers_.size()));
  const int64_t senders = live_workers + static_cast<int64_t>(client_seen_.size());
  const auto cap = std::min(config_.worker_timeout, config_.client_timeout) / 4;
  return std::min(std::chrono::milliseconds(senders * 1000 / config_.max_heartbeats_per_s), cap);
}

Result<TaskDef> Dispatcher::task_def(const DispatcherState::Task& task) const {
  CAPSTAN_ASSIGN_OR_RETURN(const DispatcherState::Job* job, state_.job_from_id(task.job_id));
  CAPSTAN_ASSIGN_OR_RETURN(data::Dataset ds, dataset(job->dataset_id));
  CAPSTAN_ASSIGN_OR_RETURN(auto tasks, state_.tasks_for_job(task.job_id));
  int64_t num_workers = static_cast<int64_t>(tasks.size());
  int64_t index = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (tasks[i]->task_id == task.task_id) index = static_cast<int64_t>(i);
  }
  if (is_static(job->processing_mode)) {
    CAPSTAN_ASSIGN_OR_RETURN(ds, data::apply_sharding(ds, sharding_for(job->processing_mode), num_workers, index));
  }
  TaskDef def;
  def.task_id = task.task_id;
  def.job_id = task.job_id;
  def.dataset_id = job->dataset_id;
  def.definition = ds.serialize();
  def.processing_mode = job->processing_mode;
  def.num_consumers = job->num_consumers;
  CAPSTAN_ASSIGN_OR_RETURN(const DispatcherState::Dataset* registered, state_.dataset_from_id(job->dataset_id));
  def.compression = registered->compression;
  def.num_workers = num_workers;
  def.worker_index = index;
  def.cross_trainer_cache = job->cross_trainer_cache;
  def.cross_trainer_cache_bytes = kCrossTrainerCacheBytes;
  def.num_split_providers = job->num_split_providers;
  return def;
}

Result<WorkerHeartbeatResponse> Dispatcher::worker_heartbeat(const std::string& address,
                                                             const std::vector<int64_t>& current_tasks) {
  if (address.empty()) return Status::InvalidArgument("workerHeartbeat: empty worker address");
  bool known = state_.worker_from_address(address).ok();
  if (!known) {
    CAPSTAN_RETURN_IF_ERROR(apply(RegisterWorker{address, address, {}}));
    if (log_) log_->info("data worker {} registered", address);
  }
  worker_seen_[address] = clock_.steady_now();
  const bool returning = lost_workers_.erase(address) > 0;
  if (returning && log_) log_->info("data worker {} heartbeats again: live", address);
  if (!known || returning) {
    // A new worker joins the jobs that can take it (OFF and DYNAMIC); a lost
    // one that came back only the DYNAMIC ones: its OFF tasks moved on, and
    // a new OFF task would read its data a second time.
    std::vector<int64_t> joinable;
    for (const auto* job : state_.list_jobs()) {
      if (!job->finished && !job->garbage_collected && !is_static(job->processing_mode) &&
          (!returning || job->is_dynamic())) {
        joinable.push_back(job->job_id);
      }
    }
    for (int64_t job_id : joinable) CAPSTAN_RETURN_IF_ERROR(create_tasks(job_id));
  }
  // Tasks waiting for a live worker: this one takes them now.
  if (!waiting_tasks_.empty()) CAPSTAN_RETURN_IF_ERROR(reassign_lost_tasks());
  std::set<int64_t> current(current_tasks.begin(), current_tasks.end());
  CAPSTAN_ASSIGN_OR_RETURN(auto tasks, state_.tasks_for_worker(address));
  WorkerHeartbeatResponse response;
  std::set<int64_t> live;
  for (const auto* task : tasks) {
    if (task->finished) continue;
    live.insert(task->task_id);
    if (current.count(task->task_id) == 0) {
      CAPSTAN_ASSIGN_OR_RETURN(TaskDef def, task_def(*task));
      response.new_tasks.push_back(std::move(def));
    }
  }
  for (int64_t id : current) {
    if (live.count(id) == 0) response.tasks_to_delete.push_back(id);
  }
  response.interval = heartbeat_interval();
  return response;
}

Status Dispatcher::finish_task(int64_t task_id) {
  CAPSTAN_ASSIGN_OR_RETURN(const DispatcherState::Task* task, state_.task_from_id(task_id));
  if (task->finished) return Status::Ok();
  int64_t job_id = task->job_id;
  CAPSTAN_RETURN_IF_ERROR(apply(FinishTask{task_id}));
  std::erase_if(replays_, [job_id, task_id](const auto& entry) {
    return std::get<0>(entry.first) == job_id && std::get<2>(entry.first) == task_id;
  });
  return Status::Ok();
}

Result<std::optional<Element>> Dispatcher::split_at(const DispatcherState::Job& job, int64_t index,
                                                    int64_t repetition, int64_t split_index, Splits& cursor) {
  if (!cursor.provider || cursor.repetition != repetition || cursor.position > split_index) {
    CAPSTAN_ASSIGN_OR_RETURN(data::Dataset ds, dataset(job.dataset_id));
    CAPSTAN_ASSIGN_OR_RETURN(auto providers, ds.make_split_providers());
    if (static_cast<size_t>(index) >= providers.size()) {
      return Status::Internal("dataset " + job.dataset_id + " has " + std::to_string(providers.size()) +
                              " split providers, job " + std::to_string(job.job_id) + " expects " +
                              std::to_string(job.num_split_providers));
    }
    cursor.provider = std::move(providers[static_cast<size_t>(index)]);
    cursor.repetition = repetition;
    cursor.position = 0;
  }
  for (; cursor.position < split_index; ++cursor.position) {
    CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> skipped, cursor.provider->get_next());
    if (!skipped.has_value()) {
      return Status::DataLoss("split " + std::to_string(split_index) + " of provider " + std::to_string(index) +
                              " of job " + std::to_string(job.job_id) + " was handed out, but dataset " +
                              job.dataset_id + " now has only " + std::to_string(cursor.position) +
                              " splits: its source changed");
    }
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> split, cursor.provider->get_next());
  if (split.has_value()) ++cursor.position;
  return split;
}

Result<SplitResponse> Dispatcher::get_split(int64_t job_id, int64_t repetition, int64_t index, int64_t task_id,
                                            int64_t sequence) {
  CAPSTAN_ASSIGN_OR_RETURN(const DispatcherState::Job* job, state_.job_from_id(job_id));
  if (!job->is_dynamic()) return Status::FailedPrecondition("job " + std::to_string(job_id) + " is not DYNAMIC");
  CAPSTAN_ASSIGN_OR_RETURN(DispatcherState::SplitState progress, state_.split_state(job_id, index));
  CAPSTAN_ASSIGN_OR_RETURN(const DispatcherState::Task* task, state_.task_from_id(task_id));
  if (task->job_id != job_id) {
    return Status::InvalidArgument("task " + std::to_string(task_id) + " belongs to job " +
                                   std::to_string(task->job_id) + ", not to job " + std::to_string(job_id));
  }
  if (task->finished) return Status::FailedPrecondition("task " + std::to_string(task_id) + " is finished");
  CAPSTAN_ASSIGN_OR_RETURN(const std::vector<DispatcherState::Lease>* leases, state_.leases(job_id, index, task_id));
  const auto leased = static_cast<int64_t>(leases->size());
  if (sequence < 0 || sequence > leased) {
    return Status::InvalidArgument("task " + std::to_string(task_id) + " asked for split number " +
                                   std::to_string(sequence) + " of provider " + std::to_string(index) +
                                   ", but holds " + std::to_string(leased) + ": the next one is number " +
                                   std::to_string(leased));
  }
  SplitResponse response;
  if (sequence < leased) {
    // Asked again (a lost reply, or the task rebuilt after its worker
    // restarted): the same split.
    DispatcherState::Lease lease = (*leases)[static_cast<size_t>(sequence)];
    auto key = std::make_tuple(job_id, index, task_id);
    CAPSTAN_ASSIGN_OR_RETURN(response.split, split_at(*job, index, lease.repetition, lease.split_index, replays_[key]));
    if (sequence + 1 == leased) replays_.erase(key);  // caught up
    if (!response.split.has_value()) {
      return Status::DataLoss("split " + std::to_string(lease.split_index) + " of provider " +
                              std::to_string(index) + " of job " + std::to_string(job_id) +
                              " was handed out, but its dataset no longer has it: its source changed");
    }
    return response;
  }
  if (repetition < progress.repetition) {  // a finished repetition
    response.end_of_splits = true;
    return response;
  }
  int64_t next = repetition == progress.repetition ? progress.splits_produced : 0;
  CAPSTAN_ASSIGN_OR_RETURN(std::optional<Element> split,
                           split_at(*job, index, repetition, next, splits_[{job_id, index}]));
  if (!split.has_value()) {
    CAPSTAN_RETURN_IF_ERROR(apply(ProduceSplit{job_id, repetition, index, true}));
    response.end_of_splits = true;
    return response;
  }
  // Journaled before it leaves: a restarted dispatcher gives this task the
  // same split for the same number, and nobody else gets it.
  CAPSTAN_RETURN_IF_ERROR(apply(ProduceSplit{job_id, repetition, index, false, task_id}));
  response.split = std::move(split);
  return response;
}

// ---- Listing ------------------------------------------------------------------------------

std::vector<DatasetInfo> Dispatcher::list_datasets() const {
  std::vector<DatasetInfo> out;
  for (const auto* dataset : state_.list_datasets()) {
    auto it = definitions_.find(dataset->dataset_id);
    out.push_back(DatasetInfo{dataset->dataset_id, dataset->fingerprint,
                              it == definitions_.end() ? 0 : static_cast<uint64_t>(it->second.size()),
                              dataset->compression});
  }
  return out;
}

std::vector<JobInfo> Dispatcher::list_jobs() const {
  std::vector<JobInfo> out;
  for (const auto* job : state_.list_jobs()) {
    out.push_back(JobInfo{job->job_id, job->job_name, job->dataset_id, job->processing_mode, job->num_clients(),
                          static_cast<int64_t>(job->task_ids.size()), job->finished || job->garbage_collected});
  }
  return out;
}

std::vector<WorkerInfo> Dispatcher::list_workers() {
  std::vector<WorkerInfo> out;
  for (const auto* worker : state_.list_workers()) {
    WorkerInfo info;
    info.address = worker->address;
    auto tasks = state_.tasks_for_worker(worker->address);
    info.num_tasks = tasks.ok() ? static_cast<int64_t>(tasks->size()) : 0;
    auto seen = worker_seen_.find(worker->address);
    if (seen != worker_seen_.end()) {
      info.last_heartbeat_seconds_ago = std::chrono::duration<double>(clock_.steady_now() - seen->second).count();
    }
    out.push_back(std::move(info));
  }
  return out;
}

// ---- Garbage collection ----------------------------------------------------------------

void Dispatcher::collect() {
  Status reassigned = reassign_lost_tasks();
  if (!reassigned.ok() && log_) log_->error("moving the tasks of lost data workers: {}", reassigned.to_string());
  auto now = clock_.steady_now();
  // Clients that stopped sending heartbeats have left.
  for (auto it = client_seen_.begin(); it != client_seen_.end();) {
    if (now - it->second > config_.client_timeout) {
      Status released = apply(ReleaseJobClient{it->first, clock_.wall_micros()});
      if (log_) {
        if (!released.ok()) log_->debug("releasing client {}: {}", it->first, released.to_string());
        else log_->info("job client {} timed out", it->first);
      }
      it = client_seen_.erase(it);
    } else {
      ++it;
    }
  }
  for (int64_t job_id : state_.jobs_to_collect(clock_.wall_micros(), config_.job_gc_timeout.count() * 1000)) {
    Status collected = apply(GarbageCollectJob{job_id});
    if (collected.ok()) {
      std::erase_if(splits_, [job_id](const auto& entry) { return entry.first.first == job_id; });
      std::erase_if(replays_, [job_id](const auto& entry) { return std::get<0>(entry.first) == job_id; });
      if (log_) log_->info("garbage-collected job {}", job_id);
    }
  }
}

}  // namespace capstan::data_dispatcher
