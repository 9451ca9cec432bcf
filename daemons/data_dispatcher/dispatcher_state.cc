#include "daemons/data_dispatcher/dispatcher_state.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "capstan_schemas/dispatcher_journal.capnp.h"
#include "data/compression.h"

namespace capstan::data_dispatcher {

namespace {

// Overload set for std::visit.
template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

namespace jw = wire::journal;
using JournalUpdate = jw::DispatcherUpdate;

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// ---- encoding: one writer per update kind ------------------------------------

void write(JournalUpdate::Builder b, const RegisterDataset& u) {
  auto o = b.initRegisterDataset();
  o.setDatasetId(u.dataset_id);
  o.setFingerprint(u.fingerprint);
  o.setCompression(static_cast<uint8_t>(u.compression));
}
void write(JournalUpdate::Builder b, const RegisterWorker& u) {
  auto o = b.initRegisterWorker();
  o.setAddress(u.address);
  o.setTransferAddress(u.transfer_address);
  auto tags = o.initTags(static_cast<unsigned>(u.tags.size()));
  for (unsigned i = 0; i < u.tags.size(); ++i) tags.set(i, u.tags[i]);
}
void write(JournalUpdate::Builder b, const CreateJob& u) {
  auto o = b.initCreateJob();
  o.setJobId(u.job_id);
  o.setDatasetId(u.dataset_id);
  o.setJobName(u.job_name);
  o.setProcessingMode(static_cast<uint8_t>(u.processing_mode));
  o.setNumConsumers(u.num_consumers);
  o.setNumSplitProviders(u.num_split_providers);
  o.setTargetWorkers(static_cast<uint8_t>(u.target_workers));
  o.setCrossTrainerCache(u.cross_trainer_cache);
}
void write(JournalUpdate::Builder b, const AcquireJobClient& u) {
  auto o = b.initAcquireJobClient();
  o.setJobClientId(u.job_client_id);
  o.setJobId(u.job_id);
}
void write(JournalUpdate::Builder b, const ReleaseJobClient& u) {
  auto o = b.initReleaseJobClient();
  o.setJobClientId(u.job_client_id);
  o.setReleaseTimeMicros(u.release_time_micros);
}
void write(JournalUpdate::Builder b, const CreateTask& u) {
  auto o = b.initCreateTask();
  o.setTaskId(u.task_id);
  o.setJobId(u.job_id);
  o.setWorkerAddress(u.worker_address);
}
void write(JournalUpdate::Builder b, const CreatePendingTask& u) {
  auto o = b.initCreatePendingTask();
  o.setTaskId(u.task_id);
  o.setJobId(u.job_id);
  o.setWorkerAddress(u.worker_address);
  o.setStartingRound(u.starting_round);
}
void write(JournalUpdate::Builder b, const ClientHeartbeat& u) {
  auto o = b.initClientHeartbeat();
  o.setJobClientId(u.job_client_id);
  o.setTaskAccepted(u.task_accepted);
  if (u.task_rejected_new_target_round) o.setTaskRejectedNewTargetRound(*u.task_rejected_new_target_round);
  else o.setNoRejection();
}
void write(JournalUpdate::Builder b, const FinishTask& u) { b.initFinishTask().setTaskId(u.task_id); }
void write(JournalUpdate::Builder b, const RemoveTask& u) { b.initRemoveTask().setTaskId(u.task_id); }
void write(JournalUpdate::Builder b, const ProduceSplit& u) {
  auto o = b.initProduceSplit();
  o.setJobId(u.job_id);
  o.setRepetition(u.repetition);
  o.setSplitProviderIndex(u.split_provider_index);
  o.setFinished(u.finished);
  o.setTaskId(u.task_id);
}
void write(JournalUpdate::Builder b, const GarbageCollectJob& u) { b.initGarbageCollectJob().setJobId(u.job_id); }
void write(JournalUpdate::Builder b, const ReassignTask& u) {
  auto o = b.initReassignTask();
  o.setTaskId(u.task_id);
  o.setWorkerAddress(u.worker_address);
}

// ---- decoding ---------------------------------------------------------------

Result<Update> read(JournalUpdate::Reader r) {
  switch (r.which()) {
    case JournalUpdate::REGISTER_DATASET: {
      auto i = r.getRegisterDataset();
      return Update(RegisterDataset{text(i.getDatasetId()), i.getFingerprint(),
                                    static_cast<wire::ElementCompression>(i.getCompression())});
    }
    case JournalUpdate::REGISTER_WORKER: {
      auto i = r.getRegisterWorker();
      RegisterWorker u{text(i.getAddress()), text(i.getTransferAddress()), {}};
      for (auto tag : i.getTags()) u.tags.push_back(text(tag));
      return Update(std::move(u));
    }
    case JournalUpdate::CREATE_JOB: {
      auto i = r.getCreateJob();
      if (i.getProcessingMode() > kMaxProcessingMode) {
        return Status::InvalidArgument("cannot decode CreateJob update: processing mode " +
                                       std::to_string(i.getProcessingMode()) + " out of range");
      }
      if (i.getTargetWorkers() > kMaxTargetWorkers) {
        return Status::InvalidArgument("cannot decode CreateJob update: target workers " +
                                       std::to_string(i.getTargetWorkers()) + " out of range");
      }
      CreateJob u;
      u.job_id = i.getJobId();
      u.dataset_id = text(i.getDatasetId());
      u.job_name = text(i.getJobName());
      u.processing_mode = static_cast<ProcessingMode>(i.getProcessingMode());
      u.num_consumers = i.getNumConsumers();
      u.num_split_providers = i.getNumSplitProviders();
      u.target_workers = static_cast<TargetWorkers>(i.getTargetWorkers());
      u.cross_trainer_cache = i.getCrossTrainerCache();
      return Update(std::move(u));
    }
    case JournalUpdate::ACQUIRE_JOB_CLIENT: {
      auto i = r.getAcquireJobClient();
      return Update(AcquireJobClient{i.getJobClientId(), i.getJobId()});
    }
    case JournalUpdate::RELEASE_JOB_CLIENT: {
      auto i = r.getReleaseJobClient();
      return Update(ReleaseJobClient{i.getJobClientId(), i.getReleaseTimeMicros()});
    }
    case JournalUpdate::CREATE_TASK: {
      auto i = r.getCreateTask();
      return Update(CreateTask{i.getTaskId(), i.getJobId(), text(i.getWorkerAddress())});
    }
    case JournalUpdate::CREATE_PENDING_TASK: {
      auto i = r.getCreatePendingTask();
      return Update(CreatePendingTask{i.getTaskId(), i.getJobId(), text(i.getWorkerAddress()), i.getStartingRound()});
    }
    case JournalUpdate::CLIENT_HEARTBEAT: {
      auto i = r.getClientHeartbeat();
      ClientHeartbeat u{i.getJobClientId(), i.getTaskAccepted(), std::nullopt};
      if (i.isTaskRejectedNewTargetRound()) u.task_rejected_new_target_round = i.getTaskRejectedNewTargetRound();
      return Update(std::move(u));
    }
    case JournalUpdate::FINISH_TASK: return Update(FinishTask{r.getFinishTask().getTaskId()});
    case JournalUpdate::REMOVE_TASK: return Update(RemoveTask{r.getRemoveTask().getTaskId()});
    case JournalUpdate::PRODUCE_SPLIT: {
      auto i = r.getProduceSplit();
      return Update(ProduceSplit{i.getJobId(), i.getRepetition(), i.getSplitProviderIndex(), i.getFinished(),
                                 i.getTaskId()});
    }
    case JournalUpdate::GARBAGE_COLLECT_JOB: return Update(GarbageCollectJob{r.getGarbageCollectJob().getJobId()});
    case JournalUpdate::REASSIGN_TASK: {
      auto i = r.getReassignTask();
      return Update(ReassignTask{i.getTaskId(), text(i.getWorkerAddress())});
    }
  }
  return Status::InvalidArgument("unknown update kind " + std::to_string(static_cast<unsigned>(r.which())));
}

std::string id_list(const std::vector<int64_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

}  // namespace

std::string_view processing_mode_name(ProcessingMode mode) {
  switch (mode) {
    case ProcessingMode::kOff: return "OFF";
    case ProcessingMode::kDynamic: return "DYNAMIC";
    case ProcessingMode::kFile: return "FILE";
    case ProcessingMode::kData: return "DATA";
    case ProcessingMode::kFileOrData: return "FILE_OR_DATA";
    case ProcessingMode::kHint: return "HINT";
  }
  return "UNKNOWN";
}

std::string_view target_workers_name(TargetWorkers target) {
  switch (target) {
    case TargetWorkers::kAuto: return "AUTO";
    case TargetWorkers::kAny: return "ANY";
    case TargetWorkers::kLocal: return "LOCAL";
  }
  return "UNKNOWN";
}

std::string_view update_name(const Update& update) {
  return std::visit(
      Overloaded{
          [](const RegisterDataset&) { return std::string_view("RegisterDataset"); },
          [](const RegisterWorker&) { return std::string_view("RegisterWorker"); },
          [](const CreateJob&) { return std::string_view("CreateJob"); },
          [](const AcquireJobClient&) { return std::string_view("AcquireJobClient"); },
          [](const ReleaseJobClient&) { return std::string_view("ReleaseJobClient"); },
          [](const CreateTask&) { return std::string_view("CreateTask"); },
          [](const CreatePendingTask&) { return std::string_view("CreatePendingTask"); },
          [](const ClientHeartbeat&) { return std::string_view("ClientHeartbeat"); },
          [](const FinishTask&) { return std::string_view("FinishTask"); },
          [](const RemoveTask&) { return std::string_view("RemoveTask"); },
          [](const ProduceSplit&) { return std::string_view("ProduceSplit"); },
          [](const GarbageCollectJob&) { return std::string_view("GarbageCollectJob"); },
          [](const ReassignTask&) { return std::string_view("ReassignTask"); },
      },
      update);
}

std::string encode(const Update& update) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<JournalUpdate>();
  std::visit([&root](const auto& u) { write(root, u); }, update);
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

Result<Update> decode(std::string_view bytes) {
  if (bytes.empty()) return Status::InvalidArgument("empty update record");
  if (bytes.size() % sizeof(capnp::word) != 0) {
    return Status::InvalidArgument("update record of " + std::to_string(bytes.size()) +
                                   " bytes is not a whole number of words");
  }
  // Copied: the record's bytes need not be word-aligned.
  auto words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  try {
    capnp::FlatArrayMessageReader reader(words);
    if (reader.getEnd() != words.end()) {
      return Status::InvalidArgument(std::to_string((words.end() - reader.getEnd()) * sizeof(capnp::word)) +
                                     " trailing bytes after the update");
    }
    return read(reader.getRoot<JournalUpdate>());
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("malformed update record: ") + e.getDescription().cStr());
  }
}

// ---- apply ------------------------------------------------------------------

Status DispatcherState::apply(const Update& update) {
  return std::visit(
      Overloaded{
          [this](const RegisterDataset& u) { return apply_register_dataset(u); },
          [this](const RegisterWorker& u) { return apply_register_worker(u); },
          [this](const CreateJob& u) { return apply_create_job(u); },
          [this](const AcquireJobClient& u) { return apply_acquire_job_client(u); },
          [this](const ReleaseJobClient& u) { return apply_release_job_client(u); },
          [this](const CreateTask& u) { return apply_create_task(u); },
          [this](const CreatePendingTask& u) { return apply_create_pending_task(u); },
          [this](const ClientHeartbeat& u) { return apply_client_heartbeat(u); },
          [this](const FinishTask& u) { return apply_finish_task(u); },
          [this](const RemoveTask& u) { return apply_remove_task(u); },
          [this](const ProduceSplit& u) { return apply_produce_split(u); },
          [this](const GarbageCollectJob& u) { return apply_garbage_collect_job(u); },
          [this](const ReassignTask& u) { return apply_reassign_task(u); },
      },
      update);
}

DispatcherState::Job* DispatcherState::mutable_job(int64_t job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

void DispatcherState::update_job_finished(Job& job) {
  if (job.task_ids.empty()) return;
  job.finished = std::all_of(job.task_ids.begin(), job.task_ids.end(),
                             [this](int64_t id) { return tasks_.at(id).finished; });
}

Status DispatcherState::apply_register_dataset(const RegisterDataset& u) {
  if (u.dataset_id.empty()) {
    return Status::InvalidArgument("RegisterDataset: empty dataset id");
  }
  if (datasets_by_id_.count(u.dataset_id) > 0) {
    return Status::AlreadyExists("dataset " + u.dataset_id + " is already registered");
  }
  if (!data::known_compression(u.compression)) {
    return Status::InvalidArgument("RegisterDataset: unknown compression " + data::compression_name(u.compression));
  }
  auto fp = dataset_id_by_fingerprint_.find(u.fingerprint);
  if (fp != dataset_id_by_fingerprint_.end()) {
    return Status::AlreadyExists("fingerprint " + std::to_string(u.fingerprint) +
                                 " is already registered as dataset " + fp->second);
  }
  datasets_by_id_.emplace(u.dataset_id, Dataset{u.dataset_id, u.fingerprint, u.compression});
  dataset_id_by_fingerprint_.emplace(u.fingerprint, u.dataset_id);
  // Numeric ids keep next_available_dataset_id() above them.
  int64_t numeric = 0;
  const char* end = u.dataset_id.data() + u.dataset_id.size();
  auto [ptr, ec] = std::from_chars(u.dataset_id.data(), end, numeric);
  if (ec == std::errc() && ptr == end && numeric >= 0 &&
      numeric < std::numeric_limits<int64_t>::max()) {
    next_available_dataset_id_ = std::max(next_available_dataset_id_, numeric + 1);
  }
  return Status::Ok();
}

Status DispatcherState::apply_register_worker(const RegisterWorker& u) {
  if (u.address.empty()) {
    return Status::InvalidArgument("RegisterWorker: empty worker address");
  }
  Worker& worker = workers_[u.address];
  worker = Worker{u.address, u.transfer_address, u.tags};
  tasks_by_worker_[u.address];  // keeps the worker's tasks on re-registration
  return Status::Ok();
}

Status DispatcherState::apply_create_job(const CreateJob& u) {
  const std::string id = std::to_string(u.job_id);
  if (u.job_id < 0) return Status::InvalidArgument("CreateJob: negative job id " + id);
  if (u.num_consumers < 0) {
    return Status::InvalidArgument("CreateJob " + id + ": negative num_consumers " +
                                   std::to_string(u.num_consumers));
  }
  if (u.num_split_providers < 0 || u.num_split_providers > kMaxSplitProviders) {
    return Status::InvalidArgument("CreateJob " + id + ": num_split_providers " +
                                   std::to_string(u.num_split_providers) + " is not in [0, " +
                                   std::to_string(kMaxSplitProviders) + "]");
  }
  if (u.num_consumers > 0 && u.job_name.empty()) {
    return Status::InvalidArgument("CreateJob " + id +
                                   ": coordinated reads (num_consumers) require a job name");
  }
  if (u.num_consumers > 0 && u.target_workers == TargetWorkers::kLocal) {
    return Status::InvalidArgument("CreateJob " + id +
                                   ": coordinated reads require non-local workers, but "
                                   "target_workers is LOCAL");
  }
  if (u.cross_trainer_cache && u.job_name.empty()) {
    return Status::InvalidArgument("CreateJob " + id +
                                   ": cross-trainer caching requires a named job");
  }
  if (u.cross_trainer_cache && u.num_consumers > 0) {
    return Status::InvalidArgument("CreateJob " + id +
                                   ": cross-trainer caching does not support coordinated "
                                   "reads (num_consumers " +
                                   std::to_string(u.num_consumers) + ")");
  }
  if (jobs_.count(u.job_id) > 0) return Status::AlreadyExists("job " + id + " already exists");
  if (datasets_by_id_.count(u.dataset_id) == 0) {
    return Status::NotFound("CreateJob " + id + ": dataset " + u.dataset_id +
                            " is not registered");
  }
  if (!u.job_name.empty()) {
    auto named = job_id_by_name_.find(u.job_name);
    if (named != job_id_by_name_.end() && !jobs_.at(named->second).garbage_collected) {
      return Status::AlreadyExists("a job named '" + u.job_name + "' already exists (job " +
                                   std::to_string(named->second) + ")");
    }
  }

  Job job;
  job.job_id = u.job_id;
  job.dataset_id = u.dataset_id;
  job.job_name = u.job_name;
  job.processing_mode = u.processing_mode;
  job.num_consumers = u.num_consumers;
  job.num_split_providers = u.num_split_providers;
  job.target_workers = u.target_workers;
  job.cross_trainer_cache = u.cross_trainer_cache;
  if (job.is_dynamic()) job.split_states.resize(static_cast<size_t>(u.num_split_providers));
  jobs_.emplace(u.job_id, std::move(job));
  if (!u.job_name.empty()) job_id_by_name_[u.job_name] = u.job_id;
  next_available_job_id_ = std::max(next_available_job_id_, u.job_id + 1);
  return Status::Ok();
}

Status DispatcherState::apply_acquire_job_client(const AcquireJobClient& u) {
  const std::string id = std::to_string(u.job_client_id);
  if (u.job_client_id < 0) {
    return Status::InvalidArgument("AcquireJobClient: negative job client id " + id);
  }
  auto existing = job_id_by_client_id_.find(u.job_client_id);
  if (existing != job_id_by_client_id_.end()) {
    return Status::AlreadyExists("job client " + id + " is already reading job " +
                                 std::to_string(existing->second));
  }
  Job* job = mutable_job(u.job_id);
  if (job == nullptr) {
    return Status::NotFound("AcquireJobClient " + id + ": job " + std::to_string(u.job_id) +
                            " not found");
  }
  if (job->garbage_collected) {
    return Status::FailedPrecondition("AcquireJobClient " + id + ": job " +
                                      std::to_string(u.job_id) +
                                      " was garbage-collected");
  }
  job->job_client_ids.insert(u.job_client_id);
  job_id_by_client_id_.emplace(u.job_client_id, u.job_id);
  next_available_job_client_id_ = std::max(next_available_job_client_id_, u.job_client_id + 1);
  return Status::Ok();
}

Status DispatcherState::apply_release_job_client(const ReleaseJobClient& u) {
  const std::string id = std::to_string(u.job_client_id);
  if (u.release_time_micros < 0) {
    return Status::InvalidArgument("ReleaseJobClient " + id + ": negative release time " +
                                   std::to_string(u.release_time_micros));
  }
  auto it = job_id_by_client_id_.find(u.job_client_id);
  if (it == job_id_by_client_id_.end()) {
    return Status::NotFound("job client " + id + " not found");
  }
  Job& job = jobs_.at(it->second);
  job.job_client_ids.erase(u.job_client_id);
  job.last_client_released_micros = u.release_time_micros;
  job_id_by_client_id_.erase(it);
  return Status::Ok();
}

Status DispatcherState::validate_new_task(int64_t task_id, int64_t job_id,
                                          const std::string& worker_address) const {
  const std::string id = std::to_string(task_id);
  if (task_id < 0) return Status::InvalidArgument("negative task id " + id);
  if (tasks_.count(task_id) > 0) return Status::AlreadyExists("task " + id + " already exists");
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) {
    return Status::NotFound("task " + id + ": job " + std::to_string(job_id) + " not found");
  }
  auto worker = tasks_by_worker_.find(worker_address);
  if (worker == tasks_by_worker_.end()) {
    return Status::NotFound("task " + id + ": worker '" + worker_address +
                            "' is not registered");
  }
  if (job->second.garbage_collected) {
    return Status::FailedPrecondition("task " + id + ": job " + std::to_string(job_id) +
                                      " was garbage-collected");
  }
  if (job->second.finished) {
    return Status::FailedPrecondition("task " + id + ": job " + std::to_string(job_id) +
                                      " is finished");
  }
  for (int64_t other : worker->second) {
    if (tasks_.at(other).job_id == job_id) {
      return Status::AlreadyExists("worker '" + worker_address + "' already has task " +
                                   std::to_string(other) + " of job " +
                                   std::to_string(job_id));
    }
  }
  return Status::Ok();
}

Status DispatcherState::apply_create_task(const CreateTask& u) {
  CAPSTAN_RETURN_IF_ERROR(validate_new_task(u.task_id, u.job_id, u.worker_address));
  Task task;
  task.task_id = u.task_id;
  task.job_id = u.job_id;
  task.worker_address = u.worker_address;
  tasks_.emplace(u.task_id, std::move(task));
  jobs_.at(u.job_id).task_ids.push_back(u.task_id);
  tasks_by_worker_.at(u.worker_address).insert(u.task_id);
  next_available_task_id_ = std::max(next_available_task_id_, u.task_id + 1);
  return Status::Ok();
}

Status DispatcherState::apply_create_pending_task(const CreatePendingTask& u) {
  CAPSTAN_RETURN_IF_ERROR(validate_new_task(u.task_id, u.job_id, u.worker_address));
  Job& job = jobs_.at(u.job_id);
  if (!job.is_round_robin()) {
    return Status::FailedPrecondition("pending task " + std::to_string(u.task_id) + ": job " +
                                      std::to_string(u.job_id) +
                                      " does not use coordinated reads");
  }
  if (u.starting_round < 0) {
    return Status::InvalidArgument("pending task " + std::to_string(u.task_id) +
                                   ": negative starting round " +
                                   std::to_string(u.starting_round));
  }
  Task task;
  task.task_id = u.task_id;
  task.job_id = u.job_id;
  task.worker_address = u.worker_address;
  task.pending = true;
  tasks_.emplace(u.task_id, std::move(task));
  PendingTask pending;
  pending.task_id = u.task_id;
  pending.target_round = u.starting_round;
  job.pending_tasks.push_back(std::move(pending));
  tasks_by_worker_.at(u.worker_address).insert(u.task_id);
  next_available_task_id_ = std::max(next_available_task_id_, u.task_id + 1);
  return Status::Ok();
}

Status DispatcherState::apply_client_heartbeat(const ClientHeartbeat& u) {
  const std::string id = std::to_string(u.job_client_id);
  const bool rejected = u.task_rejected_new_target_round.has_value();
  if (u.task_accepted == rejected) {
    return Status::InvalidArgument("ClientHeartbeat " + id +
                                   ": exactly one of task_accepted and task_rejected "
                                   "must be set");
  }
  if (rejected && *u.task_rejected_new_target_round < 0) {
    return Status::InvalidArgument("ClientHeartbeat " + id + ": negative new target round " +
                                   std::to_string(*u.task_rejected_new_target_round));
  }
  auto client = job_id_by_client_id_.find(u.job_client_id);
  if (client == job_id_by_client_id_.end()) {
    return Status::NotFound("job client " + id + " not found");
  }
  Job& job = jobs_.at(client->second);
  if (job.pending_tasks.empty()) {
    return Status::FailedPrecondition("ClientHeartbeat " + id + ": job " +
                                      std::to_string(job.job_id) + " has no pending task");
  }
  PendingTask& pending = job.pending_tasks.front();
  if (rejected) {
    ++pending.failures;
    pending.ready_consumers.clear();
    pending.target_round = *u.task_rejected_new_target_round;
    return Status::Ok();
  }
  pending.ready_consumers.insert(u.job_client_id);
  if (static_cast<int64_t>(pending.ready_consumers.size()) >= job.num_consumers) {
    Task& task = tasks_.at(pending.task_id);
    task.pending = false;
    task.starting_round = pending.target_round;
    job.task_ids.push_back(task.task_id);
    job.pending_tasks.pop_front();
  }
  return Status::Ok();
}

Status DispatcherState::apply_finish_task(const FinishTask& u) {
  const std::string id = std::to_string(u.task_id);
  auto it = tasks_.find(u.task_id);
  if (it == tasks_.end()) return Status::NotFound("task " + id + " not found");
  Task& task = it->second;
  if (task.finished) return Status::FailedPrecondition("task " + id + " is already finished");
  if (task.pending) {
    return Status::FailedPrecondition("task " + id + " is pending and cannot finish");
  }
  task.finished = true;
  tasks_by_worker_.at(task.worker_address).erase(task.task_id);
  Job& job = jobs_.at(task.job_id);
  drop_leases(job, task.task_id);
  update_job_finished(job);
  return Status::Ok();
}

Status DispatcherState::apply_remove_task(const RemoveTask& u) {
  auto it = tasks_.find(u.task_id);
  if (it == tasks_.end()) {
    return Status::NotFound("task " + std::to_string(u.task_id) + " not found");
  }
  const Task& task = it->second;
  Job& job = jobs_.at(task.job_id);
  if (task.pending) {
    auto p = std::find_if(job.pending_tasks.begin(), job.pending_tasks.end(),
                          [&](const PendingTask& t) { return t.task_id == u.task_id; });
    job.pending_tasks.erase(p);
  } else {
    job.task_ids.erase(std::find(job.task_ids.begin(), job.task_ids.end(), u.task_id));
  }
  tasks_by_worker_.at(task.worker_address).erase(u.task_id);
  drop_leases(job, u.task_id);
  tasks_.erase(it);
  if (!job.garbage_collected) update_job_finished(job);
  return Status::Ok();
}

Status DispatcherState::apply_produce_split(const ProduceSplit& u) {
  const std::string id = std::to_string(u.job_id);
  Job* job = mutable_job(u.job_id);
  if (job == nullptr) return Status::NotFound("ProduceSplit: job " + id + " not found");
  if (!job->is_dynamic()) {
    return Status::FailedPrecondition(
        "ProduceSplit: job " + id + " uses processing mode " +
        std::string(processing_mode_name(job->processing_mode)) + ", not DYNAMIC");
  }
  if (u.split_provider_index < 0 || u.split_provider_index >= job->num_split_providers) {
    return Status::InvalidArgument("ProduceSplit: job " + id + " has " +
                                   std::to_string(job->num_split_providers) +
                                   " split providers, got index " +
                                   std::to_string(u.split_provider_index));
  }
  if (job->garbage_collected) {
    return Status::FailedPrecondition("ProduceSplit: job " + id + " was garbage-collected");
  }
  if (u.task_id != -1) {
    // A lease: to a running task of this job (-1 only in old journals).
    if (u.finished) {
      return Status::InvalidArgument("ProduceSplit: the end of job " + id + "'s splits is leased to no task, got task " +
                                     std::to_string(u.task_id));
    }
    auto task = tasks_.find(u.task_id);
    if (task == tasks_.end() || task->second.job_id != u.job_id) {
      return Status::NotFound("ProduceSplit: job " + id + " has no task " + std::to_string(u.task_id));
    }
    if (task->second.finished) {
      return Status::FailedPrecondition("ProduceSplit: task " + std::to_string(u.task_id) + " is finished");
    }
  }
  SplitState& state = job->split_states[static_cast<size_t>(u.split_provider_index)];
  if (u.repetition < state.repetition) {
    return Status::FailedPrecondition(
        "ProduceSplit: job " + id + " provider " + std::to_string(u.split_provider_index) +
        " is at repetition " + std::to_string(state.repetition) + ", got " +
        std::to_string(u.repetition));
  }
  if (u.repetition > state.repetition) {
    // The consumer moved on to a later repetition before the provider
    // reached its end (e.g. the longer input of a zip): the provider was
    // reset, and counting restarts in the new repetition.
    state.repetition = u.repetition;
    state.splits_produced = 0;
  }
  if (u.finished) {
    ++state.repetition;
    state.splits_produced = 0;
  } else {
    if (u.task_id != -1) {
      job->leases[{u.split_provider_index, u.task_id}].push_back(Lease{state.repetition, state.splits_produced});
    }
    ++state.splits_produced;
  }
  return Status::Ok();
}

void DispatcherState::drop_leases(Job& job, int64_t task_id) {
  for (int64_t k = 0; k < job.num_split_providers; ++k) job.leases.erase({k, task_id});
}

Status DispatcherState::apply_garbage_collect_job(const GarbageCollectJob& u) {
  const std::string id = std::to_string(u.job_id);
  Job* job = mutable_job(u.job_id);
  if (job == nullptr) return Status::NotFound("GarbageCollectJob: job " + id + " not found");
  if (job->garbage_collected) {
    return Status::FailedPrecondition("job " + id + " was already garbage-collected");
  }
  if (job->num_clients() > 0) {
    return Status::FailedPrecondition("job " + id + " still has " +
                                      std::to_string(job->num_clients()) + " clients");
  }
  for (int64_t task_id : job->task_ids) {
    Task& task = tasks_.at(task_id);
    task.finished = true;
    tasks_by_worker_.at(task.worker_address).erase(task_id);
  }
  // Pending tasks never started: they go away.
  for (const PendingTask& pending : job->pending_tasks) {
    const Task& task = tasks_.at(pending.task_id);
    tasks_by_worker_.at(task.worker_address).erase(pending.task_id);
    tasks_.erase(pending.task_id);
  }
  job->pending_tasks.clear();
  job->leases.clear();
  job->finished = true;
  job->garbage_collected = true;
  return Status::Ok();
}

Status DispatcherState::apply_reassign_task(const ReassignTask& u) {
  const std::string id = std::to_string(u.task_id);
  auto it = tasks_.find(u.task_id);
  if (it == tasks_.end()) return Status::NotFound("ReassignTask: task " + id + " not found");
  Task& task = it->second;
  if (task.finished) return Status::FailedPrecondition("ReassignTask: task " + id + " is finished");
  if (task.pending) {
    return Status::FailedPrecondition("ReassignTask: task " + id + " is pending (it has served nothing yet)");
  }
  auto to = tasks_by_worker_.find(u.worker_address);
  if (to == tasks_by_worker_.end()) {
    return Status::NotFound("ReassignTask: task " + id + ": worker '" + u.worker_address + "' is not registered");
  }
  if (u.worker_address == task.worker_address) {
    return Status::InvalidArgument("ReassignTask: task " + id + " already runs on '" + u.worker_address + "'");
  }
  tasks_by_worker_.at(task.worker_address).erase(task.task_id);
  to->second.insert(task.task_id);
  task.worker_address = u.worker_address;
  return Status::Ok();
}

// ---- queries ------------------------------------------------------------------

Result<const DispatcherState::Dataset*> DispatcherState::dataset_from_id(
    std::string_view dataset_id) const {
  auto it = datasets_by_id_.find(dataset_id);
  if (it == datasets_by_id_.end()) {
    return Status::NotFound("dataset " + std::string(dataset_id) + " not found");
  }
  return &it->second;
}

Result<const DispatcherState::Dataset*> DispatcherState::dataset_for_fingerprint(
    uint64_t fingerprint) const {
  auto it = dataset_id_by_fingerprint_.find(fingerprint);
  if (it == dataset_id_by_fingerprint_.end()) {
    return Status::NotFound("no dataset with fingerprint " + std::to_string(fingerprint));
  }
  return &datasets_by_id_.find(it->second)->second;
}

std::string DispatcherState::next_available_dataset_id() const {
  return std::to_string(next_available_dataset_id_);
}

std::vector<const DispatcherState::Dataset*> DispatcherState::list_datasets() const {
  std::vector<const Dataset*> out;
  out.reserve(datasets_by_id_.size());
  for (const auto& [id, dataset] : datasets_by_id_) out.push_back(&dataset);
  return out;
}

Result<const DispatcherState::Worker*> DispatcherState::worker_from_address(
    std::string_view address) const {
  auto it = workers_.find(address);
  if (it == workers_.end()) {
    return Status::NotFound("worker '" + std::string(address) + "' not found");
  }
  return &it->second;
}

std::vector<const DispatcherState::Worker*> DispatcherState::list_workers() const {
  std::vector<const Worker*> out;
  out.reserve(workers_.size());
  for (const auto& [address, worker] : workers_) out.push_back(&worker);
  return out;
}

Result<const DispatcherState::Job*> DispatcherState::job_from_id(int64_t job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return Status::NotFound("job " + std::to_string(job_id) + " not found");
  return &it->second;
}

Result<const DispatcherState::Job*> DispatcherState::job_for_name(
    std::string_view job_name) const {
  auto it = job_id_by_name_.find(job_name);
  if (it == job_id_by_name_.end()) {
    return Status::NotFound("no job named '" + std::string(job_name) + "'");
  }
  return &jobs_.at(it->second);
}

std::vector<const DispatcherState::Job*> DispatcherState::list_jobs() const {
  std::vector<const Job*> out;
  out.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) out.push_back(&job);
  return out;
}

