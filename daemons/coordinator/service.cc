#include "daemons/coordinator/service.h"

#include <kj/debug.h>

#include "capstan/data/dataset.h"
#include "data/tensor_util.h"
#include "rpc/errors.h"
#include "rpc/optimizer_codec.h"
#include "rpc/pool.h"
#include "rpc/tensor_codec.h"
#include "wire_names.h"

namespace capstan::coordinator {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

Result<placement::Partitioner> partitioner_from_wire(wire::Partitioner::Reader in) {
  std::string kind = text(in.getKind());
  placement::Partitioner p;
  if (kind.empty() || kind == "none") return p;
  if (kind == "fixed_shards") return placement::Partitioner::fixed_shards(in.getNumShards());
  if (kind == "min_size") {
    return placement::Partitioner::min_size(in.getMinShardBytes(), in.getMaxShards(), in.getBytesPerString());
  }
  if (kind == "max_size") {
    return placement::Partitioner::max_size(in.getMaxShardBytes(), in.getMaxShards(), in.getBytesPerString());
  }
  return Status::InvalidArgument("unknown partitioner '" + kind + "'");
}

kj::TimePoint far_future(kj::Timer& timer) { return timer.now() + 3650 * 24 * 3600 * kj::SECONDS; }

}  // namespace

Result<CoordinatorConfig> CoordinatorConfig::from(const daemon::Config& config) {
  CoordinatorConfig out;
  out.ps = config.has("ps") ? config.get_list("ps") : std::vector<std::string>{};
  if (out.ps.empty()) out.ps = config.cluster().addresses("ps");
  for (const char* key : {"worker_ping_interval_ms", "worker_ping_timeout_ms"}) {
    if (config.get_int(key) <= 0) {
      return Status::InvalidArgument(std::string(key) + ": " + std::to_string(config.get_int(key)) +
                                     " must be positive");
    }
  }
  if (config.get_int("closures_per_worker") < 1) {
    return Status::InvalidArgument("closures_per_worker: " + std::to_string(config.get_int("closures_per_worker")) +
                                   " must be at least 1");
  }
  out.closures_per_worker = static_cast<int>(config.get_int("closures_per_worker"));
  out.worker_ping_interval = std::chrono::milliseconds(config.get_int("worker_ping_interval_ms"));
  out.worker_ping_timeout = std::chrono::milliseconds(config.get_int("worker_ping_timeout_ms"));
  out.expected_workers = config.get_int("num_workers") > 0
                             ? static_cast<int>(config.get_int("num_workers"))
                             : static_cast<int>(config.cluster().addresses("worker").size());
  return out;
}

CoordinatorService::CoordinatorService(daemon::DaemonContext& ctx)
    : NodeService(ctx),
      config_(CoordinatorConfig::from(ctx.config).value()),  // checked by main() before
      closures_per_worker_(config_.closures_per_worker),
      worker_ping_interval_(config_.worker_ping_interval),
      worker_ping_timeout_(config_.worker_ping_timeout),
      expected_workers_(config_.expected_workers),
      placer_([&ctx]() {
        int n = 0;
        for (const auto& peer : ctx.peers) n += peer.role == wire::Role::PS ? 1 : 0;
        return std::max(n, 1);
      }()),
      tasks_(*this) {
  for (const auto& peer : ctx.peers) {
    if (peer.role != wire::Role::PS) continue;
    Ps ps;
    ps.address = peer.address;
    ps.connection = kj::heap<rpc::Connection>(ctx.loop->io(), ctx.loop->timer(), peer.address,
                                              ctx.peer_options);
    ps_.push_back(kj::mv(ps));
  }
  for (size_t i = 0; i < ps_.size(); ++i) tasks_.add(watch_ps(i));
}

CoordinatorService::~CoordinatorService() = default;

void CoordinatorService::taskFailed(kj::Exception&& exception) {
  ctx_.log->error("coordinator task failed: {}", rpc::from_exception(exception).to_string());
}

void CoordinatorService::notify() {
  auto waiters = kj::mv(waiters_);
  waiters_ = kj::Vector<kj::Own<kj::PromiseFulfiller<void>>>();
  for (auto& w : waiters) w->fulfill();
}

