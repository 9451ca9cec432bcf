#include "daemons/worker_server/service.h"

#include "capstan/closure.h"
#include "rpc/errors.h"
#include "rpc/pool.h"
#include "rpc/tensor_codec.h"
#include "sync/mutex.h"

namespace capstan::worker_server {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

kj::TimePoint far_future(kj::Timer& timer) { return timer.now() + 3650 * 24 * 3600 * kj::SECONDS; }

}  // namespace

// Serializes get_next of a per-worker iterator: closures running at once on
// one worker (closures_per_worker > 1) share it.
class LockedIterator final : public data::Iterator {
 public:
  explicit LockedIterator(std::unique_ptr<data::Iterator> inner) : inner_(std::move(inner)) {}
  Result<std::optional<Element>> get_next() override {
    MutexLock lock(mutex_);
    return inner_->get_next();
  }

 private:
  Mutex mutex_;
  std::unique_ptr<data::Iterator> inner_ GUARDED_BY(mutex_);
};

// The context one closure run sees.
class WorkerService::Context final : public ClosureContext {
 public:
  Context(WorkerService& service, int attempt) : service_(service), attempt_(attempt) {}

  int worker_index() const override { return std::max(0, service_.ctx_.identity.task_index()); }
  int num_workers() const override { return num_workers_; }
  int attempt() const override { return attempt_; }
  void set_num_workers(int n) { num_workers_ = n; }

  Result<Tensor> read(const std::string& variable) override { return service_.router_->read(variable); }
  Result<Tensor> gather(const std::string& variable, const Tensor& ids) override {
    return service_.router_->gather(variable, ids);
  }
  Status assign(const std::string& variable, const Tensor& value) override {
    return service_.router_->assign(variable, value);
  }
  Status assign_add(const std::string& variable, const Tensor& delta) override {
    return service_.router_->assign_add(variable, delta);
  }
  Status apply_gradients(const std::string& variable, const Tensor& gradient) override {
    return service_.router_->apply_dense(variable, gradient);
  }
  Status apply_sparse_gradients(const std::string& variable, const Tensor& ids,
                                const Tensor& rows) override {
    return service_.router_->apply_sparse(variable, ids, rows);
  }
  Result<data::Iterator*> iterator(const Tensor& arg) override {
    if (arg.dtype() != DType::kInt64 || arg.num_elements() != 1) {
      return Status::InvalidArgument("iterator(): the argument is not a per-worker dataset (use PerWorkerDataset::arg())");
    }
    int64_t id = arg.flat<int64_t>()[0];
    MutexLock lock(service_.mutex_);
    auto it = service_.iterators_.find(id);
    if (it == service_.iterators_.end()) {
      return Status::FailedPrecondition("per-worker dataset " + std::to_string(id) +
                                        " has no iterator on this worker");
    }
    return it->second.get();
  }

 private:
  WorkerService& service_;
  const int attempt_;
  int num_workers_ = 1;
};

WorkerService::WorkerService(daemon::DaemonContext& ctx) : NodeService(ctx), tasks_(*this) {
  std::string address;
  for (const auto& peer : ctx.peers) {
    if (peer.role == wire::Role::COORDINATOR) address = peer.address;
  }
  coordinator_ = kj::heap<rpc::Connection>(ctx.loop->io(), ctx.loop->timer(), address, ctx.peer_options);
  rpc::Connection* coordinator = coordinator_.get();
  kj::Timer* timer = &ctx.loop->timer();
  router_ = std::make_shared<VariableRouter>(
      *ctx.loop, ctx.peer_options, ctx.codec, std::chrono::seconds(60), [coordinator, timer]() {
        auto deadline = timer->now() + 10 * kj::SECONDS;
        return coordinator->service<wire::Coordinator>(deadline).then([](wire::Coordinator::Client c) {
          return c.placementsRequest().send().then([](capnp::Response<wire::Coordinator::PlacementsResults>&& r) {
            std::vector<VariableLocation> variables;
            for (auto v : r.getPlacements().getVariables()) variables.push_back(location_from_wire(v));
            return std::make_pair(r.getPlacements().getVersion(), std::move(variables));
          });
        });
      });
  tasks_.add(register_with_coordinator());
}

WorkerService::~WorkerService() = default;

void WorkerService::taskFailed(kj::Exception&& exception) {
  ctx_.log->error("worker task failed: {}", rpc::from_exception(exception).to_string());
}

kj::Promise<void> WorkerService::register_with_coordinator() {
  return coordinator_->service<wire::Coordinator>(far_future(ctx_.loop->timer()))
      .then([this](wire::Coordinator::Client coordinator) {
        auto request = coordinator.registerWorkerRequest();
        request.setWorker(thisCap());
        request.setTaskIndex(ctx_.identity.task_index());
        auto names = ctx_.functions->closure_names();
        for (const auto& entry : ctx_.functions->names()) {
          if (entry.rfind("dataset:", 0) == 0) names.push_back(entry);
        }
        auto list = request.initFunctions(static_cast<unsigned>(names.size()));
        for (unsigned i = 0; i < names.size(); ++i) list.set(i, names[i]);
        return request.send();
      })
      .then(
          [this](capnp::Response<wire::Coordinator::RegisterWorkerResults>&& response) {
            worker_id_ = response.getWorkerId();
            ctx_.log->info("registered with the coordinator as worker {}", worker_id_);
            return until_dropped();
          },
          [this](kj::Exception&& e) {
            ctx_.log->warn("registering with the coordinator failed: {}; retrying",
                           rpc::from_exception(e).to_string());
            return ctx_.loop->timer().afterDelay(1 * kj::SECONDS);
          })
      .then([this]() {
        // The coordinator went away (or refused): register again when it is
        // back, with fresh per-worker iterators.
        {
          MutexLock lock(mutex_);
          iterators_.clear();
        }
        return register_with_coordinator();
      });
}

