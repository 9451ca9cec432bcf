#include "daemons/worker_server/worker.h"

#include <algorithm>
#include <optional>

#include "capstan/closure.h"
#include "capstan/phases.h"
#include "capstan/trace.h"

namespace capstan::worker_server {
namespace {

// Serializes get_next of a per-worker iterator: closures running at once on
// one worker (closures_per_worker > 1) share it.
class LockedIterator final : public data::Iterator {
 public:
  explicit LockedIterator(std::unique_ptr<data::Iterator> inner) : inner_(std::move(inner)) {}
  Result<std::optional<Element>> get_next() override {
    PhaseScope phase(Phase::kInput);  // waiting for the lock too
    MutexLock lock(mutex_);
    return inner_->get_next();
  }
  Result<std::string> save() override {
    MutexLock lock(mutex_);
    return inner_->save();
  }
  Status restore(std::string_view state) override {
    MutexLock lock(mutex_);
    return inner_->restore(state);
  }

 private:
  Mutex mutex_;
  std::unique_ptr<data::Iterator> inner_ GUARDED_BY(mutex_);
};

// One element, then the end.
class OneBatch final : public data::Iterator {
 public:
  explicit OneBatch(Element batch) : batch_(std::move(batch)) {}
  Result<std::optional<Element>> get_next() override {
    if (!batch_.has_value()) return std::optional<Element>();
    std::optional<Element> out = std::move(batch_);
    batch_.reset();
    return out;
  }

 private:
  std::optional<Element> batch_;
};

}  // namespace

// The context one closure run sees. Iterators it hands out stay alive while
// the closure runs (the shared_ptr is held here), even if the coordinator
// replaces them meanwhile.
class Worker::Context final : public ClosureContext {
 public:
  Context(Worker& worker, const RunClosureRequest& request, std::shared_ptr<std::atomic<bool>> cancelled,
          Replicas::Lease* replica)
      : worker_(worker), request_(request), cancelled_(std::move(cancelled)), replica_(replica) {}

  Communicator* group() override { return replica_ != nullptr ? &replica_->group() : nullptr; }
  MirroredVariables* mirrored() override { return replica_ != nullptr ? &replica_->variables() : nullptr; }

  int worker_index() const override {
    return request_.worker_index >= 0 ? request_.worker_index : std::max(0, worker_.task_index_.load());
  }
  int num_workers() const override { return request_.num_workers; }
  int attempt() const override { return request_.attempt; }
  bool cancelled() const override {
    return cancelled_->load(std::memory_order_relaxed) || std::chrono::system_clock::now() >= request_.deadline;
  }
  std::chrono::system_clock::time_point deadline() const override { return request_.deadline; }

  Result<Tensor> read(const std::string& variable) override {
    PhaseScope phase(Phase::kPs); return worker_.variables_.read(variable); }
  Result<std::vector<Tensor>> read_many(const std::vector<std::string>& variables) override {
    PhaseScope phase(Phase::kPs);
    return worker_.variables_.read_many(variables);
  }
  Status apply_gradients_many(const std::vector<std::string>& variables, const std::vector<Tensor>& gradients,
                              const ApplyOptions& options = {}) override {
    PhaseScope phase(Phase::kPs);
    return worker_.variables_.apply_dense_many(variables, gradients, 0, options.learning_rate);
  }
  Result<Tensor> gather(const std::string& variable, const Tensor& ids) override {
    PhaseScope phase(Phase::kPs);
    return worker_.variables_.gather(variable, ids);
  }
  Status assign(const std::string& variable, const Tensor& value) override {
    PhaseScope phase(Phase::kPs);
    return worker_.variables_.assign(variable, value);
  }
  Status assign_add(const std::string& variable, const Tensor& delta) override {
    PhaseScope phase(Phase::kPs);
    return worker_.variables_.assign_add(variable, delta);
  }
  Status apply_gradients(const std::string& variable, const Tensor& gradient,
                         const ApplyOptions& options = {}) override {
    PhaseScope phase(Phase::kPs);
    return worker_.variables_.apply_dense(variable, gradient, 0, options.learning_rate);
  }
  Status apply_sparse_gradients(const std::string& variable, const Tensor& ids, const Tensor& rows,
                                const ApplyOptions& options = {}) override {
    PhaseScope phase(Phase::kPs);
    return worker_.variables_.apply_sparse(variable, ids, rows, 0, options.learning_rate);
  }
  Result<Tensor> lookup(const std::string& table, const Tensor& ids, bool insert) override {
    PhaseScope phase(Phase::kPs);
    return worker_.variables_.lookup(table, ids, insert);
  }
  Result<data::Iterator*> iterator(const Tensor& arg) override {
    if (arg.dtype() != DType::kInt64 || arg.num_elements() != 1) {
      return Status::InvalidArgument(
          "iterator(): the argument is not a per-worker dataset (use PerWorkerDataset::arg())");
    }
    int64_t id = arg.flat<int64_t>()[0];
    if (request_.step_input.has_value() && request_.step_input->dataset_id == id) return step_batch(id);
    MutexLock lock(worker_.mutex_);
    auto it = worker_.iterators_.find(id);
    if (it == worker_.iterators_.end()) {
      std::string what = "per-worker dataset " + std::to_string(id) + " has no iterator on this worker";
      if (auto failed = worker_.failures_.find(id); failed != worker_.failures_.end()) {
        return Status::FailedPrecondition(what + ": building it failed: " + failed->second.to_string());
      }
      return Status::FailedPrecondition(what + " (the coordinator has not sent it here: it sends each per-worker "
                                               "dataset when it is created and when a worker registers)");
    }
    held_.push_back(it->second);
    return it->second.get();
  }