kj::Promise<void> CoordinatorService::changed() {
  auto paf = kj::newPromiseAndFulfiller<void>();
  waiters_.add(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

Status CoordinatorService::ps_status() const {
  for (size_t i = 0; i < ps_.size(); ++i) {
    if (!ps_[i].up) {
      return Status::Unavailable("parameter server ps:" + std::to_string(i) + " at " + ps_[i].address +
                                 " is unreachable");
    }
  }
  return Status::Ok();
}

kj::Promise<void> CoordinatorService::watch_ps(size_t index) {
  auto& ps = ps_[index];
  return ps.connection->node(far_future(ctx_.loop->timer()))
      .then([this, index](wire::Node::Client) {
        ps_[index].up = true;
        notify();
        return ps_[index].connection->on_disconnect();
      })
      .then([this, index]() {
        ps_[index].up = false;
        ctx_.log->warn("parameter server ps:{} at {} is unreachable", index, ps_[index].address);
        notify();
        return watch_ps(index);
      });
}

// ---- Workers ---------------------------------------------------------------------

kj::Promise<void> CoordinatorService::registerWorker(RegisterWorkerContext context) {
  auto params = context.getParams();
  Worker worker;
  worker.id = next_worker_id_++;
  worker.task_index = params.getTaskIndex();
  worker.client = params.getWorker();
  std::string names;
  for (auto f : params.getFunctions()) {
    worker.functions.insert(text(f));
    names += (names.empty() ? "" : ", ") + text(f);
  }
  int64_t id = worker.id;
  workers_.emplace(id, kj::mv(worker));
  ctx_.log->info("worker {} (task {}) joined; closures: {}", id, params.getTaskIndex(),
                 names.empty() ? "none" : names);
  context.getResults().setWorkerId(id);
  // Its per-worker iterators first, then closures.
  return send_datasets(id).then([this, id]() {
    for (int i = 0; i < closures_per_worker_; ++i) tasks_.add(lane(id));
    tasks_.add(watch_worker(id));
    notify();
  });
}

kj::Promise<void> CoordinatorService::watch_worker(int64_t worker_id) {
  return ctx_.loop->timer().afterDelay(worker_ping_interval_.count() * kj::MILLISECONDS).then([this, worker_id]() -> kj::Promise<void> {
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || !it->second.alive) return kj::READY_NOW;
    auto ping = it->second.client.infoRequest().send().ignoreResult();
    return rpc::with_deadline(ctx_.loop->timer(), kj::mv(ping), worker_ping_timeout_, "ping")
        .then([this, worker_id]() { return watch_worker(worker_id); },
              [this, worker_id](kj::Exception&& e) {
                drop_worker(worker_id, rpc::from_exception(e).with_context("no answer to a ping"));
              });
  });
}

void CoordinatorService::drop_worker(int64_t worker_id, const Status& why) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || !it->second.alive) return;
  it->second.alive = false;
  auto requeued = queue_.worker_failed(worker_id);
  ctx_.log->warn("worker {} (task {}) lost ({}); {} running closure(s) re-queued", worker_id,
                 it->second.task_index, why.message(), requeued.size());
  workers_.erase(it);
  notify();
}

kj::Promise<void> CoordinatorService::lane(int64_t worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || !it->second.alive) return kj::READY_NOW;
  if (!ps_status().ok()) return changed().then([this, worker_id]() { return lane(worker_id); });
  auto closure = queue_.next(worker_id);
  if (!closure) return changed().then([this, worker_id]() { return lane(worker_id); });
  auto args = rpc::element_from_bytes(closure->args);
  if (!args.ok()) {
    queue_.complete(closure->id, worker_id, args.status());
    notify();
    return lane(worker_id);
  }
  auto request = it->second.client.runClosureRequest();
  request.setClosureId(closure->id);
  request.setFunction(closure->function);
  request.setPlacementVersion(placement_version_);
  request.setAttempt(static_cast<uint32_t>(closure->attempts));
  request.setNumWorkers(static_cast<uint32_t>(workers_.size()));
  rpc::write_element(request.initArgs(), *args, ctx_.codec);
  int64_t id = closure->id;
  return request.send()
      .then([](capnp::Response<wire::Worker::RunClosureResults>&& response) {
        return rpc::read_element(response.getResult()).attach(kj::mv(response));
      })
      .then(
          [this, worker_id, id](Element&& result) {
            queue_.complete(id, worker_id, rpc::element_to_bytes(result));
            notify();
            return lane(worker_id);
          },
          [this, worker_id, id](kj::Exception&& e) -> kj::Promise<void> {
            Status status = rpc::from_exception(e);
            if (rpc::is_transport_failure(e)) {
              // The link to the worker broke: the worker is gone.
              drop_worker(worker_id, status);
              return kj::READY_NOW;
            }
            queue_.complete(id, worker_id, status);
            notify();
            return lane(worker_id);
          });
}