kj::Promise<void> WorkerService::until_dropped() {
  auto check = ctx_.loop->timer().afterDelay(3 * kj::SECONDS).then([this]() {
    return coordinator_->service<wire::Coordinator>(ctx_.loop->timer().now() + 5 * kj::SECONDS)
        .then([this](wire::Coordinator::Client coordinator) {
          auto request = coordinator.workerAliveRequest();
          request.setWorkerId(worker_id_);
          return request.send();
        })
        .then([this](capnp::Response<wire::Coordinator::WorkerAliveResults>&& response) -> kj::Promise<void> {
          if (response.getAlive()) return until_dropped();
          ctx_.log->warn("the coordinator dropped this worker (it missed pings); registering again");
          return kj::READY_NOW;
        });
  });
  return coordinator_->on_disconnect().exclusiveJoin(kj::mv(check));
}

kj::Promise<void> WorkerService::createDataset(CreateDatasetContext context) {
  auto params = context.getParams();
  int64_t id = params.getDatasetId();
  std::string definition(reinterpret_cast<const char*>(params.getDefinition().begin()),
                         params.getDefinition().size());
  const FunctionRegistry* functions = ctx_.functions;
  return rpc::run_on_pool(ctx_.pool, [definition, functions]() -> Result<std::shared_ptr<data::Iterator>> {
           CAPSTAN_ASSIGN_OR_RETURN(data::Dataset dataset, data::Dataset::deserialize(definition));
           CAPSTAN_ASSIGN_OR_RETURN(auto iterator, dataset.make_iterator(functions));
           return std::shared_ptr<data::Iterator>(std::make_shared<LockedIterator>(std::move(iterator)));
         })
      .then([this, id](Result<std::shared_ptr<data::Iterator>> iterator) {
        rpc::check(iterator.status().with_context("per-worker dataset " + std::to_string(id)));
        MutexLock lock(mutex_);
        iterators_[id] = *iterator;
      });
}

kj::Promise<void> WorkerService::createDatasetFromFunction(CreateDatasetFromFunctionContext context) {
  auto params = context.getParams();
  int64_t id = params.getDatasetId();
  std::string name = text(params.getFunction());
  const DatasetFunction* fn = ctx_.functions->find_dataset_function(name);
  if (fn == nullptr) rpc::throw_status(Status::NotFound("this worker has no dataset function named '" + name + "'"));
  InputContext input{params.getNumWorkers(), params.getWorkerIndex()};
  const FunctionRegistry* functions = ctx_.functions;
  return rpc::run_on_pool(ctx_.pool, [fn, input, functions]() -> Result<std::shared_ptr<data::Iterator>> {
           CAPSTAN_ASSIGN_OR_RETURN(data::Dataset dataset, (*fn)(input));
           CAPSTAN_ASSIGN_OR_RETURN(auto iterator, dataset.make_iterator(functions));
           return std::shared_ptr<data::Iterator>(std::make_shared<LockedIterator>(std::move(iterator)));
         })
      .then([this, id, name](Result<std::shared_ptr<data::Iterator>> iterator) {
        rpc::check(iterator.status().with_context("dataset function '" + name + "'"));
        MutexLock lock(mutex_);
        iterators_[id] = *iterator;
      });
}

kj::Promise<void> WorkerService::runClosure(RunClosureContext context) {
  auto params = context.getParams();
  std::string function = text(params.getFunction());
  const ClosureFunction* fn = ctx_.functions->find_closure(function);
  if (fn == nullptr) {
    rpc::throw_status(Status::NotFound("this worker has no closure named '" + function + "'"));
  }
  int64_t version = params.getPlacementVersion();
  int64_t closure_id = params.getClosureId();
  // A coordinator older than these fields sends 0.
  int attempt = std::max<int>(1, static_cast<int>(params.getAttempt()));
  int num_workers = std::max<int>(1, static_cast<int>(params.getNumWorkers()));
  return rpc::read_element(params.getArgs())
      .then([this, fn, version, closure_id, attempt, num_workers](Element&& args) {
        auto router = router_;
        return rpc::run_on_pool(ctx_.pool, [this, fn, version, router, attempt, num_workers,
                                            args = std::move(args)]() -> Result<Element> {
          CAPSTAN_RETURN_IF_ERROR(router->refresh_if_older(version));
          Context context(*this, attempt);
          context.set_num_workers(num_workers);
          return (*fn)(context, args);
        });
      })
      .then([this, context, function](Result<Element> result) mutable {
        if (!result.ok()) rpc::throw_status(result.status().with_context(function));
        rpc::write_element(context.getResults().initResult(), *result, ctx_.codec);
      });
}

}  // namespace capstan::worker_server