Result<const DispatcherState::Job*> DispatcherState::job_for_job_client_id(
    int64_t job_client_id) const {
  auto it = job_id_by_client_id_.find(job_client_id);
  if (it == job_id_by_client_id_.end()) {
    return Status::NotFound("job client " + std::to_string(job_client_id) + " not found");
  }
  return &jobs_.at(it->second);
}

Result<std::vector<int64_t>> DispatcherState::job_clients_for_job(int64_t job_id) const {
  CAPSTAN_ASSIGN_OR_RETURN(const Job* job, job_from_id(job_id));
  return std::vector<int64_t>(job->job_client_ids.begin(), job->job_client_ids.end());
}

Result<int64_t> DispatcherState::num_job_clients(int64_t job_id) const {
  CAPSTAN_ASSIGN_OR_RETURN(const Job* job, job_from_id(job_id));
  return job->num_clients();
}

std::vector<int64_t> DispatcherState::list_active_job_client_ids() const {
  std::vector<int64_t> out;
  out.reserve(job_id_by_client_id_.size());
  for (const auto& [client_id, job_id] : job_id_by_client_id_) out.push_back(client_id);
  return out;
}

Result<const DispatcherState::Task*> DispatcherState::task_from_id(int64_t task_id) const {
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) {
    return Status::NotFound("task " + std::to_string(task_id) + " not found");
  }
  return &it->second;
}