int CoordinatorService::num_workers_for_datasets() const {
  return std::max<int>(expected_workers_, static_cast<int>(workers_.size()));
}

kj::Promise<void> CoordinatorService::send_dataset(Worker& worker, int64_t id,
                                                   const PerWorkerDataset& dataset) {
  int n = std::max(num_workers_for_datasets(), worker.task_index + 1);
  int64_t worker_id = worker.id;
  kj::Promise<void> sent = nullptr;
  if (!dataset.function.empty()) {
    auto request = worker.client.createDatasetFromFunctionRequest();
    request.setDatasetId(id);
    request.setFunction(dataset.function);
    request.setNumWorkers(n);
    request.setWorkerIndex(worker.task_index);
    sent = request.send().ignoreResult();
  } else {
    auto parsed = data::Dataset::deserialize(dataset.definition);
    rpc::check(parsed.status());
    auto resolved = parsed->resolve_shard_hint(n, worker.task_index).serialize();
    auto request = worker.client.createDatasetRequest();
    request.setDatasetId(id);
    request.setDefinition(kj::arrayPtr(reinterpret_cast<const kj::byte*>(resolved.data()), resolved.size()));
    sent = request.send().ignoreResult();
  }
  return sent.catch_([this, worker_id, id](kj::Exception&& e) {
    ctx_.log->warn("worker {} could not build per-worker dataset {}: {}", worker_id, id,
                   rpc::from_exception(e).to_string());
  });
}

kj::Promise<void> CoordinatorService::send_datasets(int64_t worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return kj::READY_NOW;
  auto sends = kj::heapArrayBuilder<kj::Promise<void>>(datasets_.size());
  for (const auto& [id, dataset] : datasets_) sends.add(send_dataset(it->second, id, dataset));
  return kj::joinPromises(sends.finish());
}

