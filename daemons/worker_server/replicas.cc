#include "daemons/worker_server/replicas.h"

#include <algorithm>
#include <optional>

#include "checkpoint/mirrored_files.h"
#include "training/mirrored_access.h"
#include "training/optimizer.h"

namespace capstan::worker_server {
namespace {

// Holds a replica's lock for a Lease (released when the last copy goes).
template <typename R>
struct Hold {
  explicit Hold(std::shared_ptr<R> r) NO_THREAD_SAFETY_ANALYSIS : replica(std::move(r)) { replica->mutex.lock(); }
  ~Hold() NO_THREAD_SAFETY_ANALYSIS { replica->mutex.unlock(); }
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;
  std::shared_ptr<R> replica;
  std::shared_ptr<Communicator> group;  // alive while the step runs
};

// The bytes a replica of `specs` holds: values and optimizer slots.
Status check_budget(const std::vector<training::MirroredSpec>& specs, int64_t budget) {
  int64_t total = 0;
  for (const auto& spec : specs) {
    int64_t elements = 1;
    for (int64_t d : spec.shape) {
      if (d < 0 || (d > 0 && elements > (int64_t{1} << 40) / d)) {
        return Status::InvalidArgument("mirrored variable '" + spec.name + "' has shape " + shape_string(spec.shape));
      }
      elements *= d;
    }
    const int64_t copies = 1 + static_cast<int64_t>(training::slot_names(spec.optimizer.kind).size());
    total += elements * static_cast<int64_t>(dtype_size(spec.dtype)) * copies;
    if (total > budget) {
      return Status::ResourceExhausted("the mirrored variables (values and optimizer slots) need more than " +
                                       std::to_string(budget >> 20) + " MiB on this worker (at '" + spec.name +
                                       "'); raise the worker's replica_memory_mib");
    }
  }
  return Status::Ok();
}

}  // namespace

Replicas::Replicas(std::string host, int64_t budget_bytes) : host_(std::move(host)), budget_bytes_(budget_bytes) {}
Replicas::~Replicas() = default;

std::shared_ptr<Replicas::Replica> Replicas::find(const std::string& strategy, bool create) {
  MutexLock lock(mutex_);
  auto it = replicas_.find(strategy);
  if (it != replicas_.end()) return it->second;
  if (!create || replicas_.size() >= kMaxStrategies) return nullptr;
  auto replica = std::make_shared<Replica>();
  replicas_[strategy] = replica;
  return replica;
}

training::ReplicaReport Replicas::status(const std::string& strategy) {
  training::ReplicaReport report;
  auto replica = find(strategy, false);
  if (replica == nullptr) return report;
  MutexLock lock(replica->mutex);
  if (replica->variables == nullptr) return report;
  report.holds = true;
  report.step = replica->variables->step();
  report.checksum = replica->variables->checksum();
  report.input_position = replica->input_position;
  return report;
}

Result<std::string> Replicas::prepare(const std::string& strategy, int64_t epoch) {
  if (strategy.empty() || strategy.size() > 256) {
    return Status::InvalidArgument("prepareReplica: a strategy name of 1 to 256 characters, not " +
                                   std::to_string(strategy.size()));
  }
  auto replica = find(strategy, true);
  if (replica == nullptr) {
    return Status::ResourceExhausted("prepareReplica: this worker holds replicas of " + std::to_string(kMaxStrategies) +
                                     " strategies already");
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto endpoint, CollectiveEndpoint::listen(host_));
  std::string address = endpoint->address();
  MutexLock lock(replica->mutex);
  replica->pending = std::move(endpoint);
  replica->pending_epoch = epoch;
  return address;
}

Result<training::ReplicaReport> Replicas::form(const training::ReplicaForm& form) {
  auto replica = find(form.strategy, false);
  if (replica == nullptr) {
    return Status::FailedPrecondition("formReplica: strategy '" + form.strategy + "' was not prepared here");
  }
  const int size = static_cast<int>(form.addresses.size());
  if (form.rank < 0 || form.rank >= size || form.source < 0 || form.source >= size) {
    return Status::InvalidArgument("formReplica: rank " + std::to_string(form.rank) + " and source " +
                                   std::to_string(form.source) + " must be in [0, " + std::to_string(size) + ")");
  }
  MutexLock lock(replica->mutex);
  if (replica->pending == nullptr || replica->pending_epoch != form.epoch) {
    return Status::FailedPrecondition("formReplica: strategy '" + form.strategy + "' was not prepared for epoch " +
                                      std::to_string(form.epoch));
  }
  const bool is_source = form.rank == form.source;
  if (form.has_seed() && !is_source) {
    return Status::InvalidArgument("formReplica: a seed goes to the source only");
  }
  CAPSTAN_RETURN_IF_ERROR(check_budget(form.specs, budget_bytes_).with_context("formReplica '" + form.strategy + "'"));
  // A seed from a checkpoint is read before the group connects (the others
  // wait for the connection meanwhile); a failure is reported below, to
  // every member.
  std::optional<training::MirroredState> read_seed;
  Status source_ok;
  if (is_source && !form.seed_checkpoint.empty()) {
    auto read = checkpoint::read_mirrored_seed(form.seed_checkpoint, form.specs, form.seed_from_checkpoint,
                                               form.seed.has_value() ? &*form.seed : nullptr);
    if (read.ok()) {
      read_seed = std::move(*read);
    } else {
      source_ok = read.status().with_context("strategy '" + form.strategy + "': reading the seed from " +
                                             form.seed_checkpoint);
    }
  }
  const training::MirroredState* given_seed =
      read_seed.has_value() ? &*read_seed : (form.seed.has_value() ? &*form.seed : nullptr);
  // The old group (if any) stays until the new one has the variables; no
  // step can use it meanwhile (this holds the replica). A formation that
  // fails leaves this replica's variables as they were.
  auto made = Communicator::create(std::move(replica->pending), form.addresses, form.rank, form.epoch,
                                   form.settings.options());
  replica->pending_epoch = 0;
  if (!made.ok()) return made.status().with_context("forming strategy '" + form.strategy + "'");
  std::shared_ptr<Communicator> group(std::move(*made));
  // Everyone learns first whether the source can give a state.
  if (is_source && !form.has_seed() && replica->variables == nullptr) {
    source_ok = Status::FailedPrecondition("worker chosen as the source of strategy '" + form.strategy +
                                           "' holds no replica");
  }
  const int32_t code = is_source ? static_cast<int32_t>(source_ok.code()) : 0;
  auto shared = group->broadcast(Tensor::scalar<int32_t>(code), form.source);
  if (!shared.ok()) return shared.status();
  if (const int32_t failed = shared->flat<int32_t>()[0]; failed != 0) {
    if (is_source) return source_ok;
    const std::string source = "the source (rank " + std::to_string(form.source) + ") of strategy '" +
                               form.strategy + "'";
    if (failed == static_cast<int32_t>(StatusCode::kFailedPrecondition)) {
      return Status::FailedPrecondition(source + " holds no replica");
    }
    return Status(static_cast<StatusCode>(failed), source + " could not read its seed (see its log)");
  }
  // Whether to start from nothing: a seed (at the source) or no replica
  // here. Both sides of a seeded formation take the seeded path together.
  const int32_t seeded_here = form.has_seed() ? 1 : 0;
  auto seeded = group->broadcast(Tensor::scalar<int32_t>(seeded_here), form.source);
  if (!seeded.ok()) return seeded.status();
  if (seeded->flat<int32_t>()[0] != 0) {
    // A survivor's own variables are replaced by the seed's, once it arrived.
    CAPSTAN_ASSIGN_OR_RETURN(auto from_seed,
                             MirroredVariables::Access::seeded(*group, form.specs, given_seed, form.source));
    replica->variables = std::move(from_seed);
  } else if (replica->variables != nullptr) {
    // Survivors: set_group changes nothing unless it succeeds.
    CAPSTAN_RETURN_IF_ERROR(replica->variables->set_group(*group, form.source));
  } else {
    std::vector<MirroredVariableSpec> specs;
    for (const auto& s : form.specs) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor zeros, Tensor::zeros(s.dtype, s.shape));
      specs.push_back({s.name, std::move(zeros), s.optimizer});
    }
    CAPSTAN_ASSIGN_OR_RETURN(replica->variables, MirroredVariables::join(*group, std::move(specs), form.source));
  }
  replica->input_position = form.input_position;
  training::ReplicaReport report;
  report.holds = true;
  report.step = replica->variables->step();
  report.checksum = replica->variables->checksum();
  report.input_position = replica->input_position;
  report.transports = group->transports();
  std::shared_ptr<Communicator> old;
  {
    MutexLock group_lock(replica->group_mutex);
    old = std::move(replica->group);
    replica->group = std::move(group);
    replica->epoch = form.epoch;
  }
  // The old group's thread is joined here, not under group_mutex (abort()
  // takes it on the RPC thread).
  old.reset();
  return report;
}