Result<std::vector<const DispatcherState::Task*>> DispatcherState::tasks_for_job(
    int64_t job_id) const {
  CAPSTAN_ASSIGN_OR_RETURN(const Job* job, job_from_id(job_id));
  std::vector<const Task*> out;
  out.reserve(job->task_ids.size());
  for (int64_t id : job->task_ids) out.push_back(&tasks_.at(id));
  return out;
}

Result<std::vector<const DispatcherState::Task*>> DispatcherState::pending_tasks_for_job(
    int64_t job_id) const {
  CAPSTAN_ASSIGN_OR_RETURN(const Job* job, job_from_id(job_id));
  std::vector<const Task*> out;
  out.reserve(job->pending_tasks.size());
  for (const PendingTask& p : job->pending_tasks) out.push_back(&tasks_.at(p.task_id));
  return out;
}

Result<std::vector<const DispatcherState::Task*>> DispatcherState::tasks_for_worker(
    std::string_view address) const {
  auto it = tasks_by_worker_.find(address);
  if (it == tasks_by_worker_.end()) {
    return Status::NotFound("worker '" + std::string(address) + "' not found");
  }
  std::vector<const Task*> out;
  out.reserve(it->second.size());
  for (int64_t id : it->second) out.push_back(&tasks_.at(id));
  return out;
}