kj::Promise<void> CoordinatorService::createPerWorkerDataset(CreatePerWorkerDatasetContext context) {
  auto bytes = context.getParams().getDefinition();
  PerWorkerDataset dataset;
  dataset.definition.assign(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  rpc::check(data::Dataset::deserialize(dataset.definition).status().with_context("createPerWorkerDataset"));
  int64_t id = next_dataset_id_++;
  datasets_[id] = dataset;
  context.getResults().setDatasetId(id);
  // Existing workers build theirs now; later ones when they register.
  auto sends = kj::heapArrayBuilder<kj::Promise<void>>(workers_.size());
  for (auto& [worker_id, worker] : workers_) sends.add(send_dataset(worker, id, dataset));
  return kj::joinPromises(sends.finish());
}

kj::Promise<void> CoordinatorService::createPerWorkerDatasetFromFunction(
    CreatePerWorkerDatasetFromFunctionContext context) {
  PerWorkerDataset dataset;
  dataset.function = text(context.getParams().getFunction());
  if (!workers_.empty() && !any_worker_has("dataset:" + dataset.function)) {
    rpc::throw_status(Status::NotFound("create_per_worker_dataset: no worker has a dataset function named '" +
                                       dataset.function + "'"));
  }
  int64_t id = next_dataset_id_++;
  datasets_[id] = dataset;
  context.getResults().setDatasetId(id);
  auto sends = kj::heapArrayBuilder<kj::Promise<void>>(workers_.size());
  for (auto& [worker_id, worker] : workers_) sends.add(send_dataset(worker, id, dataset));
  return kj::joinPromises(sends.finish());
}

// ---- Checkpoints -------------------------------------------------------------------

kj::Promise<std::vector<VariableState>> CoordinatorService::snapshot() {
  rpc::check(ps_status());
  auto deadline = ctx_.loop->timer().now() + 60 * kj::SECONDS;
  auto states = std::make_shared<std::vector<VariableState>>();
  auto reads = kj::Vector<kj::Promise<void>>();
  for (const auto& [name, variable] : variables_) {
    VariableState state;
    state.name = name;
    state.dtype = variable.dtype;
    state.shape = variable.shape;
    state.optimizer = variable.optimizer;
    for (const auto& shard : variable.shards) {
      ShardState s;
      s.name = shard.name;
      s.ps_task = shard.ps_task;
      s.first_row = shard.first_row;
      s.rows = shard.rows;
      state.shards.push_back(std::move(s));
    }
    states->push_back(std::move(state));
  }
  for (size_t v = 0; v < states->size(); ++v) {
    for (size_t k = 0; k < (*states)[v].shards.size(); ++k) {
      auto& ps = ps_[static_cast<size_t>((*states)[v].shards[k].ps_task)];
      reads.add(ps.connection->service<wire::ParameterServer>(deadline).then(
          [states, v, k](wire::ParameterServer::Client client) {
            ShardState& s = (*states)[v].shards[k];
            auto read = client.readRequest();
            read.setName(s.name);
            auto slots = client.readSlotsRequest();
            slots.setName(s.name);
            auto value = read.send().then([](capnp::Response<wire::ParameterServer::ReadResults>&& r) {
              return rpc::read_tensor(r.getValue()).attach(kj::mv(r));
            });
            auto list = client.listShardsRequest().send();
            return value.then([states, v, k, slots = slots.send(), list = kj::mv(list)](Tensor&& t) mutable {
              (*states)[v].shards[k].value = std::move(t);
              return slots.then([states, v, k, list = kj::mv(list)](
                                    capnp::Response<wire::ParameterServer::ReadSlotsResults>&& r) mutable {
                auto reads = kj::heapArrayBuilder<kj::Promise<void>>(r.getSlots().size());
                for (auto slot : r.getSlots()) {
                  std::string slot_name = text(slot.getName());
                  reads.add(rpc::read_tensor(slot.getTensor()).then([states, v, k, slot_name](Tensor&& t) {
                    (*states)[v].shards[k].slots[slot_name] = std::move(t);
                  }));
                }
                return kj::joinPromises(reads.finish()).attach(kj::mv(r)).then(
                    [states, v, k, list = kj::mv(list)]() mutable {
                      return list.then([states, v, k](capnp::Response<wire::ParameterServer::ListShardsResults>&& r) {
                        ShardState& s = (*states)[v].shards[k];
                        for (auto info : r.getShards()) {
                          if (text(info.getName()) == s.name) s.step = info.getStep();
                        }
                      });
                    });
              });
            });
          }));
    }
  }
  return kj::joinPromises(reads.releaseAsArray()).then([states]() { return std::move(*states); });
}

kj::Promise<void> CoordinatorService::saveCheckpoint(SaveCheckpointContext context) {
  auto params = context.getParams();
  std::string dir = text(params.getDirectory());
  int64_t step = params.getStep();
  int max_to_keep = params.getMaxToKeep();
  if (dir.empty()) rpc::throw_status(Status::InvalidArgument("saveCheckpoint: empty directory"));
  return snapshot()
      .then([this, dir, step, max_to_keep](std::vector<VariableState>&& states) {
        return rpc::run_on_pool(ctx_.pool, [dir, step, max_to_keep, states = std::move(states)]() {
          return write_checkpoint(dir, step, max_to_keep, states);
        });
      })
      .then([this, context](Result<std::string> path) mutable {
        rpc::check(path.status().with_context("saveCheckpoint"));
        ctx_.log->info("saved checkpoint {}", *path);
        context.getResults().setPath(*path);
      });
}

kj::Promise<void> CoordinatorService::write_shards(std::vector<VariableState> states) {
  auto deadline = ctx_.loop->timer().now() + 60 * kj::SECONDS;
  auto writes = kj::Vector<kj::Promise<void>>();
  for (const auto& v : states) {
    for (const auto& s : v.shards) {
      auto& ps = ps_[static_cast<size_t>(s.ps_task)];
      writes.add(ps.connection->service<wire::ParameterServer>(deadline).then(
          [this, s](wire::ParameterServer::Client client) {
            auto assign = client.assignRequest();
            assign.setName(s.name);
            rpc::write_tensor(assign.initValue(), s.value, ctx_.codec);
            auto set = client.setSlotsRequest();
            set.setName(s.name);
            set.setStep(s.step);
            auto slots = set.initSlots(static_cast<unsigned>(s.slots.size()));
            unsigned i = 0;
            for (const auto& [slot, tensor] : s.slots) {
              slots[i].setName(slot);
              rpc::write_tensor(slots[i].initTensor(), tensor, ctx_.codec);
              ++i;
            }
            return assign.send().ignoreResult().then([set = kj::mv(set)]() mutable {
              return set.send().ignoreResult();
            });
          }));
    }
  }
  return kj::joinPromises(writes.releaseAsArray());
}

kj::Promise<void> CoordinatorService::restoreCheckpoint(RestoreCheckpointContext context) {
  std::string path = text(context.getParams().getPath());
  rpc::check(ps_status());
  return rpc::run_on_pool(ctx_.pool, [path]() -> Result<std::shared_ptr<checkpoint::CheckpointReader>> {
           CAPSTAN_ASSIGN_OR_RETURN(std::string resolved, resolve_checkpoint(path));
           CAPSTAN_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::open(resolved));
           return std::shared_ptr<checkpoint::CheckpointReader>(std::move(reader));
         })
      .then([this](Result<std::shared_ptr<checkpoint::CheckpointReader>> reader) {
        rpc::check(reader.status().with_context("restoreCheckpoint"));
        // Variables the program has not created (again) get the
        // checkpoint's number of shards on the current parameter servers.
        auto creates = kj::Vector<kj::Promise<void>>();
        for (const auto& saved : (*reader)->manifest().variables) {
          if (variables_.count(saved.name) != 0) continue;
          auto zeros = Tensor::zeros(saved.dtype, saved.shape);
          rpc::check(zeros.status());
          placement::Partitioner partitioner =
              saved.shape.empty() ? placement::Partitioner::none()
                                  : placement::Partitioner::fixed_shards(static_cast<int64_t>(saved.shards.size()));
          auto placed = placer_.place(saved.name, saved.shape, saved.dtype, partitioner);
          rpc::check(placed.status());
          Variable variable;
          variable.name = saved.name;
          variable.dtype = saved.dtype;
          variable.shape = saved.shape;
          variable.optimizer = saved.optimizer;
          for (const auto& p : *placed) variable.shards.push_back({p.name, p.ps_task, p.first_row, p.rows});
          creates.add(create_shards(std::move(variable), std::move(*zeros)));
        }
        return kj::joinPromises(creates.releaseAsArray()).then([reader = *reader]() { return reader; });
      })
      .then([this](std::shared_ptr<checkpoint::CheckpointReader> reader) {
        std::vector<VariableState> states;
        for (const auto& [name, variable] : variables_) {
          VariableState state;
          state.name = name;
          state.dtype = variable.dtype;
          state.shape = variable.shape;
          for (const auto& shard : variable.shards) {
            ShardState s;
            s.name = shard.name;
            s.ps_task = shard.ps_task;
            s.first_row = shard.first_row;
            s.rows = shard.rows;
            state.shards.push_back(std::move(s));
          }
          states.push_back(std::move(state));
        }
        return rpc::run_on_pool(ctx_.pool, [reader, states = std::move(states)]() mutable
                                -> Result<std::pair<int64_t, std::vector<VariableState>>> {
          CAPSTAN_RETURN_IF_ERROR(read_into(*reader, &states));
          return std::make_pair(reader->manifest().step, std::move(states));
        });
      })
      .then([this](Result<std::pair<int64_t, std::vector<VariableState>>> restored) {
        rpc::check(restored.status().with_context("restoreCheckpoint"));
        int64_t step = restored->first;
        return write_shards(std::move(restored->second)).then([step]() { return step; });
      })
      .then([this, context, path](int64_t step) mutable {
        ctx_.log->info("restored checkpoint {} (step {})", path, step);
        context.getResults().setStep(step);
      });
}