Result<training::MirroredState> Replicas::read(const std::string& strategy) {
  auto replica = find(strategy, false);
  if (replica == nullptr) return Status::NotFound("this worker holds no replica of strategy '" + strategy + "'");
  MutexLock lock(replica->mutex);
  if (replica->variables == nullptr) {
    return Status::NotFound("this worker holds no replica of strategy '" + strategy + "'");
  }
  return MirroredVariables::Access::state(*replica->variables);
}

Result<training::SavedReplica> Replicas::save(const std::string& strategy, const std::string& directory) {
  training::MirroredState state;
  {
    auto replica = find(strategy, false);
    if (replica == nullptr) return Status::NotFound("this worker holds no replica of strategy '" + strategy + "'");
    MutexLock lock(replica->mutex);
    if (replica->variables == nullptr) {
      return Status::NotFound("this worker holds no replica of strategy '" + strategy + "'");
    }
    state = MirroredVariables::Access::state(*replica->variables);
  }
  return checkpoint::write_mirrored_file(directory, checkpoint::mirrored_file_name(strategy), state);
}

void Replicas::abort(const std::string& strategy, int64_t epoch, const Status& reason) {
  auto replica = find(strategy, false);
  if (replica == nullptr) return;
  std::shared_ptr<Communicator> group;
  {
    MutexLock lock(replica->group_mutex);
    if (replica->epoch != epoch) return;
    group = replica->group;
  }
  if (group != nullptr && !group->aborted()) group->abort(reason);
}