Result<DispatcherState::SplitState> DispatcherState::split_state(
    int64_t job_id, int64_t split_provider_index) const {
  CAPSTAN_ASSIGN_OR_RETURN(const Job* job, job_from_id(job_id));
  if (!job->is_dynamic()) {
    return Status::FailedPrecondition("job " + std::to_string(job_id) +
                                      " does not use DYNAMIC sharding");
  }
  if (split_provider_index < 0 || split_provider_index >= job->num_split_providers) {
    return Status::InvalidArgument("job " + std::to_string(job_id) + " has " +
                                   std::to_string(job->num_split_providers) +
                                   " split providers, got index " +
                                   std::to_string(split_provider_index));
  }
  return job->split_states[static_cast<size_t>(split_provider_index)];
}

Result<const std::vector<DispatcherState::Lease>*> DispatcherState::leases(int64_t job_id,
                                                                            int64_t split_provider_index,
                                                                            int64_t task_id) const {
  CAPSTAN_RETURN_IF_ERROR(split_state(job_id, split_provider_index).status());
  static const std::vector<Lease> kNone;
  const Job& job = jobs_.at(job_id);
  auto it = job.leases.find({split_provider_index, task_id});
  return it == job.leases.end() ? &kNone : &it->second;
}

std::vector<int64_t> DispatcherState::jobs_to_collect(int64_t now_micros,
                                                      int64_t timeout_micros) const {
  std::vector<int64_t> out;
  if (timeout_micros < 0) return out;
  for (const auto& [id, job] : jobs_) {
    if (job.finished || job.garbage_collected || job.num_clients() > 0 ||
        job.last_client_released_micros < 0) {
      continue;
    }
    // now >= released + timeout, without overflowing.
    if (now_micros - job.last_client_released_micros < timeout_micros) continue;
    out.push_back(id);
  }
  return out;
}