 private:
  // The step's share of its strategy's step input, as an iterator of one
  // batch (asked for again, the same iterator: the step reads its share
  // once).
  // Reading it weights this replica's gradients by its share of the step
  // (MirroredVariables::set_gradient_weight).
  Result<data::Iterator*> step_batch(int64_t id) {
    if (step_batch_ == nullptr) {
      PhaseScope phase(Phase::kInput);
      CAPSTAN_ASSIGN_OR_RETURN(auto elements, worker_.step_input_elements(id));
      CAPSTAN_ASSIGN_OR_RETURN(Element batch, elements->batch(*request_.step_input));
      if (replica_ != nullptr) {
        CAPSTAN_RETURN_IF_ERROR(replica_->variables().set_gradient_weight(request_.step_input->weight));
      }
      step_batch_ = std::make_shared<OneBatch>(std::move(batch));
    }
    return step_batch_.get();
  }

 public:
  bool took_step_input() const { return step_batch_ != nullptr; }

 private:

  Worker& worker_;
  const RunClosureRequest& request_;
  const std::shared_ptr<std::atomic<bool>> cancelled_;
  Replicas::Lease* const replica_;  // a synchronous step's; else null
  std::vector<std::shared_ptr<data::Iterator>> held_;
  std::shared_ptr<data::Iterator> step_batch_;
};

Worker::Worker(const FunctionRegistry& functions, VariableAccess& variables, int task_index, Replicas* replicas)
    : functions_(functions), variables_(variables), replicas_(replicas), task_index_(task_index) {}

Worker::~Worker() = default;

std::vector<std::string> Worker::function_names() const {
  auto names = functions_.closure_names();
  for (const auto& entry : functions_.names()) {
    if (entry.rfind("dataset:", 0) == 0) names.push_back(entry);
  }
  return names;
}

Status Worker::check_closure(const std::string& function) const {
  if (functions_.find_closure(function) == nullptr) {
    return Status::NotFound("this worker has no closure named '" + function + "'");
  }
  return Status::Ok();
}

Result<Element> Worker::run_closure(const RunClosureRequest& request, RunInfo* info) {
  std::string what = "closure " + std::to_string(request.closure_id);
  if (request.attempt > 1) what += ", attempt " + std::to_string(request.attempt);
  if (!request.strategy.empty()) what += ", strategy " + request.strategy + " epoch " + std::to_string(request.epoch);
  trace::Span span(request.strategy.empty() ? trace::Kind::kClosure : trace::Kind::kStep, request.function,
                   std::move(what));
  // The flow from the program's schedule() of it (a trace links them).
  span.set_flow_in(static_cast<uint64_t>(request.closure_id));
  Result<Element> result = run_closure_timed(request, info);
  if (!result.ok()) span.fail(result.status().to_string());
  return result;
}

Result<Element> Worker::run_closure_timed(const RunClosureRequest& request, RunInfo* info) {
  PhaseRecorder recorder;  // from here: refreshing placements is ps time
  // On every return: where the run's time went.
  struct Timed {
    const PhaseRecorder& recorder;
    RunInfo* info;
    ~Timed() {
      if (info != nullptr) info->phases = recorder.stop();
    }
  } timed{recorder, info};
  const ClosureFunction* fn = functions_.find_closure(request.function);
  if (fn == nullptr) return check_closure(request.function);
  {
    PhaseScope phase(Phase::kPs);
    CAPSTAN_RETURN_IF_ERROR(variables_.refresh_if_older(request.placement_version));
  }
  // A synchronous step holds its replica (group and variables) while it runs.
  std::optional<Replicas::Lease> replica;
  if (!request.strategy.empty()) {
    if (replicas_ == nullptr) {
      return Status::FailedPrecondition("this worker cannot run synchronous steps (no replicas)");
    }
    auto lease = replicas_->acquire(request.strategy, request.epoch);
    if (!lease.ok()) return lease.status().with_context(request.function);
    replica.emplace(std::move(*lease));
  }
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  const int64_t id = request.closure_id;
  if (id != 0) {
    MutexLock lock(mutex_);
    auto early = std::find(early_cancels_.begin(), early_cancels_.end(), id);
    if (early != early_cancels_.end()) {
      early_cancels_.erase(early);
      cancelled->store(true);
    }
    running_[id] = cancelled;
  }
  Context context(*this, request, cancelled, replica.has_value() ? &*replica : nullptr);
  Result<Element> result = cancelled->load()      ? Result<Element>(Status::Cancelled(""))
                           : replica.has_value() ? run_step_closure(*fn, request, context, *replica)
                                                 : (*fn)(context, request.args);
  if (id != 0) {
    MutexLock lock(mutex_);
    running_.erase(id);
  }
  if (info != nullptr) info->took_step_input = context.took_step_input();
  if (replica.has_value() && !result.ok()) {
    // The other replicas may be waiting in a collective this one will not
    // call: let them fail now, with this replica's error.
    replica->abort(result.status().with_context("replica " + std::to_string(replica->group().rank()) + " (" +
                                                request.function + ")"));
  }
  if (cancelled->load()) {
    return Status::Cancelled("closure " + std::to_string(id) + " (" + request.function +
                             ") was cancelled by the coordinator; its result is abandoned");
  }
  if (!result.ok()) return result.status().with_context(request.function);
  return result;
}

Result<Element> Worker::run_step_closure(const ClosureFunction& fn, const RunClosureRequest& request,
                                        Context& context, Replicas::Lease& replica) {
  if (!request.step_input.has_value()) return fn(context, request.args);
  MirroredVariables& variables = replica.variables();
  const int64_t step_before = variables.step();
  Result<Element> result = fn(context, request.args);
  (void)variables.set_gradient_weight(1.0);  // reading the input set it
  // A closure that read the step input and succeeded, or whose variables
  // took the update made from it: the input position goes with them.
  if (context.took_step_input() && (result.ok() || variables.step() != step_before)) {
    replica.set_input_position(request.step_input->end);
  }
  return result;
}

Result<std::shared_ptr<const data::StepInputElements>> Worker::step_input_elements(int64_t id) {
  MutexLock reading(step_input_read_mutex_);
  std::shared_ptr<data::Iterator> iterator;
  {
    MutexLock lock(mutex_);
    if (auto it = step_inputs_.find(id); it != step_inputs_.end()) return it->second;
    auto it = iterators_.find(id);
    if (it == iterators_.end()) {
      auto failed = failures_.find(id);
      return Status::FailedPrecondition(
          "step input (per-worker dataset " + std::to_string(id) + ") has no iterator on this worker" +
          (failed != failures_.end() ? ": building it failed: " + failed->second.to_string() : std::string()));
    }
    iterator = it->second;
  }
  auto elements = data::StepInputElements::read(*iterator, step_input_budget_.load());
  const std::string context = "step input (per-worker dataset " + std::to_string(id) + ")";
  if (!elements.ok()) {
    // The read stopped part way: the next step reads from a fresh iterator.
    IteratorMaker make;
    {
      MutexLock lock(mutex_);
      if (auto it = makers_.find(id); it != makers_.end()) make = it->second;
    }
    if (make) (void)install(id, make);
    return elements.status().with_context(context);
  }
  MutexLock lock(mutex_);
  // Kept only while the iterator it was read from is the dataset's.
  if (auto it = iterators_.find(id); it != iterators_.end() && it->second == iterator) step_inputs_[id] = *elements;
  return *elements;
}

std::vector<Result<Element>> Worker::run_closures(const std::vector<Result<RunClosureRequest>>& requests,
                                                  std::vector<RunInfo>* infos) {
  std::vector<Result<Element>> outcomes;
  outcomes.reserve(requests.size());
  if (infos != nullptr) infos->assign(requests.size(), RunInfo{});
  Status failed;
  for (const auto& request : requests) {
    if (!failed.ok()) {
      outcomes.push_back(Status::Aborted("not run: an earlier closure of its batch failed (" + failed.message() + ")"));
      continue;
    }
    RunInfo* info = infos != nullptr ? &(*infos)[outcomes.size()] : nullptr;
    outcomes.push_back(request.ok() ? run_closure(*request, info) : Result<Element>(request.status()));
    if (!outcomes.back().ok()) failed = outcomes.back().status();
  }
  return outcomes;
}

void Worker::cancel_closure(int64_t closure_id) {
  MutexLock lock(mutex_);
  auto it = running_.find(closure_id);
  if (it != running_.end()) {
    it->second->store(true);
    return;
  }
  early_cancels_.push_back(closure_id);
  if (early_cancels_.size() > kRememberedCancels) early_cancels_.pop_front();
}

Status Worker::install(int64_t id, IteratorMaker make) {
  auto iterator = make();
  if (!iterator.ok()) return iterator.status();
  auto locked = std::make_shared<LockedIterator>(std::move(*iterator));
  MutexLock lock(mutex_);
  iterators_[id] = std::move(locked);
  makers_[id] = std::move(make);
  step_inputs_.erase(id);
  return Status::Ok();
}

Result<std::string> Worker::save_iterator(int64_t id) {
  std::shared_ptr<data::Iterator> iterator;
  {
    MutexLock lock(mutex_);
    auto it = iterators_.find(id);
    if (it == iterators_.end()) {
      return Status::NotFound("this worker has no iterator of per-worker dataset " + std::to_string(id));
    }
    iterator = it->second;
  }
  return iterator->save();
}

Status Worker::restore_iterator(int64_t id, const std::string& state) {
  IteratorMaker make;
  {
    MutexLock lock(mutex_);
    auto it = makers_.find(id);
    if (it == makers_.end()) {
      return Status::NotFound("this worker has no iterator of per-worker dataset " + std::to_string(id) +
                              " to restore");
    }
    make = it->second;
  }
  CAPSTAN_ASSIGN_OR_RETURN(auto fresh, make());
  CAPSTAN_RETURN_IF_ERROR(fresh->restore(state).with_context("per-worker dataset " + std::to_string(id)));
  auto locked = std::make_shared<LockedIterator>(std::move(fresh));
  MutexLock lock(mutex_);
  iterators_[id] = std::move(locked);
  step_inputs_.erase(id);
  return Status::Ok();
}

Status Worker::record(int64_t id, Status status) {
  MutexLock lock(mutex_);
  if (status.ok()) {
    failures_.erase(id);
  } else {
    iterators_.erase(id);  // a failed rebuild leaves no stale iterator behind
    makers_.erase(id);
    step_inputs_.erase(id);
    failures_[id] = status;
  }
  return status;
}

bool Worker::keep(int64_t id, uint64_t uid) {
  MutexLock lock(mutex_);
  auto it = uids_.find(id);
  if (uid == 0 || it == uids_.end() || it->second != uid || iterators_.count(id) == 0) {
    uids_[id] = uid;
    stale_.erase(id);
    return false;
  }
  stale_.erase(id);
  return true;
}

Status Worker::create_dataset(int64_t id, const std::string& definition, uint64_t uid) {
  if (keep(id, uid)) return Status::Ok();
  const std::string context = "per-worker dataset " + std::to_string(id);
  auto dataset = data::Dataset::deserialize(definition);
  if (!dataset.ok()) return record(id, dataset.status().with_context(context));
  return record(id, install(id, [this, dataset = *std::move(dataset)]() {
                      return dataset.make_iterator(&functions_);
                    }).with_context(context));
}

Status Worker::create_dataset_from_function(int64_t id, const std::string& function, InputContext input,
                                            uint64_t uid) {
  if (keep(id, uid)) return Status::Ok();
  const DatasetFunction* fn = functions_.find_dataset_function(function);
  if (fn == nullptr) {
    return record(id, Status::NotFound("this worker has no dataset function named '" + function + "'"));
  }
  const std::string context = "dataset function '" + function + "'";
  auto dataset = (*fn)(input);
  if (!dataset.ok()) return record(id, dataset.status().with_context(context));
  return record(id, install(id, [this, dataset = *std::move(dataset)]() {
                      return dataset.make_iterator(&functions_);
                    }).with_context(context));
}

void Worker::clear_datasets() {
  MutexLock lock(mutex_);
  iterators_.clear();
  makers_.clear();
  step_inputs_.clear();
  failures_.clear();
  uids_.clear();
  stale_.clear();
}

void Worker::mark_datasets_stale() {
  MutexLock lock(mutex_);
  for (const auto& [id, it] : iterators_) stale_.insert(id);
  for (const auto& [id, status] : failures_) stale_.insert(id);
}

void Worker::drop_stale_datasets() {
  MutexLock lock(mutex_);
  for (int64_t id : stale_) {
    iterators_.erase(id);
    makers_.erase(id);
    step_inputs_.erase(id);
    failures_.erase(id);
    uids_.erase(id);
  }
  stale_.clear();
}

}  // namespace capstan::worker_server