kj::Promise<void> CoordinatorService::workerAlive(WorkerAliveContext context) {
  auto it = workers_.find(context.getParams().getWorkerId());
  context.getResults().setAlive(it != workers_.end() && it->second.alive);
  return kj::READY_NOW;
}

bool CoordinatorService::any_worker_has(const std::string& name) const {
  for (const auto& [id, worker] : workers_) {
    if (worker.functions.count(name) != 0) return true;
  }
  return false;
}

std::set<std::string> CoordinatorService::worker_functions() const {
  std::set<std::string> all;
  for (const auto& [id, worker] : workers_) all.insert(worker.functions.begin(), worker.functions.end());
  return all;
}

kj::Promise<void> CoordinatorService::closureNames(ClosureNamesContext context) {
  std::set<std::string> all = worker_functions();
  auto names = context.getResults().initNames(static_cast<unsigned>(all.size()));
  unsigned i = 0;
  for (const auto& n : all) names.set(i++, n);
  return kj::READY_NOW;
}

kj::Promise<void> CoordinatorService::numWorkers(NumWorkersContext context) {
  context.getResults().setCount(static_cast<int32_t>(workers_.size()));
  return kj::READY_NOW;
}

// ---- Variables ---------------------------------------------------------------------

void CoordinatorService::fill_placement(const Variable& variable,
                                        wire::VariablePlacement::Builder out) const {
  out.setName(variable.name);
  out.setDtype(rpc::to_wire(variable.dtype));
  auto shape = out.initShape(static_cast<unsigned>(variable.shape.size()));
  for (unsigned d = 0; d < variable.shape.size(); ++d) shape.set(d, variable.shape[d]);
  auto shards = out.initShards(static_cast<unsigned>(variable.shards.size()));
  for (unsigned i = 0; i < variable.shards.size(); ++i) {
    const Shard& s = variable.shards[i];
    shards[i].setName(s.name);
    shards[i].setPsTask(s.ps_task);
    shards[i].setPsAddress(ps_[static_cast<size_t>(s.ps_task)].address);
    shards[i].setFirstRow(s.first_row);
    shards[i].setRows(s.rows);
  }
}