Result<Replicas::Lease> Replicas::acquire(const std::string& strategy, int64_t epoch) {
  auto replica = find(strategy, false);
  if (replica == nullptr) {
    return Status::FailedPrecondition("this worker holds no replica of strategy '" + strategy +
                                      "' (the coordinator forms the group before a step)");
  }
  auto hold = std::make_shared<Hold<Replica>>(replica);
  {
    MutexLock lock(replica->group_mutex);
    if (replica->epoch != epoch || replica->group == nullptr) {
      return Status::FailedPrecondition("strategy '" + strategy + "': this worker's group is epoch " +
                                        std::to_string(replica->epoch) + ", the step is for epoch " +
                                        std::to_string(epoch));
    }
    hold->group = replica->group;
  }
  Communicator* group = hold->group.get();
  // The hold keeps replica->mutex locked for as long as the Lease lives.
  MirroredVariables* variables = [&]() NO_THREAD_SAFETY_ANALYSIS { return replica->variables.get(); }();
  int64_t* input_position = [&]() NO_THREAD_SAFETY_ANALYSIS { return &replica->input_position; }();
  if (variables == nullptr) {
    return Status::FailedPrecondition("strategy '" + strategy + "' has no variables on this worker");
  }
  return Lease(std::move(hold), group, variables, input_position);
}

}  // namespace capstan::worker_server