std::string DispatcherState::debug_string() const {
  std::string s;
  s += "next_ids dataset=" + std::to_string(next_available_dataset_id_) +
       " job=" + std::to_string(next_available_job_id_) +
       " client=" + std::to_string(next_available_job_client_id_) +
       " task=" + std::to_string(next_available_task_id_) + "\n";
  for (const auto& [id, d] : datasets_by_id_) {
    s += "dataset " + id + " fingerprint=" + std::to_string(d.fingerprint) +
         " compression=" + data::compression_name(d.compression) + "\n";
  }
  for (const auto& [address, w] : workers_) {
    s += "worker " + address + " transfer=" + w.transfer_address + " tags=[";
    for (size_t i = 0; i < w.tags.size(); ++i) s += (i > 0 ? "," : "") + w.tags[i];
    s += "] tasks=";
    const auto& ids = tasks_by_worker_.at(address);
    s += id_list(std::vector<int64_t>(ids.begin(), ids.end())) + "\n";
  }
  for (const auto& [id, j] : jobs_) {
    s += "job " + std::to_string(id) + " dataset=" + j.dataset_id + " name=" + j.job_name +
         " mode=" + std::string(processing_mode_name(j.processing_mode)) +
         " consumers=" + std::to_string(j.num_consumers) +
         " providers=" + std::to_string(j.num_split_providers) +
         " target=" + std::string(target_workers_name(j.target_workers)) +
         " ctc=" + std::to_string(j.cross_trainer_cache) + " splits=[";
    for (size_t i = 0; i < j.split_states.size(); ++i) {
      s += (i > 0 ? "," : "") + std::to_string(j.split_states[i].repetition) + ":" +
           std::to_string(j.split_states[i].splits_produced);
    }
    s += "] leases=[";
    bool first = true;
    for (const auto& [key, leased] : j.leases) {
      s += std::string(first ? "" : " ") + std::to_string(key.first) + "/" + std::to_string(key.second) + ":";
      for (size_t i = 0; i < leased.size(); ++i) {
        s += (i > 0 ? "," : "") + std::to_string(leased[i].repetition) + "." + std::to_string(leased[i].split_index);
      }
      first = false;
    }
    s += "] clients=" +
         id_list(std::vector<int64_t>(j.job_client_ids.begin(), j.job_client_ids.end())) +
         " released=" + std::to_string(j.last_client_released_micros) +
         " tasks=" + id_list(j.task_ids) + " pending=[";
    for (size_t i = 0; i < j.pending_tasks.size(); ++i) {
      const PendingTask& p = j.pending_tasks[i];
      s += (i > 0 ? "," : "") + std::to_string(p.task_id) + "@" +
           std::to_string(p.target_round) + " ready=" +
           id_list(std::vector<int64_t>(p.ready_consumers.begin(), p.ready_consumers.end())) +
           " failures=" + std::to_string(p.failures);
    }
    s += "] finished=" + std::to_string(j.finished) +
         " gc=" + std::to_string(j.garbage_collected) + "\n";
  }
  for (const auto& [name, id] : job_id_by_name_) {
    s += "name " + name + " -> " + std::to_string(id) + "\n";
  }
  for (const auto& [client, job] : job_id_by_client_id_) {
    s += "client " + std::to_string(client) + " -> " + std::to_string(job) + "\n";
  }
  for (const auto& [id, t] : tasks_) {
    s += "task " + std::to_string(id) + " job=" + std::to_string(t.job_id) +
         " worker=" + t.worker_address + " round=" + std::to_string(t.starting_round) +
         " pending=" + std::to_string(t.pending) + " finished=" + std::to_string(t.finished) +
         "\n";
  }
  return s;
}

}  // namespace capstan::data_dispatcher