kj::Promise<void> CoordinatorService::createVariable(CreateVariableContext context) {
  auto spec = context.getParams().getSpec();
  std::string name = text(spec.getName());
  if (name.empty()) rpc::throw_status(Status::InvalidArgument("createVariable: empty name"));
  if (ps_.empty()) {
    rpc::throw_status(Status::FailedPrecondition(
        "createVariable: the coordinator has no parameter servers (set --ps or a 'ps' job)"));
  }
  rpc::check(ps_status());
  auto partitioner = partitioner_from_wire(spec.getPartitioner());
  rpc::check(partitioner.status().with_context("createVariable '" + name + "'"));
  // The parameter servers check the values; an unknown kind is refused here.
  auto decoded = rpc::optimizer_from_wire(spec.getOptimizer());
  rpc::check(decoded.status().with_context("createVariable '" + name + "'"));
  Optimizer optimizer = *decoded;
  return rpc::read_tensor(spec.getInitial())
      .then([this, name, partitioner = *partitioner, optimizer,
             context](Tensor&& initial) mutable -> kj::Promise<void> {
        auto existing = variables_.find(name);
        if (existing != variables_.end()) {
          // A reconnecting program creates its variables again: hand back
          // the ones that exist (their values stay on the parameter servers).
          if (existing->second.dtype != initial.dtype() || existing->second.shape != initial.shape()) {
            rpc::throw_status(Status::AlreadyExists(
                "variable '" + name + "' exists as " + std::string(dtype_name(existing->second.dtype)) +
                shape_string(existing->second.shape) + ", not " + std::string(dtype_name(initial.dtype())) +
                shape_string(initial.shape())));
          }
          fill_placement(existing->second, context.getResults().initPlacement());
          return kj::READY_NOW;
        }
        auto placed = placer_.place(name, initial.shape(), initial.dtype(), partitioner);
        rpc::check(placed.status().with_context("createVariable '" + name + "'"));
        Variable variable;
        variable.name = name;
        variable.dtype = initial.dtype();
        variable.shape = initial.shape();
        variable.optimizer = optimizer;
        for (const auto& p : *placed) variable.shards.push_back({p.name, p.ps_task, p.first_row, p.rows});
        std::string variable_name = variable.name;
        return create_shards(std::move(variable), std::move(initial)).then([this, variable_name, context]() mutable {
          fill_placement(variables_.at(variable_name), context.getResults().initPlacement());
        });
      });
}

kj::Promise<void> CoordinatorService::create_shards(Variable variable, Tensor initial) {
  auto creates = kj::heapArrayBuilder<kj::Promise<void>>(variable.shards.size());
  for (const auto& shard : variable.shards) {
    Tensor part = initial;
    if (initial.rank() > 0 && variable.shards.size() > 1) {
      auto slice = data::slice_rows(initial, shard.first_row, shard.first_row + shard.rows);
      rpc::check(slice.status());
      part = *slice;
    }
    auto& ps = ps_[static_cast<size_t>(shard.ps_task)];
    auto deadline = ctx_.loop->timer().now() + 10 * kj::SECONDS;
    auto optimizer = variable.optimizer;
    creates.add(ps.connection->service<wire::ParameterServer>(deadline).then(
        [this, part, name = shard.name, optimizer](wire::ParameterServer::Client client) {
          auto request = client.createShardRequest();
          request.setName(name);
          rpc::write_tensor(request.initInitial(), part, ctx_.codec);
          rpc::optimizer_to_wire(optimizer, request.initOptimizer());
          return request.send().ignoreResult();
        }));
  }
  return kj::joinPromises(creates.finish()).then([this, variable = std::move(variable)]() mutable {
    ++placement_version_;
    ctx_.log->info("variable '{}' {}{} placed in {} shard(s)", variable.name, dtype_name(variable.dtype),
                   shape_string(variable.shape), variable.shards.size());
    variables_[variable.name] = std::move(variable);
  });
}

kj::Promise<void> CoordinatorService::placements(PlacementsContext context) {
  auto out = context.getResults().initPlacements();
  out.setVersion(placement_version_);
  auto list = out.initVariables(static_cast<unsigned>(variables_.size()));
  unsigned i = 0;
  for (const auto& [name, variable] : variables_) fill_placement(variable, list[i++]);
  return kj::READY_NOW;
}

// ---- Closures ----------------------------------------------------------------------

kj::Promise<void> CoordinatorService::schedule(ScheduleContext context) {
  auto params = context.getParams();
  std::string function = text(params.getFunction());
  if (queue_.has_error()) rpc::throw_status(queue_.take_error());
  rpc::check(ps_status());
  // The name list is only built for the error message, off the hot path.
  if (!workers_.empty() && !any_worker_has(function)) {
    std::string names;
    for (const auto& n : worker_functions()) names += (names.empty() ? "" : ", ") + n;
    rpc::throw_status(Status::NotFound("schedule: no worker has a closure named '" + function +
                                       "' (workers have: " + (names.empty() ? "none" : names) + ")"));
  }
  return rpc::read_element(params.getArgs()).then([this, function, context](Element&& args) mutable {
    auto id = queue_.schedule(function, rpc::element_to_bytes(args));
    rpc::check(id.status());
    context.getResults().setClosureId(*id);
    notify();
  });
}

kj::Promise<void> CoordinatorService::wait_for_join() {
  if (queue_.has_error()) rpc::throw_status(queue_.take_error());
  rpc::check(ps_status());
  if (queue_.idle()) return kj::READY_NOW;
  return changed().then([this]() { return wait_for_join(); });
}

kj::Promise<void> CoordinatorService::join(JoinContext context) { return wait_for_join(); }

kj::Promise<void> CoordinatorService::done(DoneContext context) {
  if (queue_.has_error()) rpc::throw_status(queue_.take_error());
  rpc::check(ps_status());
  context.getResults().setDone(queue_.idle());
  return kj::READY_NOW;
}

kj::Promise<std::string> CoordinatorService::wait_for_value(int64_t id) {
  auto state = queue_.state(id);
  rpc::check(state.status());
  if (*state == ClosureQueue::State::kDone || *state == ClosureQueue::State::kFailed ||
      *state == ClosureQueue::State::kCancelled) {
    auto value = queue_.value(id);
    rpc::check(value.status());
    return *value;
  }
  rpc::check(ps_status());
  return changed().then([this, id]() { return wait_for_value(id); });
}

kj::Promise<void> CoordinatorService::fetch(FetchContext context) {
  return wait_for_value(context.getParams().getClosureId())
      .then([this, context](std::string bytes) mutable {
        auto element = rpc::element_from_bytes(bytes);
        rpc::check(element.status());
        rpc::write_element(context.getResults().initValue(), *element, ctx_.codec);
      });
}

kj::Promise<void> CoordinatorService::release(ReleaseContext context) {
  for (int64_t id : context.getParams().getClosureIds()) queue_.release(id);
  return kj::READY_NOW;
}

}  // namespace capstan::coordinator
